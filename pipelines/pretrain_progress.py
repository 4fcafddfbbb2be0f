"""Training progress (pretrain, distill): rank 0 summarises the steps since its last line
every `<section>.log_every` steps and puts the summary on a Ray queue; the driver logs it,
so the lines reach the terminal and Prefect's flow-run log like every other stage's,
instead of a progress bar relayed from a worker.

    pretrain: step 40/340 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · ETA 1m05s
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pipelines.progress import count, duration

class StepWindow:
    """Training steps since the last progress line, summarised for one line: mean loss
    and MLM accuracy, tokens/s over the window, mean MFU (where the peak is known), ETA."""

    def __init__(self, total_steps: int, stage: str = "pretrain"):
        self.total_steps = total_steps
        self.stage = stage
        self.records: list[dict] = []

    def add(self, record: dict) -> None:
        self.records.append(record)

    def summary(self) -> dict[str, Any]:
        records, self.records = self.records, []
        last = records[-1]

        def mean(key: str) -> float | None:
            values = [r[key] for r in records if r.get(key) is not None]
            return sum(values) / len(values) if values else None

        seconds = sum(r["step_time_s"] for r in records)
        return {
            "event": "train_progress",
            "stage": self.stage,
            "step": last["step"],
            "total_steps": self.total_steps,
            "phase": last["phase"],
            "loss": mean("loss"),
            "hidden_loss": mean("hidden_loss"),  # distillation's
            "mlm_accuracy": mean("mlm_accuracy"),
            "tokens_per_s": sum(r["tokens"] for r in records) / seconds if seconds else None,
            "mfu": mean("mfu"),
            "eta_s": (self.total_steps - last["step"]) * seconds / len(records),
            "skipped_batches": sum(r.get("skipped_batches", 0) for r in records),
        }


def step_line(s: dict[str, Any]) -> str:
    """pretrain: step 40/340 seq128 · loss 7.796 · MLM acc 4.3% · 11.2k tokens/s · MFU 1.2% · ETA 1m05s"""
    parts = [f"{s.get('stage', 'pretrain')}: step {s['step']}/{s['total_steps']} {s['phase']}"]
    if s["loss"] is not None:
        parts.append(f"loss {s['loss']:.3f}")
    if s.get("hidden_loss") is not None:
        parts.append(f"hidden-state loss {s['hidden_loss']:.3f}")
    if s["mlm_accuracy"] is not None:
        parts.append(f"MLM acc {s['mlm_accuracy']:.1%}")
    if s["tokens_per_s"] is not None:
        parts.append(f"{count(s['tokens_per_s'])} tokens/s")
    if s["mfu"] is not None:
        parts.append(f"MFU {s['mfu']:.1%}")
    if s["skipped_batches"]:
        parts.append(f"{s['skipped_batches']} micro-batches skipped")
    parts.append(f"ETA {duration(s['eta_s'])}" if s["step"] < s["total_steps"] else "done")
    return " · ".join(parts)


class StepReporter:
    """Rank 0's `on_step`: every `log_every` steps (and at the last), one summary of the
    steps since the previous one goes to the driver's queue, which logs it."""

    def __init__(self, queue: Any, total_steps: int, every: int, stage: str = "pretrain"):
        self.queue, self.every = queue, every
        self.window = StepWindow(total_steps, stage)

    def __call__(self, record: dict) -> None:
        self.window.add(record)
        if record["step"] % self.every == 0 or record["step"] == self.window.total_steps:
            from ray.util.queue import Full

            try:
                self.queue.put_nowait(self.window.summary())
            except Full:  # the driver is not reading: drop a line rather than stall training
                pass


def relay_progress(queue: Any, stop: threading.Event) -> None:
    """Log the workers' progress summaries on the driver until `stop`, then what is left."""
    from ray.util.queue import Empty

    def emit(summary: dict) -> None:
        logging.getLogger(f"pipelines.{summary.get('stage', 'pretrain')}").info(step_line(summary), extra=summary)

    while not stop.is_set():
        try:
            emit(queue.get(timeout=0.5))
        except Empty:
            continue
    for summary in queue.get_nowait_batch(queue.qsize()):
        emit(summary)
