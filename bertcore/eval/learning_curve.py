"""A task's learning curve over the share of its training examples (`train_fractions`,
subsets drawn by bertcore/eval/fractions.py): the metrics.json entry and the report's
section. Each fraction is judged as a task is (bertcore/eval/summary.py): the subject's
median gain over random init beside the seed spread, so "pretraining helps most when
labels are few" shows as a gain above the spread at the small fractions, or does not.

The entry, `tasks[name]["learning_curve"]` in metrics.json:
    metric:    the task's primary metric
    fractions: [float], increasing
    points:    one per fraction: {"fraction", "fit_examples" ([examples per scored fit]),
               SUBJECT / "random_init" / "teacher": {median, min, max, std, n, n_nan,
               "values": [one per seed]}, "majority", "gain", "verdict": {"text", ...}}
It imports nothing heavy (the report reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertcore import figures


def learning_curve(entries: Mapping[float, Mapping[str, Any]]) -> dict[str, Any]:
    """The entry above from the task entries (bertcore.eval.summary.task_entry) of each
    fraction, in increasing order."""
    points = []
    metric = ""
    for fraction, entry in entries.items():
        metric = entry["primary_metric"]
        point: dict[str, Any] = {"fraction": fraction, "fit_examples": entry.get("fit_examples")}
        for model in ("teacher", entry.get("subject", "pretrained"), "random_init"):
            if model in entry:
                values = [(run.get("validation") or {}).get(metric) for run in entry[model]["runs"]]
                point[model] = dict(entry[model]["validation"][metric]) | {"values": values}
        point["majority"] = (((entry.get("baselines") or {}).get("validation") or {}).get("majority") or {}).get(metric)
        point["gain"] = (entry.get("gain") or {}).get(metric)
        point["verdict"] = entry["verdict"]
        points.append(point)
    return {"metric": metric, "fractions": list(entries), "points": points}


def _cell(metric: str, summary: Mapping | None) -> str:
    if not summary or summary.get("median") is None:
        return "–"
    text = figures.metric(metric, summary["median"])
    if summary.get("n", 0) > 1:
        text += f" [{figures.metric(metric, summary['min'])}, {figures.metric(metric, summary['max'])}]"
    return text


def _examples(point: Mapping[str, Any]) -> str:
    sizes = point.get("fit_examples") or []
    if not sizes:
        return "–"
    low, high = min(sizes), max(sizes)
    return f"{low}" if low == high else f"{low}-{high}"


def report_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    """The report's section on the tasks with a learning curve ([] when none has one)."""
    subject = metrics.get("subject", "pretrained")
    curves = {
        name: task["learning_curve"]
        for name, task in (metrics.get("tasks") or {}).items()
        if task.get("learning_curve")
    }
    if not curves:
        return []
    out = [
        "## Few labels: scores over the share of training examples",
        "",
        (
            "Each task fine-tuned on nested seeded subsets of its training examples (the smaller inside the larger; "
            "stratified by label for classification; the same subsets for every model and seed; with "
            "cross-validation, of each fold's training part). Validation medians over seeds [min, max]; gain = "
            f"{subject} median - random-init median, in points, judged against the seed spread as each task is."
        ),
        "",
    ]
    if "label_fractions" in plots:
        out += [f"![scores over the share of training examples]({plots['label_fractions']})", ""]
    rows = []
    for name, curve in curves.items():
        metric = curve["metric"]
        for point in curve["points"]:
            gain = point.get("gain")
            rows.append(
                [
                    name,
                    f"{100 * point['fraction']:g}%",
                    _examples(point),
                    _cell(metric, point.get(subject)),
                    _cell(metric, point.get("random_init")),
                    "–"
                    if gain is None
                    else figures.points(gain)
                    if figures.is_score(metric)
                    else figures.metric(metric, gain),
                    figures.metric(metric, point.get("majority")),
                    (point.get("verdict") or {}).get("text", ""),
                ]
            )
    header = ["task", "share", "examples per fit", subject, "random init", "gain (points)", "majority", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out + lines + [""]
