"""What `bertpipe serve` serves, found in the run root on the driver before Ray starts, and
fetched again by each replica (on its own node) with every file's sha256 checked.

    --format onnx   the export folders `bertpipe export --format onnx` wrote:
                    <run.root>/onnx/<stage>/ (model.onnx, or model.int8.onnx with --quantize
                    int8), and with --task also <run.root>/onnx/<stage>-<task>/; each
                    refused when its manifest says it was made from other weights than the
                    stage (or the evaluate stage's task model) holds now
    --format torch  the stage's model/ folder, with --task also the evaluate stage's
                    fine-tuned model heads/<model>/<task>.safetensors (the PyTorch models an
                    ONNX export would trace)

`--stage` names the stage whose model is served: pretrain, distill (the student), or
evaluate with --task (the task model fine-tuned from the recipe's last model stage: distill
when it distils, else pretrain). /embed and /fill-mask use the model itself, /classify the
model fine-tuned on the task. /fill-mask reads the stage's model folder for its masked-LM
head. How texts are read follows the run: /embed as the evaluate stage read embeddings
(`evaluate.embeddings`: max_seq_length, long_inputs and its windows), /classify as the head
was fine-tuned (its max_seq_length and long_inputs), /fill-mask cut at the model's
max_position_embeddings. The default pooling is the one the evaluation scored better for
the model (eval/metrics.json); a request may ask for the other.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from bertcore.errors import ConfigError, InputDataError
from bertcore.eval import kinds
from bertcore.eval.windows import Windowing
from bertcore.inference.engine import EngineSpec, Reading
from bertcore.inference.export import COPIED, FP32_FILE, INT8_FILE
from pipelines.export import onnx as onnx_export
from pipelines.export.outputs import listed, stage_output
from pipelines.export.target import EXPORT_STAGES
from pipelines.registry import REGISTRY
from pipelines.stage_dir import Manifest, StageDir
from pipelines.storage import Storage, join

SERVED_STAGES = ("pretrain", "distill", "evaluate")
MODEL_NAMES = {"pretrain": "pretrained", "distill": "student"}
"""The name the evaluate stage gives each model stage's model (eval/metrics.json, heads/)."""


@dataclass(frozen=True)
class File:
    """A file a replica fetches: its URI, the sha256 its manifest records, a cache key."""

    uri: str
    sha256: str
    cache_key: str


@dataclass(frozen=True)
class Source:
    """What to serve (see the module docstring): picklable, handed to every replica."""

    files: tuple[File, ...]
    """One folder's files: config.json, the tokenizer files, and the model file."""
    model_file: str
    """The model file's name among `files` (model.onnx, model.int8.onnx, model.safetensors)."""
    embed: Reading
    classify: Reading | None
    fill_mask_tokens: int
    task_file: File | None = None
    """With --task: the ONNX export with the head's logits, or the saved task model (torch)."""
    head_info: dict | None = None
    mlm: tuple[File, ...] = ()
    """config.json and weights of the model folder whose masked-LM head /fill-mask uses."""
    pooling: str = "mean"
    identity: dict[str, Any] = field(default_factory=dict)
    """What /info and the start line say: the model, its run, the manifest fingerprint."""

    def engine_spec(self, storage: Storage, budget: int, threads: int, unreadable: str = "flag") -> EngineSpec:
        """Local copies of the files (each checked against its sha256) as an EngineSpec;
        `budget`, `threads` and `unreadable` as the serve: section says."""
        folder = _fetch(storage, self.files)
        onnx = self.model_file.endswith(".onnx")
        task = _fetch(storage, (self.task_file,), folder=False) if self.task_file else None
        mlm_folder = folder if set(self.mlm) <= set(self.files) else _fetch(storage, self.mlm)
        return EngineSpec(
            folder=folder,
            embed=self.embed,
            classify=self.classify,
            fill_mask_tokens=self.fill_mask_tokens,
            onnx_file=posixpath.join(folder, self.model_file) if onnx else None,
            torch_dir=None if onnx else folder,
            head=self.head_info,
            task_onnx_file=task if onnx else None,
            head_file=None if onnx else task,
            mlm_dir=_with_mlm_head(mlm_folder),
            budget=budget,
            threads=threads,
            unreadable=unreadable,
        )


