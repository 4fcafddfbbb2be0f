"""Pretraining progress: every `pretrain.log_every` steps rank 0's trainer summarises the
steps since its last line (bertcore.metrics_log: the same interval means TensorBoard and
the other trackers get) and puts the summary on a Ray queue, and each validation too; the
driver logs them, so the lines reach the terminal and Prefect's flow-run log like every
other stage's, instead of a progress bar relayed from a worker. A loss jump the watcher
saw gets a line of its own.

    pretrain: steps 51-100/600 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · ETA 1m05s
    pretrain: validation at step 100 (640 held-out sequences) · loss 7.480 · MLM acc 8.8% · NSP acc 53.1%
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from bertcore.figures import count, duration, percent

log = logging.getLogger("pipelines.pretrain")


def step_line(s: dict[str, Any]) -> str:
    """pretrain: steps 1-50/340 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · MFU 1.2% · ETA 1m05s
    (the figures are the means over the steps named)."""
    steps = f"step {s['step']}" if s["first_step"] == s["step"] else f"steps {s['first_step']}-{s['step']}"
    parts = [f"pretrain: {steps}/{s['total_steps']} {s['phase']}"]
    if s["loss"] is not None:
        parts.append(f"loss {s['loss']:.3f}")
    if s["mlm_accuracy"] is not None:
        parts.append(f"MLM acc {percent(s['mlm_accuracy'])}")
    if s["tokens_per_s"] is not None:
        parts.append(f"{count(s['tokens_per_s'])} tokens/s")
    if s["mfu"] is not None:
        parts.append(f"MFU {percent(s['mfu'])}")
    if s["skipped_batches"]:
        parts.append(f"{s['skipped_batches']} micro-batches skipped")
    parts.append(f"ETA {duration(s['eta_s'])}" if s["step"] < s["total_steps"] else "done")
    return " · ".join(parts)


def jump_line(jump: dict[str, Any]) -> str:
    """pretrain: the loss jumped to 13.80 at step 95, 1.8x its running mean of 7.62; training goes on"""
    return f"pretrain: the loss jumped to {jump['loss']:.2f} at step {jump['step']}, {jump['factor']:.1f}x its running mean of {jump['running_mean']:.2f}; training goes on"


def validation_line(v: dict[str, Any]) -> str:
    """pretrain: validation at step 100 (640 held-out sequences) · loss 7.480 · MLM acc 8.8% · NSP acc 53.1%"""
    parts = [f"pretrain: validation at step {v['step']} ({count(v.get('sequences') or 0)} held-out sequences)", f"loss {v['loss']:.3f}"]
    if v.get("mlm_accuracy") is not None:
        parts.append(f"MLM acc {percent(v['mlm_accuracy'])}")
    if v.get("nsp_accuracy") is not None:
        parts.append(f"NSP acc {percent(v['nsp_accuracy'])}")
    return " · ".join(parts)


class StepReporter:
    """Rank 0's `on_log`: each interval summary, with the total steps and an ETA, goes to
    the driver's queue, which logs it."""

    def __init__(self, queue: Any, total_steps: int):
        self.queue, self.total_steps = queue, total_steps

    def __call__(self, summary: dict) -> None:
        if summary.get("event") == "validation":
            self._put(summary)
            return
        per_step = summary["seconds"] / summary["steps"] if summary["steps"] else 0.0
        self._put({
            "event": "train_progress",
            **{k: v for k, v in summary.items() if k != "loss_jumps"},
            "total_steps": self.total_steps,
            "eta_s": (self.total_steps - summary["step"]) * per_step,
            "loss_jumps": summary["loss_jumps"],
        })

    def _put(self, line: dict) -> None:
        from ray.util.queue import Full

        try:
            self.queue.put_nowait(line)
        except Full:  # the driver is not reading: drop a line rather than stall training
            pass


def relay_progress(queue: Any, stop: threading.Event) -> None:
    """Log the workers' progress summaries on the driver until `stop`, then what is left."""
    from ray.util.queue import Empty

    def emit(summary: dict) -> None:
        if summary.get("event") == "validation":
            log.info(validation_line(summary), extra=summary)
            return
        for jump in summary.get("loss_jumps") or []:
            log.warning(jump_line(jump), extra={"event": "loss_jump", **jump})
        log.info(step_line(summary), extra=summary)

    while not stop.is_set():
        try:
            emit(queue.get(timeout=0.5))
        except Empty:
            continue
    for summary in queue.get_nowait_batch(queue.qsize()):
        emit(summary)
