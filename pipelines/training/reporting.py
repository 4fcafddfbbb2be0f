"""Training progress (pretrain, distill): every `<section>.log_every` steps rank 0's trainer summarises the
steps since its last line (bertcore.train.metrics_log: the same interval means TensorBoard and
the other trackers get) and puts the summary on a Ray queue, and each validation too; the
driver logs them, so the lines reach the terminal and Prefect's flow-run log like every
other stage's, instead of a progress bar relayed from a worker. A loss jump the watcher
saw gets a line of its own.

    pretrain: steps 51-100/600 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · padding 9.8% · data wait 0.3% ·
    ETA 1m05s
    pretrain: validation at step 100 (640 held-out sequences) · loss 7.480 · MLM acc 8.8% · NSP acc 53.1%
    distill: steps 41-60/400 seq64 · loss 1.298 · hidden-state loss 0.108 · MLM acc 5.5% · 810 tokens/s · ETA 14m03s

Each line starts with the stage the trainer runs in (its `stage` key; pretrain when absent).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from bertcore.figures import count, duration, percent


def _log(line: dict[str, Any]) -> logging.Logger:
    return logging.getLogger(f"pipelines.{line.get('stage', 'pretrain')}")


def step_line(s: dict[str, Any]) -> str:
    """pretrain: steps 1-50/340 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · MFU 1.2% · padding 9.8% ·
    data wait 0.3% · ETA 1m05s (the figures are the means over the steps named; padding: the share of the positions
    run on that were padding, 0 for packed batches; data wait: the share of the steps' time rank 0 waited for its
    batches)."""
    steps = f"step {s['step']}" if s["first_step"] == s["step"] else f"steps {s['first_step']}-{s['step']}"
    parts = [f"{s.get('stage', 'pretrain')}: {steps}/{s['total_steps']} {s['phase']}"]
    if s["loss"] is not None:
        parts.append(f"loss {s['loss']:.3f}")
    if s.get("hidden_loss") is not None:  # distillation's
        parts.append(f"hidden-state loss {s['hidden_loss']:.3f}")
    if s["mlm_accuracy"] is not None:
        parts.append(f"MLM acc {percent(s['mlm_accuracy'])}")
    if s["tokens_per_s"] is not None:
        parts.append(f"{count(s['tokens_per_s'])} tokens/s")
    if s["mfu"] is not None:
        parts.append(f"MFU {percent(s['mfu'])}")
    if s.get("padding_share") is not None:
        parts.append(f"padding {percent(s['padding_share'])}")
    if s.get("data_wait_share") is not None:
        parts.append(f"data wait {percent(s['data_wait_share'])}")
    if s["skipped_batches"]:
        parts.append(f"{s['skipped_batches']} micro-batches skipped")
    if s["step"] >= s["total_steps"]:
        parts.append("done")
    else:
        parts.append(f"ETA {duration(s['eta_s'])}" + (" (time budget)" if s.get("eta_by") == "time_budget" else ""))
    return " · ".join(parts)


def budget_line(s: dict[str, Any]) -> str:
    """distill: stopped at step 132 of 400: the time budget of 240 s is spent"""
    return (
        f"{s.get('stage', 'pretrain')}: stopped at step {s['step']} of {s['total_steps']}: the time budget of "
        f"{duration(s['time_budget_s'])} is spent"
    )


def jump_line(jump: dict[str, Any]) -> str:
    """pretrain: the loss jumped to 13.80 at step 95, 1.8x its running mean of 7.62; training goes on"""
    return (
        f"{jump.get('stage', 'pretrain')}: the loss jumped to {jump['loss']:.2f} at step {jump['step']}, "
        f"{jump['factor']:.1f}x its running mean of {jump['running_mean']:.2f}; training goes on"
    )


def validation_line(v: dict[str, Any]) -> str:
    """pretrain: validation at step 100 (640 held-out sequences) · loss 7.480 · MLM acc 8.8% · NSP acc 53.1%"""
    parts = [
        (
            f"{v.get('stage', 'pretrain')}: validation at step {v['step']} ({count(v.get('sequences') or 0)} "
            "held-out sequences)"
        ),
        f"loss {v['loss']:.3f}",
    ]
    if v.get("hidden_loss") is not None:
        parts.append(f"hidden-state loss {v['hidden_loss']:.3f}")
    if v.get("mlm_accuracy") is not None:
        parts.append(f"MLM acc {percent(v['mlm_accuracy'])}")
    if v.get("nsp_accuracy") is not None:
        parts.append(f"NSP acc {percent(v['nsp_accuracy'])}")
    return " · ".join(parts)


class StepReporter:
    """Rank 0's `on_log`: each interval summary, with the total steps and an ETA, goes to
    the driver's queue, which logs it."""

    def __init__(self, queue: Any, total_steps: int, stage: str = "pretrain"):
        self.queue, self.total_steps, self.stage = queue, total_steps, stage

    def __call__(self, summary: dict) -> None:
        if summary.get("event") in ("validation", "time_budget"):
            self._put({**summary, "stage": self.stage})
            return
        per_step = summary["seconds"] / summary["steps"] if summary["steps"] else 0.0
        eta, by = (self.total_steps - summary["step"]) * per_step, "steps"
        if (
            summary.get("budget_left_s") is not None and summary["budget_left_s"] < eta
        ):  # the budget ends training first
            eta, by = summary["budget_left_s"], "time_budget"
        self._put(
            {
                "event": "train_progress",
                "stage": self.stage,
                **{k: v for k, v in summary.items() if k not in ("loss_jumps", "budget_left_s")},
                "total_steps": self.total_steps,
                "eta_s": eta,
                "eta_by": by,
                "loss_jumps": [{**jump, "stage": self.stage} for jump in summary["loss_jumps"]],
            }
        )

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
            _log(summary).info(validation_line(summary), extra=summary)
            return
        if summary.get("event") == "time_budget":
            _log(summary).info(budget_line(summary), extra=summary)
            return
        for jump in summary.get("loss_jumps") or []:
            _log(summary).warning(jump_line(jump), extra={"event": "loss_jump", **jump})
        _log(summary).info(step_line(summary), extra=summary)

    from ray.exceptions import RayError

    try:
        while not stop.is_set():
            try:
                emit(queue.get(timeout=0.5))
            except Empty:
                continue
        for summary in queue.get_nowait_batch(queue.qsize()):
            emit(summary)
    except RayError:  # the queue went with Ray (Ctrl-C, a lost driver): the run's own error says why
        return
