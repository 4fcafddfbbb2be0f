"""After distillation, the evaluation compares the teacher, the student, the student's
start (its initialisation before any distillation step: with `init: from_teacher` the
teacher's embeddings and the layers the layer map picks, untrained) and a random init of
the student's architecture. This module says what the student keeps of the teacher's gain
over that random init, at what speed, and how much of the student's gain its start
already had:

    kept     = (student - random init) / (teacher - random init)
    start    = student start - random init      (what the initialisation gave)
    training = student - student start          (what the distillation steps added)

on each task's primary metric (validation medians over seeds) and on STS Spearman for each
pooling; speed = the student's sequences/s over the teacher's, both measured on the
evaluating machine with the same batch and threads (bertcore/eval/speed.py). Each part is
judged against the seed spread of its two models (the larger max - min over seeds,
bertcore/eval/baselines.py): above it a gain, within it "no measurable gain"; scores that
do not depend on the seed (STS, a word-similarity score of a trained model) have no spread
and are shown as they are. Whether the student's own gain is real is the task's verdict
(bertcore/eval/summary.py, the student against random init); a teacher without a gain
leaves nothing to keep, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bertcore import figures
from bertcore.eval.baselines import spread

MODELS = ("teacher", "student", "student_start", "random_init")
"""Every model of a distillation's evaluation, in the order the report lists them."""
START = "student_start"


def _summary(entry: Mapping, model: str, metric: str) -> Mapping | None:
    return (((entry.get(model) or {}).get("validation") or {}).get(metric)) or None


def _median(entry: Mapping, model: str, metric: str) -> float | None:
    value = (_summary(entry, model, metric) or {}).get("median")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def compare(
    metric: str,
    teacher: float | None,
    student: float | None,
    random_init: float | None,
    start: float | None = None,
    start_spread: float | None = None,
    training_spread: float | None = None,
) -> dict[str, Any]:
    """{metric, teacher, student, student_start, random_init, teacher_gain, student_gain,
    kept, start_gain, training_gain, start_spread, training_spread}: kept is None when a
    score is missing or the teacher gains nothing over random init; start_gain (start -
    random init) and training_gain (student - start) are None without the start's score.
    The spreads are those of each part's two models (None: no seeds to spread over)."""
    out: dict[str, Any] = {
        "metric": metric,
        "teacher": teacher,
        "student": student,
        START: start,
        "random_init": random_init,
        "teacher_gain": None,
        "student_gain": None,
        "kept": None,
        "start_gain": None,
        "training_gain": None,
        "start_spread": start_spread,
        "training_spread": training_spread,
    }
    if None not in (student, random_init, start):
        out["start_gain"], out["training_gain"] = start - random_init, student - start
    if None in (teacher, student, random_init):
        return out
    out["teacher_gain"], out["student_gain"] = teacher - random_init, student - random_init
    if out["teacher_gain"] > 0:
        out["kept"] = out["student_gain"] / out["teacher_gain"]
    return out


def _task_comparison(task: Mapping[str, Any]) -> dict[str, Any]:
    metric = task["primary_metric"]
    summaries = {m: _summary(task, m, metric) for m in MODELS}
    return compare(
        metric,
        *(_median(task, m, metric) for m in ("teacher", "student", "random_init")),
        _median(task, START, metric),
        spread(summaries[START], summaries["random_init"]),
        spread(summaries["student"], summaries[START]),
    )


def speed_ratio(speed: Mapping[str, Any] | None) -> float | None:
    """The student's sequences/s over the teacher's."""
    if not speed or "student" not in speed or "teacher" not in speed:
        return None
    return speed["student"]["sequences_per_s"] / speed["teacher"]["sequences_per_s"]


def comparisons(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{label: comparison} for every task (its primary metric) and every pooling's STS
    Spearman when an STS file was scored."""
    out = {name: _task_comparison(task) for name, task in (metrics.get("tasks") or {}).items()}
    embeddings = metrics.get("embeddings") or {}
    if embeddings.get("sts_pairs"):
        for pooling in embeddings.get("student") or {}:
            values = {m: ((embeddings.get(m) or {}).get(pooling) or {}).get("sts_spearman") for m in MODELS}
            out[f"STS ({pooling} pooling)"] = compare(
                "sts_spearman", values["teacher"], values["student"], values["random_init"], values[START]
            )
    return out


def _part(gain: float, width: float | None, total: float | None) -> str:
    """One part of the student's gain as it reads: its points, its share of `total` (when
    that is a gain), and the judgement against its seed spread `width` (none without one)."""
    text = figures.points(gain) + (f" ({gain / total:.0%})" if total is not None and total > 0 else "")
    if width is None:
        return text
    if gain > width:
        return f"{text}, above the seed spread of {figures.points(width)}"
    if gain < -width:
        return f"{text}, a loss beyond the seed spread of {figures.points(width)}"
    return f"{text}: no measurable gain (within the seed spread of {figures.points(width)})"


def split_text(c: Mapping[str, Any]) -> str:
    """Where the student's gain over random init comes from: "of its 15.5 points the start
    gave 8.0 (52%), above the seed spread of 6.0, and training 7.5 (48%): no measurable gain
    (within the seed spread of 8.0)"; "" without the start's score."""
    if c.get("start_gain") is None:
        return ""
    total = c["student_gain"]
    start, training = (
        _part(c["start_gain"], c["start_spread"], total),
        _part(c["training_gain"], c["training_spread"], total),
    )
    if total is not None and total > 0:
        text = f"of its {figures.points(total)} points the start gave {start}, and training {training}"
    else:
        text = f"the start gave {start} points over random init, and training {training}"
    if c["start_spread"] is None and c["training_spread"] is None:
        text += " (one score per model: no seed spread to judge them by)"
    elif c["training_spread"] is None:
        text += " (the student and its start score once each: no seed spread to judge training by)"
    return text


