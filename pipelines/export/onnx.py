"""`bertpipe export --format onnx`: a stage's exported model folder as ONNX files (fp32,
and int8 with `--quantize int8`), checked with ONNX Runtime against PyTorch on held-out
corpus sentences (bertcore/inference), in a folder with its own manifest:

    <out>/model.onnx, model.int8.onnx, config.json, vocab.txt, tokenizer files
    <out>/_config.yaml     the resolved recipe
    <out>/_manifest.json   written last, as a stage's: what was exported (the stage, its
                           fingerprint, the model folder and its weights' sha256; the task
                           model's file and sha256), the settings, every file with its
                           bytes and sha256, the checks' figures, timings and versions

Default <out>: `<run.root>/onnx/<stage>/`, or `<run.root>/onnx/<stage>-<task>/` with a task
head. The model comes from `<stage dir>/model/` (the pretrain stage's, or the distill
stage's student); a task head from the evaluate stage's `heads/<model>/<task>.safetensors`,
fine-tuned from exactly those weights (their sha256 is compared). The check sentences are
a keyed sample of the corpus stage's validation split, tokenized with the model folder's
own tokenizer.

Not a stage: nothing runs it in the flow, and no stage reads its output. It runs in the
calling process (no Ray), under the run root's lease when the command holds one.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bertcore.errors import ConfigError, InputDataError
from pipelines.export.outputs import listed, stage_output
from pipelines.stage import fingerprint
from pipelines.stage_dir import MANIFEST, Manifest, StageDir
from pipelines.storage import Storage, join

log = logging.getLogger(__name__)

EXPORTABLE = ("pretrain", "distill")
"""Stages whose output holds a model/ folder (the distill stage's: the student), in flow
order; the last one the recipe runs is exported by default."""
CODE_VERSION = "2"  # 2: the fused TorchScript graph
ONNX_DIR = "onnx"
SENTENCE_POOL = 50
"""Check sentences are sampled from at most this many times as many validation sentences."""


def default_stage(cfg: Any) -> str:
    """The last exportable stage the recipe runs (not among the stages it leaves out,
    `cfg.off`): distill when the recipe distils, else pretrain."""
    off = getattr(cfg, "off", None) or {}
    runs = [name for name in EXPORTABLE if name not in off]
    return runs[-1] if runs else EXPORTABLE[-1]


def check_stage(name: str) -> str:
    if name not in EXPORTABLE:
        raise ConfigError(
            f"--stage {name}: ONNX export reads a model folder, which only {', '.join(EXPORTABLE)} "
            f"write{'s' if len(EXPORTABLE) == 1 else ''}"
        )
    return name


def default_out(root: str, stage: str, task: str | None) -> str:
    return join(root, ONNX_DIR, f"{stage}-{task}" if task else stage)


def _local_checked(
    storage: Storage, directory: StageDir, manifest: Manifest, relative: str, cache_key: str
) -> tuple[str, str]:
    """(local path, sha256) of a file the manifest lists, after checking its bytes."""
    from pipelines.shards import local_copy
    from pipelines.storage import sha256_file

    record = listed(directory, manifest, relative)
    local = local_copy(storage, directory.path(relative), cache_key)
    digest = sha256_file(local)
    if digest != record.sha256:
        raise InputDataError(
            f"{directory.path(relative)} does not match its manifest (damaged): `bertpipe run --only "
            f"{manifest.stage}` recomputes it"
        )
    return local, digest


def model_folder(storage: Storage, root: str, stage: str) -> tuple[str, dict[str, Any]]:
    """(local copy of <stage>/model/, its identity for the manifest)."""
    from bertcore.train.export import HF_FILES, MODEL_DIR, WEIGHTS_FILE

    directory, manifest = stage_output(storage, root, stage, "ONNX export reads the model in")
    cache_key = f"export-{manifest.fingerprint}"
    paths = {name: _local_checked(storage, directory, manifest, f"{MODEL_DIR}/{name}", cache_key) for name in HF_FILES}
    from bertcore.model.folder import check_model_folder

    check_model_folder(
        os.path.dirname(paths[WEIGHTS_FILE][0]), f"the {stage} stage's {MODEL_DIR}/"
    )  # config against weights, bounded, before torch
    identity = {
        "stage": stage,
        "fingerprint": manifest.fingerprint,
        "model": directory.path(MODEL_DIR),
        "weights_sha256": paths[WEIGHTS_FILE][1],
    }
    return os.path.dirname(paths[WEIGHTS_FILE][0]), identity


def head_file(storage: Storage, root: str, task: str, weights_sha256: str) -> tuple[str, dict[str, Any]]:
    """(local copy of the evaluate stage's fine-tuned `task` model started from the weights
    with `weights_sha256`, its identity for the manifest)."""
    from bertcore.eval.heads import HEADS_DIR, read_head

    directory, manifest = stage_output(storage, root, "evaluate", f"--task {task} reads a fine-tuned model from")
    kept = [s.path for s in manifest.shards if s.path.startswith(f"{HEADS_DIR}/")]
    candidates = [p for p in kept if posixpath.basename(p) == f"{task}.safetensors"]
    if not candidates:
        names = sorted({posixpath.splitext(posixpath.basename(p))[0] for p in kept})
        raise ConfigError(
            f"--task {task}: the evaluate stage under {directory.uri} kept no fine-tuned model of that name "
            f"(it has: {', '.join(names) or 'none'}; models are kept for tasks that train: classification, "
            "regression, token classification, QA)"
        )
    for relative in candidates:
        local, digest = _local_checked(storage, directory, manifest, relative, f"export-{manifest.fingerprint}")
        if read_head(local).encoder_sha256 == weights_sha256:
            return local, {
                "task": task,
                "file": directory.path(relative),
                "sha256": digest,
                "evaluate_fingerprint": manifest.fingerprint,
            }
    raise ConfigError(
        f"--task {task}: the fine-tuned models in {directory.uri} started from other weights than the model being "
        "exported; re-run the evaluate stage (`bertpipe run --only evaluate`) on this model"
    )


def held_out_sentences(storage: Storage, root: str, count: int, seed: int) -> list[str]:
    """Up to `count` sentences of the corpus stage's validation split, sampled with a keyed
    RNG from its first SENTENCE_POOL x `count` (in shard order)."""
    from bertcore.rng import keyed_numpy
    from pipelines.shards import read_batches

    directory, manifest = stage_output(storage, root, "corpus", "the ONNX checks read held-out sentences from")
    pool: list[str] = []
    for shard in manifest.shards_under("validation/"):
        for batch in read_batches(storage, directory.path(shard.path)):
            pool.extend(s for doc in batch.column("sentences").to_pylist() for s in doc if s.strip())
            if len(pool) >= SENTENCE_POOL * count:
                break
        if len(pool) >= SENTENCE_POOL * count:
            break
    pool = pool[: SENTENCE_POOL * count]
    chosen = (
        sorted(
            keyed_numpy(seed, "export", "check-sentences").choice(len(pool), size=min(count, len(pool)), replace=False)
        )
        if pool
        else []
    )
    return [pool[i] for i in chosen]


def _versions() -> dict[str, str]:
    found = {}
    for package in ("bertpipe", "torch", "transformers", "onnx", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def export_onnx(
    cfg: Any,
    storage: Storage,
    *,
    stage: str | None = None,
    task: str | None = None,
    int8: bool = False,
    out: str | None = None,
    sentences: int = 256,
    tolerance: float = 1e-3,
    resolved_config: str = "",
) -> tuple[str, Manifest]:
    """Export, check and publish (see the module docstring); returns (out URI, manifest).
    `out` must already have passed pipelines/export_target.check_target: a new folder, or an
    earlier export's, of which only the files its manifest lists are replaced or removed."""
    from bertcore.inference import onnx
    from bertcore.inference.export import export_folder
    from bertcore.rng import keyed_seed

    onnx.require()  # before anything is read
    root, seed = cfg.run.root, cfg.run.seed
    stage = check_stage(stage or default_stage(cfg))
    out = out or default_out(root, stage, task)
    model_dir, source = model_folder(storage, root, stage)
    head_path, head = head_file(storage, root, task, source["weights_sha256"]) if task else (None, None)
    texts = held_out_sentences(storage, root, sentences, seed)
    settings = {
        "format": "onnx",
        "stage": stage,
        "task": task,
        "quantize": "int8" if int8 else None,
        "exporter": (
            "torch.onnx.export (TorchScript, dynamo=False, eager attention) + onnxruntime.transformers optimizer "
            "(bert fusions)"
        ),
        "dynamic_axes": {"batch": 0, "sequence": 1},
        "int8": "onnxruntime quantize_dynamic: MatMul weights int8 per output channel, activations uint8 per batch"
        if int8
        else None,
        "tolerance": tolerance,
        "check_sentences": sentences,
        "seed": seed,
    }
    started = time.perf_counter()
    log.info(
        "export: %s model %s to ONNX (fp32%s)%s, checked on %d held-out sentences",
        stage,
        source["model"],
        " and int8" if int8 else "",
        f" with the {task} head" if task else "",
        len(texts),
    )
    target = StageDir(storage, posixpath.dirname(out.rstrip("/")), posixpath.basename(out.rstrip("/")))
    earlier = target.manifest()  # an earlier export's (check_target let nothing else through)
    with tempfile.TemporaryDirectory(prefix="bertpipe-onnx-") as tmp:
        report = export_folder(
            model_dir,
            tmp,
            texts,
            head_file=head_path,
            int8=int8,
            tolerance=tolerance,
            seed=keyed_seed(seed, "export", "mlm-positions"),
        )
        if earlier is not None:
            storage.remove(target.path(MANIFEST))  # the folder is incomplete from here until the manifest is back
        shards = [target.publish_copy(name, os.path.join(tmp, name), rows=0) for name in sorted(os.listdir(tmp))]
    for old in earlier.shards if earlier is not None else []:
        if old.path not in {s.path for s in shards}:
            target.remove(old.path)  # e.g. the int8 file of an earlier export; files it did not list stay
    inputs = {"source": source, "head": head}
    manifest = Manifest(
        stage="export-onnx",
        code_version=CODE_VERSION,
        fingerprint=fingerprint("export-onnx", CODE_VERSION, settings, inputs),
        inputs=inputs,
        config=settings,
        shards=shards,
        stats={**{k: report[k] for k in ("outputs", "fusions", "head", "sample", "checks")}, "versions": _versions()},
        timings={**report["timings"], "total_s": round(time.perf_counter() - started, 3)},
        headline=headline(report["checks"]),
    )
    target.write_manifest(manifest, resolved_config)
    return target.uri, manifest


def headline(checks: dict) -> dict[str, Any]:
    fp32 = checks["fp32"]
    figures: dict[str, Any] = {"fp32 max |diff|": max(fp32["max_abs_diff"].values())}
    if "int8" in checks:
        figures["int8 agreement"] = checks["int8"]["agreement"]
        figures["int8 cosine (min)"] = checks["int8"]["embedding_cosine"]["min"]
    return figures


def summary_lines(manifest: Manifest) -> list[str]:
    """What the command prints after the files: one line per check."""
    checks = manifest.stats["checks"]
    sample = manifest.stats["sample"]
    fp32 = checks["fp32"]
    worst = max(fp32["max_abs_diff"], key=fp32["max_abs_diff"].get)
    fused = ", ".join(f"{count} {op}" for op, count in sorted(manifest.stats.get("fusions", {}).items())) or "nothing"
    lines = [
        f"fused: {fused}",
        (
            f"fp32: max |difference| from PyTorch {fp32['max_abs_diff'][worst]:.1e} ({worst}; tolerance "
            f"{fp32['tolerance']:g}) on {sample['sentences']} held-out sentences"
        ),
    ]
    if "int8" in checks:
        int8 = checks["int8"]
        cosine = int8["embedding_cosine"]
        if int8["agreement"] is None:
            agreed = f"no argmax to compare ({int8['argmax']})"
        else:
            verdict = "met" if int8["meets_goal"] else "NOT met"
            agreed = (
                f"{100 * int8['agreement']:.1f}% of {int8['compared']} predictions equal fp32's "
                f"({int8['argmax']}; goal {100 * int8['goal']:.0f}%: {verdict})"
            )
        lines.append(f"int8: {agreed}; embedding cosine to fp32 min {cosine['min']:.4f}, mean {cosine['mean']:.4f}")
    return lines
