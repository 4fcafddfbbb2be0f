"""What `bertpipe diagnose` does after parsing its options (flows/commands/diagnosing.py
holds the command): the task and the model it names, checked before anything heavy; where
it may write; the diagnosis itself (bertcore/eval/diagnosis/, in this process); its files
published with a manifest; and the evaluate report's link to it.

The model: `pretrain` or `distill` (the stage's exported model/ folder, as its manifest
lists it; with the run's vocab folder, to compare tokenizers), or any Hugging Face
BERT-family folder, local or s3:// (config.json, safetensors weights and a tokenizer.json,
as `pretrain.init_from` takes). Default: the last of them the recipe runs.

Runs in this process, one fine-tune after another, with all the CPUs torch is given
(`--threads`): on a few thousand rows the fits are seconds each, so a Ray task per fit
would spend more on starting workers and loading the model in each than it saves, and a
command that prints each fit as it ends needs nothing more.

Where it writes: `<run.root>/diagnose/<task>/` by default (beside eval/, linked from its
report), or `--out`; a folder of its own (stage "diagnose" in its `_manifest.json`), never a
stage directory or another command's folder (pipelines/export/target.py decides).
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from bertcore.errors import ConfigError

log = logging.getLogger(__name__)

CODE_VERSION = "1"
MODEL_STAGES = ("pretrain", "distill")
TOKENIZER_NAMES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)


@dataclass
class Model:
    """The model to diagnose, as a local folder with its tokenizer."""

    folder: str
    name: str
    """How the diagnosis names it: `pretrain/model` (relative to run.root) or its URI."""
    identity: dict[str, Any]
    vocab_dir: str | None = None
    own: bool = False
    """The run's own model (a stage's): its report links the diagnosis."""


def task_of(cfg, name: str):
    """The recipe's evaluate task called `name`, or a ConfigError listing them."""
    for task in cfg.evaluate.tasks:
        if task.name == name:
            return task
    names = ", ".join(t.name for t in cfg.evaluate.tasks) or "none"
    raise ConfigError(f"--task {name}: the recipe has no evaluate task of that name (evaluate.tasks: {names})")


def default_model(cfg) -> str:
    from pipelines.export.onnx import default_stage

    return default_stage(cfg)


def resolve_model(cfg, storage, model: str) -> Model:
    """The model `--model` names: a stage's model/ folder, or a Hugging Face folder."""
    if model in MODEL_STAGES:
        return _stage_model(cfg, storage, model)
    return _folder_model(storage, model)


def _stage_model(cfg, storage, stage: str) -> Model:
    from bertcore.train.export import MODEL_DIR
    from pipelines.export.outputs import stage_output
    from pipelines.shards import local_folder
    from pipelines.stage import UpstreamMissing

    directory, manifest = stage_output(storage, cfg.run.root, stage, f"--model {stage}: diagnose reads the model in")
    listed = manifest.shards_under(f"{MODEL_DIR}/")
    files = [s.path.removeprefix(f"{MODEL_DIR}/") for s in listed]
    damaged = [s.path for s in listed if directory.check(s) != "ok"]
    if "config.json" not in files or damaged:
        why = f"{damaged[0]} is damaged or missing" if damaged else f"no {MODEL_DIR}/config.json"
        raise ConfigError(f"--model {stage}: {directory.uri}: {why}; re-run `bertpipe run --only {stage} --force`")
    folder = local_folder(storage, directory.path(MODEL_DIR), files, f"diagnose-{manifest.fingerprint}")
    vocab_dir = None
    try:
        vocab, vocab_manifest = stage_output(storage, cfg.run.root, "vocab", "diagnose reads the tokenizer in")
        names = [s.path for s in vocab_manifest.shards if "/" not in s.path]
        vocab_dir = local_folder(storage, vocab.uri, names, f"diagnose-{vocab_manifest.fingerprint}") if names else None
    except UpstreamMissing:
        pass  # no vocab stage (a run started from an outside model): the tokenizer check is left out
    identity = {"stage": stage, "fingerprint": manifest.fingerprint, "model": directory.path(MODEL_DIR)}
    return Model(folder, f"{directory.directory}/{MODEL_DIR}", identity, vocab_dir, own=True)


def _folder_model(storage, uri: str) -> Model:
    from bertcore.model.folder import check_model_folder
    from pipelines.external import model_folder

    found = model_folder(storage, uri, "--model")  # a ConfigError naming --model when it holds no model
    names = storage.listdir(found.uri)
    tokenizer = [name for name in TOKENIZER_NAMES if name in names]
    if "tokenizer.json" not in tokenizer:
        raise ConfigError(
            f"--model {uri}: no tokenizer.json beside the weights; fine-tuning needs the model's fast tokenizer "
            "(save it there with tokenizer.save_pretrained)"
        )
    from pipelines.shards import local_folder

    folder = local_folder(storage, found.uri, [*found.files, *tokenizer], found.cache_key)
    check_model_folder(folder, "--model")  # config against weights, bounded, before torch reads them
    return Model(folder, found.uri, {"model": found.uri, "files": found.identity})


