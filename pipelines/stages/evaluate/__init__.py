"""The evaluate stage's declaration; its work is pipelines/stages/evaluate/work.py."""

from __future__ import annotations

import os
from typing import Any

from bertcore.errors import ConfigError
from bertcore.eval.config import EvaluateConfig
from bertcore.eval.settings import TASK_FILES
from pipelines.stage import External, Stage
from pipelines.storage import Storage, is_local


def _absolute(uri: str) -> str:
    return os.path.abspath(os.path.expanduser(uri)) if is_local(uri) and "://" not in uri else uri


def identify(eval_cfg: EvaluateConfig, storage: Storage) -> External:
    """The task and STS files. Their identity is {config key: content signature}, not
    where they lie (the section's fingerprint leaves the paths out, see
    `task_location_free`), so a reinstall that moves the bundled files changes nothing;
    the value is (the section with absolute local paths, {file URI: signature}). A file
    that does not exist is a ConfigError naming its key."""
    signatures: dict[str, str] = {}
    identity: dict[str, str] = {}

    def check(uri: str, key: str) -> str:
        uri = _absolute(uri)
        try:
            fs, path = storage.fs(uri)
            found = fs.isfile(path)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot reach {uri} ({exc})") from None
        if not found:
            raise ConfigError(f"{key}: {uri} does not exist (or is a folder); fix the path in the evaluate section")
        signatures[uri] = identity[key.removeprefix("evaluate.")] = storage.signature(uri)
        return uri

    tasks = []
    for i, task in enumerate(eval_cfg.tasks):
        update = {
            s: check(getattr(task, s), f"evaluate.tasks[{i}].{s}") for s in TASK_FILES if getattr(task, s) is not None
        }
        tasks.append(task.model_copy(update=update))
    resolved = eval_cfg.model_copy(update={"tasks": tasks})
    sts = eval_cfg.embeddings.sts
    if eval_cfg.embeddings.enabled and sts is not None:
        sts = sts.model_copy(update={"file": check(sts.file, "evaluate.embeddings.sts.file")})
        resolved = resolved.model_copy(update={"embeddings": eval_cfg.embeddings.model_copy(update={"sts": sts})})
    return External(identity=identity, value=(resolved, signatures), summary=f"{len(signatures)} task file(s)")


def task_location_free(config: dict) -> dict:
    """The evaluate section's JSON without where its task and STS files are: `identify`
    puts their content signatures in the fingerprint instead."""
    out = dict(config)
    out["tasks"] = [{k: v for k, v in task.items() if k not in TASK_FILES} for task in config.get("tasks", [])]
    embeddings = dict(config.get("embeddings") or {})
    if isinstance(embeddings.get("sts"), dict):
        embeddings["sts"] = {k: v for k, v in embeddings["sts"].items() if k != "file"}
    out["embeddings"] = embeddings
    return out


def check(cfg: EvaluateConfig, reads: dict[str, Any]) -> None:
    """What can be checked before anything runs: intrinsic phases are examples phases, and
    no task or embedding input is longer than the pretrained model's positions."""
    phases = [p.name for p in reads["examples"].phases]
    unknown = [p for p in cfg.intrinsic.phases or [] if p not in phases]
    if unknown:
        raise ValueError(f"evaluate.intrinsic.phases: {unknown} are not examples phases (have {phases})")
    pretrain = reads.get("pretrain")  # absent when an external teacher is distilled
    positions = pretrain.max_position_embeddings if pretrain is not None else None
    if positions is not None:  # None with pretrain.init_from, or after distillation: checked when the stage runs
        check_lengths(cfg, positions, f"pretrain.model_size {pretrain.model_size}", ValueError)


def check_lengths(cfg: EvaluateConfig, positions: int, model: str, error: type[Exception]) -> None:
    """No task or embedding input may be longer than the model's positions."""
    lengths = [(f"evaluate.tasks[{i}].max_seq_length", t.max_seq_length) for i, t in enumerate(cfg.tasks)]
    if cfg.embeddings.enabled:
        lengths.append(("evaluate.embeddings.max_seq_length", cfg.embeddings.max_seq_length))
    for key, length in lengths:
        if length > positions:
            raise error(f"{key} ({length}) exceeds the pretrained model's {positions} positions ({model})")


STAGE = Stage(
    "evaluate",
    EvaluateConfig,
    "pipelines.stages.evaluate.work:run",
    reads=("pretrain", "distill", "examples", "corpus"),
    directory="eval",
    identify=identify,
    check=check,
    fingerprint_config=task_location_free,
    # 2: keeps each task's fine-tuned model (heads/) for `bertpipe export --task`; 3: long inputs in windows,
    # learning curves over train_fractions, the distilled student's start
    code_version="3",
    writes="metrics.json, report.md, plots/*.png, tensorboard/, heads/<model>/<task>.safetensors",
)