def resolve(
    cfg: Any, storage: Storage, *, stage: str | None, task: str | None, fmt: str, quantize: str | None
) -> Source:
    """The Source the options name (see the module docstring), or one ConfigError line."""
    if quantize not in (None, "int8"):
        raise ConfigError(f"--quantize {quantize}: the one quantization is int8")
    if quantize and fmt != "onnx":
        raise ConfigError("--quantize int8 needs --format onnx (the int8 graph is the ONNX export's)")
    if stage is not None and stage not in SERVED_STAGES:
        raise ConfigError(f"--stage {stage}: bertpipe serve serves the model of {', '.join(SERVED_STAGES)}")
    if stage == "evaluate" and task is None:
        raise ConfigError("--stage evaluate serves a fine-tuned task model: name it with --task NAME")
    model_stage = onnx_export.default_stage(cfg) if stage in (None, "evaluate") else stage
    root = cfg.run.root
    directory, manifest = stage_output(storage, root, model_stage, "bertpipe serve reads the model in")
    weights = listed(directory, manifest, "model/model.safetensors")
    identity: dict[str, Any] = {
        "run": root,
        "stage": model_stage,
        "format": fmt,
        "quantize": quantize,
        "model_name": MODEL_NAMES[model_stage],
    }
    head = task_file = None
    if task:
        from bertcore.eval.heads import read_head

        local, found = onnx_export.head_file(storage, root, task, weights.sha256)
        head = vars(read_head(local))
        task_file = File(found["file"], found["sha256"], f"serve-{found['evaluate_fingerprint']}")
        identity["task"] = {
            "name": task,
            "type": head["type"],
            "labels": head["labels"],
            "fingerprint": found["evaluate_fingerprint"],
            "fingerprint_of": "the evaluate stage's output",
            "model": found["file"],
        }
    mlm = tuple(_file(directory, manifest, f"model/{name}") for name in ("config.json", "model.safetensors"))
    if fmt == "onnx":
        files, model_file = _onnx_export(storage, root, model_stage, None, quantize, weights.sha256, identity)
        if task:
            task_files, _ = _onnx_export(
                storage, root, model_stage, (task, task_file.sha256), quantize, weights.sha256, identity["task"]
            )
            task_file = task_files[0]
    else:
        names = ("config.json", "model.safetensors", *[n for n in COPIED if n != "config.json"])
        files = tuple(
            _file(directory, manifest, f"model/{name}") for name in names if _listed(manifest, f"model/{name}")
        )
        model_file = "model.safetensors"
        identity.update(
            fingerprint=manifest.fingerprint,
            fingerprint_of=f"the {model_stage} stage's output",
            model=directory.path("model"),
        )
    config = storage.read_json(join(directory.path("model"), "config.json"))
    positions = int(config.get("max_position_embeddings", 512))
    embed_cfg = cfg.evaluate.embeddings
    embed = Reading(min(embed_cfg.max_seq_length, positions), Windowing.of(embed_cfg))
    classify, note = _classify_reading(head, positions)
    pooling, why = _pooling(storage, root, directory.path("model"), model_stage)
    identity.update(
        max_tokens={
            "embed": embed.max_tokens,
            "classify": classify.max_tokens if classify else None,
            "fill_mask": positions,
        },
        long_inputs={
            "embed": embed.long_inputs,
            "classify": (classify.long_inputs + note) if classify else None,
            "fill_mask": "truncate",
        },
        pooling={"default": pooling, "why": why},
    )
    return Source(
        files,
        model_file,
        embed,
        classify,
        positions,
        task_file=task_file,
        head_info=head,
        mlm=mlm,
        pooling=pooling,
        identity=identity,
    )