def target(cfg, storage, task: str, out: str | None) -> tuple[str, bool]:
    """(where the diagnosis goes, whether that is the default beside the evaluate stage),
    refused in one line unless it is a new folder or an earlier diagnosis's."""
    from pipelines.export.target import check_target
    from pipelines.stages.evaluate.diagnoses import default_out

    default = default_out(cfg.run.root, task)
    checked = check_target(
        storage, cfg.run.root, out or default, default=default, owner=("diagnose",), command="diagnose"
    )
    from pipelines.export.target import resolve

    return checked, out is None or checked == resolve(default)


def local_task(cfg, storage, task):
    """The task with its files as local paths (remote ones cached per content), their
    signatures for the manifest; a missing file is a ConfigError naming its key."""
    from pipelines.shards import local_copy
    from pipelines.stages.evaluate import identify
    from pipelines.storage import is_local

    single = cfg.evaluate.model_copy(
        update={"tasks": [task], "embeddings": cfg.evaluate.embeddings.model_copy(update={"sts": None})}
    )
    resolved, signatures = identify(single, storage).value
    checked = resolved.tasks[0]
    update = {}
    for split in ("train", "validation", "test"):
        uri = getattr(checked, split)
        if uri is not None:
            update[split] = uri if is_local(uri) else local_copy(storage, uri, f"diagnose-{signatures[uri]}")
    return checked.model_copy(update=update), signatures


def run(cfg, storage, task_name: str, model: str | None, out: str | None, options) -> list[str]:
    """The diagnosis of `task_name` on `model`, written and linked; returns the lines to print."""
    from bertcore.config import resolved_yaml
    from bertcore.eval.diagnosis import files
    from bertcore.eval.diagnosis.run import diagnose
    from pipelines.stage import fingerprint
    from pipelines.stage_dir import MANIFEST, Manifest, StageDir
    from pipelines.stages.evaluate.diagnoses import link

    task = task_of(cfg, task_name)
    where, beside = target(cfg, storage, task.name, out)
    chosen = resolve_model(cfg, storage, model or default_model(cfg))
    local, signatures = local_task(cfg, storage, task)
    options = type(options)(**{**options.__dict__, "vocab_dir": chosen.vocab_dir})
    log.info(
        "diagnose: task %s (%s) on %s: %d folds, seeds %s, learning rates %s, %d threads",
        task.name,
        task.type,
        chosen.name,
        options.folds,
        ",".join(str(s) for s in options.seeds or task.seeds),
        ",".join(f"{lr:g}" for lr in sorted({*options.learning_rates, task.learning_rate})),
        options.num_threads,
    )
    started = time.perf_counter()
    diagnosis = diagnose(
        local,
        chosen.folder,
        options=options,
        progress=lambda line: log.info("diagnose: %s", line),
        model_name=chosen.name,
    )
    settings = {
        "task": task.model_dump(mode="json"),
        "model": chosen.name,
        "folds": options.folds,
        "seeds": list(options.seeds or task.seeds),
        "learning_rates": list(options.learning_rates),
        "seed": cfg.run.seed,
    }
    inputs = {"model": chosen.identity, "task_files": signatures}
    out_dir = StageDir(storage, posixpath.dirname(where.rstrip("/")), posixpath.basename(where.rstrip("/")))
    earlier = out_dir.manifest()  # an earlier diagnosis's (check_target let nothing else through)
    with tempfile.TemporaryDirectory(prefix="bertpipe-diagnose-") as tmp:
        names = files.write(diagnosis, tmp)
        if earlier is not None:
            storage.remove(out_dir.path(MANIFEST))
        shards = [out_dir.publish_copy(name, os.path.join(tmp, name), rows=0) for name in names]
    for old in earlier.shards if earlier is not None else []:
        if old.path not in names:
            out_dir.remove(old.path)
    counts = {s: sum(f.severity == s for f in diagnosis.findings) for s in ("problem", "warning", "note", "ok", "n/a")}
    manifest = Manifest(
        stage="diagnose",
        code_version=CODE_VERSION,
        fingerprint=fingerprint("diagnose", CODE_VERSION, settings, inputs),
        inputs=inputs,
        config=settings,
        shards=shards,
        stats={"findings": counts, "fits": diagnosis.fits},
        timings={
            **{k: round(v, 3) for k, v in diagnosis.timings.items()},
            "command_s": round(time.perf_counter() - started, 3),
        },
        report="diagnosis.md",
        headline={"problems": counts["problem"], "warnings": counts["warning"]},
    )
    out_dir.write_manifest(manifest, resolved_yaml(cfg))
    lines = [f.line() for f in diagnosis.findings]
    lines.append(
        f"diagnosis: {out_dir.path('diagnosis.md')} ({diagnosis.fits} fine-tunes in "
        f"{_duration(diagnosis.timings.get('total_s'))})"
    )
    if beside and chosen.own and link(storage, cfg.run.root):
        lines.append("linked from the evaluate report (eval/report.md)")
    return lines


def _duration(seconds: float | None) -> str:
    from bertcore import figures

    return figures.duration(seconds)