def line(label: str, comparison: Mapping[str, Any], ratio: float | None) -> str:
    """One verdict line: "polarity (accuracy): the student keeps 91% of the teacher's gain
    over random init (8.2 of 9.0 points), at 2.3x its speed"."""
    c, shown = comparison, lambda value: figures.metric(comparison["metric"], value)
    speed = f", at {ratio:.1f}x its speed" if ratio else ""
    head = f"{label} ({figures.name(c['metric'])}): "
    if c["teacher_gain"] is None:
        return head + "no three-way comparison (a score is missing)"
    start = f", student start {shown(c[START])}" if c.get(START) is not None else ""
    scores = (
        f"teacher {shown(c['teacher'])}, student {shown(c['student'])}{start}, random init {shown(c['random_init'])}"
    )
    split = f"; {split_text(c)}" if split_text(c) else ""
    if c["kept"] is None:
        return (
            head + f"the teacher gains nothing over random init, so there is nothing to keep ({scores}){speed}{split}"
        )
    return (
        head + f"the student keeps {c['kept']:.0%} of the teacher's gain over random init "
        f"({figures.points(c['student_gain'])} of {figures.points(c['teacher_gain'])} points; {scores}){speed}{split}"
    )


def lines(metrics: Mapping[str, Any]) -> list[str]:
    """A line per task and STS pooling (see `line`)."""
    ratio = speed_ratio(metrics.get("speed"))
    return [line(label, c, ratio) for label, c in comparisons(metrics).items()]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def report_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    """The report's distillation section: the models with their size and speed, then each
    task's and STS's scores with what the student keeps and where its gain comes from."""
    models = metrics.get("models") or {}
    speed = metrics.get("speed") or {}
    with_start = START in models
    out = ["## Distillation: teacher, student" + (", student start" if with_start else "") + ", random init", ""]
    measured = next(iter(speed.values()), None)
    out.append(
        "Validation medians over seeds (accuracy and F1 in percent, correlations x 100), gains in points. "
        "The random init has the student's architecture. "
        "Kept = (student - random init) / (teacher - random init). "
        + (
            "The student start is the student before its first distillation step (distill/student-start/); from start "
            "= student start - random init, from training = student - student start, each judged against the seed "
            "spread of its two models where they have seeds (the verdicts say it). "
            if with_start
            else ""
        )
        + (
            f"Speed: the encoder forward on batches of {measured['batch_size']} x {measured['seq_length']} tokens with "
            f"{measured['threads']} thread(s) on the machine that evaluated, the models interleaved, median "
            f"of {measured['passes']} passes"
            + (" (the student start has the student's architecture, so its speed)." if with_start else ".")
            if measured
            else "Speed was not measured (evaluate.speed.enabled: false)."
        )
    )
    out.append("")
    teacher_speed = (speed.get("teacher") or {}).get("sequences_per_s")
    shown_models = [m for m in MODELS if m != START or with_start]
    rows = []
    for name in shown_models:
        model = models.get(name) or {}
        shape = model.get("config") or {}
        rate = (speed.get(name) or {}).get("sequences_per_s")
        relative = f"{rate / teacher_speed:.2f}x" if rate and teacher_speed else "–"
        rows.append(
            [
                name.replace("_", " "),
                f"`{model.get('uri', '?')}`",
                f"{shape.get('num_hidden_layers')} x {shape.get('hidden_size')}",
                f"{model.get('parameters', 0):,}",
                f"{rate:.1f}" if rate else "–",
                relative,
            ]
        )
    out += _table(["model", "weights", "layers x hidden", "parameters", "sequences/s", "speed vs teacher"], rows)
    out.append("")
    rows = []
    for label, c in comparisons(metrics).items():
        kept = f"{c['kept']:.0%}" if c["kept"] is not None else "–"
        shown = [figures.metric(c["metric"], c[m]) for m in shown_models]
        split = [figures.points(c["start_gain"]), figures.points(c["training_gain"])] if with_start else []
        rows.append(
            [
                label,
                figures.name(c["metric"]),
                *shown,
                figures.points(c["teacher_gain"]),
                figures.points(c["student_gain"]),
                *split,
                kept,
            ]
        )
    header = ["task", "metric", *(m.replace("_", " ") for m in shown_models), "teacher gain", "student gain"]
    out += _table(header + (["from start", "from training"] if with_start else []) + ["student keeps"], rows)
    out.append("")
    return out
