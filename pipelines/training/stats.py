"""The statistics a training stage (pretrain, distill) puts in its manifest, and the headline
figures its end line and the run summary show, from its final checkpoint marker and its
metrics and validation logs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertcore.figures import percent
from bertcore.train import metrics_log
from bertcore.train.config import TrainingConfig

CURVE_POINTS = 50
"""Validation records kept in the manifest statistics at most (validation.jsonl has all)."""


def _thin(records: list[dict], points: int) -> list[dict]:
    """At most `points` records, evenly spaced, the first and the last included."""
    if len(records) <= points:
        return records
    picks = sorted({round(i * (len(records) - 1) / (points - 1)) for i in range(points)})
    return [records[i] for i in picks]


def training_stats(
    cfg: TrainingConfig, marker: dict, records: list[dict], validations: list[dict], restarts: Sequence[dict] = ()
) -> dict[str, Any]:
    """The manifest statistics. `final` holds the final training figures: the means over the
    last logging interval (bertcore.train.metrics_log), with the steps they cover; `validation`
    the last validation, on the held-out sample; `restarts` those of the workers in this
    invocation after a lost worker or node (pipelines/training/launch.py `fit`)."""
    from bertcore.train.checkpoint import checkpoint_tag

    mfus = [r["mfu"] for r in records if r.get("mfu") is not None]
    waits = [r for r in records if r.get("data_wait_s") is not None and r.get("step_time_s")]
    final = metrics_log.final(records, cfg.log_every)
    return {
        "steps": marker["step"],
        "total_steps": marker["total_steps"],
        "stopped_by": marker.get("stopped_by"),
        "phase": marker.get("phase"),
        "tokens_seen": marker["tokens_seen"],
        "train_time_s": marker["train_time_s"],
        "tokens_per_s": marker["tokens_seen"] / marker["train_time_s"] if marker["train_time_s"] else None,
        "mfu": sum(mfus) / len(mfus) if mfus else None,
        "padding_share": metrics_log.padding_share(records),
        # the share of step time rank 0 spent waiting for batches, over the steps logged
        "data_wait_share": (
            sum(r["data_wait_s"] for r in waits) / sum(r["step_time_s"] for r in waits) if waits else None
        ),
        "log_every": cfg.log_every,
        "final": {k: final.get(k) for k in ("first_step", "step", *metrics_log.VALIDATION_FIGURES)} if final else None,
        "loss_jumps": [{"step": r["step"], "loss": r["loss"], **r["loss_jump"]} for r in records if r.get("loss_jump")],
        "skipped_batches": sum(r.get("skipped_batches", 0) for r in records),
        "validation": marker.get("validation"),
        "validation_curve": _thin(validations, CURVE_POINTS),
        "checkpoint": checkpoint_tag(marker["step"]),
        "world_size": marker["world_size"],
        "resizes": marker.get("resizes") or [],
        "restarts": list(restarts),
        "zero_stage": marker["zero_stage"],
        "precision": marker["precision"],
        "model_config": marker["model_config"],
    }


def headline(stats: dict) -> dict[str, Any]:
    """final loss 7.464 (mean of steps 551-600) · validation MLM accuracy 8.8% (639 sequences) · tokens/s 12.3k · steps
    600"""
    out: dict[str, Any] = {}
    final = stats.get("final") or {}
    if final.get("loss") is not None:
        out["final loss"] = f"{final['loss']:.3f} ({metrics_log.steps_text(final)})"
    validation = stats.get("validation") or {}
    if validation.get("mlm_accuracy") is not None:  # the sample validated during training (evaluate scores all of it)
        out["validation MLM accuracy"] = (
            f"{percent(validation['mlm_accuracy'])} ({validation.get('sequences', 0):,} sequences)"
        )
    if stats["tokens_per_s"]:
        out["tokens/s"] = round(stats["tokens_per_s"])
    if stats.get("padding_share") is not None:
        out["padding"] = percent(stats["padding_share"])
    if stats.get("data_wait_share") is not None:
        out["data wait"] = percent(stats["data_wait_share"])
    stopped = " (time budget)" if stats.get("stopped_by") == "time_budget" else ""
    out["steps"] = stats["steps"] if not stopped else f"{stats['steps']:,} of {stats['total_steps']:,}{stopped}"
    return out
