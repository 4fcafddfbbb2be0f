"""The training logs (pretrain, distill), JSON lines keyed by optimizer step: metrics.jsonl
(one record per step: losses, accuracies, rates) and validation.jsonl (one record per
validation of the held-out sample, every <section>.eval_every steps and at the end), and
the one definition of the figures shown from them.

What every place shows (the console, TensorBoard, MLflow, W&B, `bertpipe inspect`, the
report, the run summary) is an interval mean, Hugging Face Trainer's convention: the
logging intervals are the steps (k * log_every, (k + 1) * log_every], the last one ending
at the final step, and a figure at step S is the mean over S's interval (rates: tokens
over seconds of the interval; the learning rate and counters: their value at S). The
"final" training figures are those of the last interval, printed with its steps ("final,
mean of steps 551-600"). Validation figures come from validation.jsonl, on the fixed
held-out sample, and are labelled validation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

METRICS = "metrics.jsonl"
VALIDATION = "validation.jsonl"
TENSORBOARD = "tensorboard"
"""TensorBoard event files (bertcore.train.tracking)."""
TRACKING_STATE = "tracking.json"
"""The MLflow and W&B run ids of the run (bertcore.train.tracking)."""


class MetricsLog:
    """A JSON-lines log whose records carry the optimizer `step`, appended by rank 0."""

    def __init__(self, path: str):
        self.path = path

    def truncate(self, step: int) -> None:
        """Keep the records of steps <= `step` (a resumed run rewrites the later ones)."""
        kept = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a kill
                        continue
                    if record.get("step", 0) <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def records(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


def read_training_log(lines: Iterable[str]) -> tuple[list[dict], int]:
    """(records with a numeric `step`, in step order; number of unreadable lines) from the
    lines of pretrain/metrics.jsonl. A line cut short by a crash, or one without a step,
    is counted and left out rather than failing the report."""
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), (int, float)):
            bad += 1
            continue
        records.append(record)
    records.sort(key=lambda r: r["step"])
    return records, bad


DISTILLATION = ("soft_target_loss", "hidden_loss", "attention_loss")
"""The distill stage's loss terms (bertcore/distill/objective.py), beside its MLM figures."""
MEANS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", *DISTILLATION, "grad_norm", "mfu")
"""Step figures averaged over an interval (a figure a log lacks is None)."""
AT_END = ("phase", "lr", "tokens_seen", "epoch")
"""Step figures taken at the interval's last step."""
VALIDATION_FIGURES = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", *DISTILLATION)


def interval_index(step: int, every: int) -> int:
    """The logging interval of optimizer step `step` (1-based): steps 1..every are 0."""
    return (step - 1) // every


TRACKED = (
    "lr",
    "grad_norm",
    "tokens_per_s",
    "sequences_per_s",
    "mfu",
    "padding_share",
    "tokens_seen",
    "skipped_batches",
)
"""Figures of an interval's summary (`summarize`) that the trainer gives the trackers as
train/<field>, every log_every steps and at the last, after the loss and the objective's
metrics."""


def summarize(records: list[dict], means: tuple[str, ...] = MEANS) -> dict:
    """The figures of one interval from its steps' records (in step order): means of `means`,
    tokens/s and sequences/s over the interval's seconds, the share of those seconds rank 0
    waited for its batches (data_wait_share), AT_END at its last step, the
    skipped micro-batches summed, and the loss jumps the watcher saw (bertcore.train.loss_watch)."""
    last = records[-1]

    def mean(key: str) -> float | None:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    seconds = sum(r.get("step_time_s") or 0.0 for r in records)
    out = {"first_step": records[0]["step"], "step": last["step"], "steps": len(records), "seconds": seconds}
    out.update({key: mean(key) for key in means})
    out.update({key: last.get(key) for key in AT_END})
    out["tokens_per_s"] = sum(r.get("tokens", 0) for r in records) / seconds if seconds else None
    out["sequences_per_s"] = sum(r.get("sequences", 0) for r in records) / seconds if seconds else None
    out["skipped_batches"] = sum(r.get("skipped_batches", 0) for r in records)
    out["padding_share"] = padding_share(records)
    waits = [r["data_wait_s"] for r in records if isinstance(r.get("data_wait_s"), (int, float))]
    out["data_wait_share"] = sum(waits) / seconds if waits and seconds else None
    out["loss_jumps"] = [
        {"step": r["step"], "loss": r["loss"], **r["loss_jump"]} for r in records if r.get("loss_jump")
    ]
    return out


def padding_share(records: Iterable[dict]) -> float | None:
    """The share of the positions the model ran on that were padding, over `records`
    (0 for packed batches; None for records without the counts)."""
    rows = [r for r in records if r.get("padded_tokens")]
    if not rows:
        return None
    return 1.0 - sum(r["tokens"] for r in rows) / sum(r["padded_tokens"] for r in rows)


def intervals(records: Iterable[dict], every: int) -> list[dict]:
    """The summary of every logging interval of a metrics log (records with a numeric
    step, in step order), the last one ending at the last step logged."""
    groups: dict[int, list[dict]] = {}
    for record in records:
        groups.setdefault(interval_index(int(record["step"]), every), []).append(record)
    return [summarize(groups[k]) for k in sorted(groups)]


def at_step(records: list[dict], step: int, every: int) -> dict | None:
    """The summary of `step`'s interval up to `step` (what was logged at `step` when it
    ended an interval), or None when no record of it is there."""
    k = interval_index(step, every)
    found = [r for r in records if interval_index(int(r["step"]), every) == k and r["step"] <= step]
    return summarize(found) if found else None


def final(records: list[dict], every: int) -> dict | None:
    """The final training figures: the summary of the last interval (None without records)."""
    return at_step(records, int(records[-1]["step"]), every) if records else None


def steps_text(summary: dict) -> str:
    """How a summary says what it averages: "step 600" or "mean of steps 551-600"."""
    first, last = summary["first_step"], summary["step"]
    return f"step {last}" if first == last else f"mean of steps {first}-{last}"


class Interval:
    """The steps of the current logging interval on rank 0: `add` each step's record,
    `close` at the interval's last step for its summary. After a resume at step S it is
    `resumed` with the records of S's interval already in metrics.jsonl, so the figures
    logged at the end of that interval are the same as without the interruption."""

    def __init__(self, every: int, means: tuple[str, ...] = MEANS):
        self.every, self.means, self.records = every, means, []

    def resumed(self, logged: list[dict], step: int) -> Interval:
        k = interval_index(step + 1, self.every)
        self.records = [r for r in logged if r["step"] <= step and interval_index(int(r["step"]), self.every) == k]
        return self

    def add(self, record: dict) -> None:
        self.records.append(record)

    def ends(self, step: int, final: bool) -> bool:
        return final or step % self.every == 0

    def close(self) -> dict:
        summary, self.records = summarize(self.records, self.means), []
        return summary