def _onnx_export(
    storage: Storage,
    root: str,
    stage: str,
    task: tuple[str, str] | None,
    quantize: str | None,
    weights_sha256: str,
    identity: dict,
) -> tuple[tuple[File, ...], str]:
    """The files of the export folder of `stage`'s model (with `task` = (name, sha256 of the
    task model), of its fine-tuned model) and the model file's name, after checking it was
    made from what the run holds now; records its fingerprint in `identity`."""
    out = onnx_export.default_out(root, stage, task[0] if task else None)
    export_dir = StageDir(storage, posixpath.dirname(out), posixpath.basename(out))
    export = export_dir.manifest()
    command = (
        f"bertpipe export --format onnx{' --quantize int8' if quantize else ''} --stage "
        f"{stage}{f' --task {task[0]}' if task else ''}"
    )
    model_file = INT8_FILE if quantize else FP32_FILE
    if export is None or export.stage not in EXPORT_STAGES:
        raise ConfigError(f"no ONNX export under {out}: run `{command}` first (or serve --format torch)")
    if not _listed(export, model_file):
        raise ConfigError(f"the ONNX export under {out} has no {model_file}: run `{command}`")
    if (export.inputs.get("source") or {}).get("weights_sha256") != weights_sha256:
        raise ConfigError(
            f"the ONNX export under {out} was made from other weights than the {stage} stage holds now: run "
            f"`{command}` again"
        )
    if task and (export.inputs.get("head") or {}).get("sha256") != task[1]:
        raise ConfigError(
            f"the ONNX export under {out} holds another fine-tuned {task[0]} model than the evaluate stage "
            f"keeps now: run `{command}` again"
        )
    identity.update(
        fingerprint=export.fingerprint, fingerprint_of=f"the ONNX export under {out}", model=export_dir.path(model_file)
    )
    names = [model_file, *[n for n in COPIED if _listed(export, n)]]
    return tuple(_file(export_dir, export, name) for name in names), model_file


def _classify_reading(head: dict | None, positions: int) -> tuple[Reading | None, str]:
    """How /classify reads texts: as the head was fine-tuned. A head that pooled windows by
    element-wise max cannot be reproduced from each window's logits: those texts are cut."""
    if head is None or kinds.get(head["type"]).head_shape not in ("labels", "score"):
        return None, ""
    length = min(head["max_seq_length"], positions)
    windows = head.get("long_inputs")
    if not windows:
        return Reading(length), ""
    if windows.get("window_pool") == "max":
        return Reading(
            length
        ), " (the head was fine-tuned on windows pooled by max, which the served logits cannot reproduce)"
    return Reading(
        length,
        Windowing(
            length, windows.get("window_stride"), windows.get("window_pool", "mean"), windows.get("max_windows", 16)
        ),
    ), ""


def _pooling(storage: Storage, root: str, model_uri: str, model_stage: str) -> tuple[str, str]:
    """The pooling the evaluation scored better for this model (bertcore/inference/pooling.py)."""
    from bertcore.inference.pooling import best_pooling

    evaluate = StageDir(storage, root, REGISTRY["evaluate"].directory)
    if evaluate.manifest() is None or not storage.exists(evaluate.path("metrics.json")):
        return best_pooling(None)[0], "no evaluation of this run yet"
    metrics = storage.read_json(evaluate.path("metrics.json"))
    names = [name for name, entry in (metrics.get("models") or {}).items() if entry.get("uri") == model_uri]
    name = names[0] if names else MODEL_NAMES[model_stage]
    return best_pooling((metrics.get("embeddings") or {}).get(name))


def _listed(manifest: Manifest, relative: str) -> bool:
    return any(s.path == relative for s in manifest.shards)


def _file(directory: StageDir, manifest: Manifest, relative: str) -> File:
    return File(directory.path(relative), listed(directory, manifest, relative).sha256, f"serve-{manifest.fingerprint}")


def _fetch(storage: Storage, files, *, folder: bool = True) -> str:
    """Local copies of `files` (one folder's), each checked against its sha256: the folder
    (or with folder=False, the one file's path)."""
    from pipelines.shards import local_copy
    from pipelines.storage import sha256_file

    paths = []
    for f in files:
        local = local_copy(storage, f.uri, f.cache_key)
        if sha256_file(local) != f.sha256:
            raise InputDataError(
                f"{f.uri} does not match the sha256 its manifest records (damaged or replaced); re-run the "
                "stage or export that wrote it"
            )
        paths.append(local)
    return posixpath.dirname(paths[0]) if folder else paths[0]


def _with_mlm_head(folder: str) -> str | None:
    """`folder` when its weights hold a masked-LM head, else None."""
    from bertcore.model.folder import check_model_folder

    return folder if check_model_folder(folder, "the served model folder").has_mlm_head else None
