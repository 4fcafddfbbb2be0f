"""After distillation, the evaluation compares three models: the teacher, the student and
a random init of the student's architecture. This module says what the student keeps of
the teacher's gain over that random init, and at what speed:

    kept = (student - random init) / (teacher - random init)

on each task's primary metric (validation medians over seeds) and on STS Spearman for each
pooling; speed = the student's sequences/s over the teacher's, both measured on the
evaluating machine with the same batch and threads (bertcore/eval/speed.py). Whether the
student's own gain is real is the task's verdict (bertcore/eval/summary.py, the student
against random init); a teacher without a gain leaves nothing to keep, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bertcore import figures

MODELS = ("teacher", "student", "random_init")


def _median(entry: Mapping, model: str, metric: str) -> float | None:
    value = (((entry.get(model) or {}).get("validation") or {}).get(metric) or {}).get("median")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def compare(metric: str, teacher: float | None, student: float | None, random_init: float | None) -> dict[str, Any]:
    """{metric, teacher, student, random_init, teacher_gain, student_gain, kept}: kept is
    None when a score is missing or the teacher gains nothing over random init."""
    out: dict[str, Any] = {"metric": metric, "teacher": teacher, "student": student, "random_init": random_init,
                           "teacher_gain": None, "student_gain": None, "kept": None}
    if None in (teacher, student, random_init):
        return out
    out["teacher_gain"], out["student_gain"] = teacher - random_init, student - random_init
    if out["teacher_gain"] > 0:
        out["kept"] = out["student_gain"] / out["teacher_gain"]
    return out


def speed_ratio(speed: Mapping[str, Any] | None) -> float | None:
    """The student's sequences/s over the teacher's."""
    if not speed or "student" not in speed or "teacher" not in speed:
        return None
    return speed["student"]["sequences_per_s"] / speed["teacher"]["sequences_per_s"]


def comparisons(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{label: comparison} for every task (its primary metric) and every pooling's STS
    Spearman when an STS file was scored."""
    out = {}
    for name, task in (metrics.get("tasks") or {}).items():
        metric = task["primary_metric"]
        out[name] = compare(metric, *(_median(task, m, metric) for m in MODELS))
    embeddings = metrics.get("embeddings") or {}
    if embeddings.get("sts_pairs"):
        for pooling in (embeddings.get("student") or {}):
            values = [((embeddings.get(m) or {}).get(pooling) or {}).get("sts_spearman") for m in MODELS]
            out[f"STS ({pooling} pooling)"] = compare("sts_spearman", *values)
    return out


def line(label: str, comparison: Mapping[str, Any], ratio: float | None) -> str:
    """One verdict line: "polarity (accuracy): the student keeps 91% of the teacher's gain
    over random init (8.2 of 9.0 points), at 2.3x its speed"."""
    c, shown = comparison, lambda value: figures.metric(comparison["metric"], value)
    speed = f", at {ratio:.1f}x its speed" if ratio else ""
    head = f"{label} ({figures.name(c['metric'])}): "
    if c["teacher_gain"] is None:
        return head + "no three-way comparison (a score is missing)"
    scores = f"teacher {shown(c['teacher'])}, student {shown(c['student'])}, random init {shown(c['random_init'])}"
    if c["kept"] is None:
        return head + f"the teacher gains nothing over random init, so there is nothing to keep ({scores}){speed}"
    return (head + f"the student keeps {c['kept']:.0%} of the teacher's gain over random init "
            f"({figures.points(c['student_gain'])} of {figures.points(c['teacher_gain'])} points; {scores}){speed}")


def lines(metrics: Mapping[str, Any]) -> list[str]:
    """A line per task and STS pooling (see `line`)."""
    ratio = speed_ratio(metrics.get("speed"))
    return [line(label, c, ratio) for label, c in comparisons(metrics).items()]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def report_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    """The report's three-way section: the models with their size and speed, then each
    task's and STS's scores with what the student keeps."""
    models = metrics.get("models") or {}
    speed = metrics.get("speed") or {}
    out = ["## Distillation: teacher, student, random init", ""]
    measured = next(iter(speed.values()), None)
    out.append(
        "Validation medians over seeds (accuracy and F1 in percent, correlations x 100), gains in points. "
        "The random init has the student's architecture. "
        "Kept = (student - random init) / (teacher - random init). "
        + (f"Speed: the encoder forward on batches of {measured['batch_size']} x {measured['seq_length']} tokens with "
           f"{measured['threads']} thread(s) on the machine that evaluated, the models interleaved, median of {measured['passes']} passes."
           if measured else "Speed was not measured (evaluate.speed.enabled: false).")
    )
    out.append("")
    teacher_speed = (speed.get("teacher") or {}).get("sequences_per_s")
    rows = []
    for name in MODELS:
        model = models.get(name) or {}
        shape = model.get("config") or {}
        rate = (speed.get(name) or {}).get("sequences_per_s")
        relative = f"{rate / teacher_speed:.2f}x" if rate and teacher_speed else "–"
        rows.append([name.replace("_", " "), f"`{model.get('uri', '?')}`", f"{shape.get('num_hidden_layers')} x {shape.get('hidden_size')}",
                     f"{model.get('parameters', 0):,}", f"{rate:.1f}" if rate else "–", relative])
    out += _table(["model", "weights", "layers x hidden", "parameters", "sequences/s", "speed vs teacher"], rows)
    out.append("")
    rows = []
    for label, c in comparisons(metrics).items():
        kept = f"{c['kept']:.0%}" if c["kept"] is not None else "–"
        shown = [figures.metric(c["metric"], c[m]) for m in MODELS]
        rows.append([label, figures.name(c["metric"]), *shown, figures.points(c["teacher_gain"]), figures.points(c["student_gain"]), kept])
    out += _table(["task", "metric", "teacher", "student", "random init", "teacher gain", "student gain", "student keeps"], rows)
    out.append("")
    return out
