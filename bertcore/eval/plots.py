"""The evaluation report's plots: pretraining curves and task scores against the
baseline, drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot,
so nothing here touches a display or global plotting state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

MAX_PLOTTED_STEPS = 2000
"""Longer training logs are averaged over equal bins of steps before plotting."""
RAW_SCALE = ("loss", "perplexity", "mse", "count", "sequences", "batches", "tokens", "threshold", "anisotropy")
"""Metric names containing these are shown as they are; every other score is shown x 100, as papers do."""


def scale(metric: str) -> float:
    """1 for raw quantities (losses, counts), 100 for scores shown in points."""
    return 1.0 if any(word in metric for word in RAW_SCALE) else 100.0


def _save(fig: Figure, path: str) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})


def _binned(steps: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean step and mean value of `bins` consecutive, equally long runs of points."""
    if len(steps) <= bins:
        return steps, values
    groups = np.array_split(np.arange(len(steps)), bins)
    return np.array([steps[g].mean() for g in groups]), np.array([values[g].mean() for g in groups])


def plot_pretraining(records: list[dict], path: str) -> bool:
    """Loss and MLM accuracy against the optimizer step, with phase changes marked.
    Returns False (and writes nothing) when no record has a loss."""
    series = {}
    for name in ("loss", "mlm_accuracy"):
        points = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float)) and math.isfinite(r[name])]
        if points:
            steps, values = (np.asarray(x, dtype=float) for x in zip(*points))
            series[name] = _binned(steps, values, MAX_PLOTTED_STEPS)
    if "loss" not in series:
        return False
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    titles = {"loss": "training loss (MLM + NSP)", "mlm_accuracy": "training MLM accuracy"}
    for ax, name in zip(axes, ("loss", "mlm_accuracy")):
        ax.set_title(titles[name])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if name in series:
            ax.plot(*series[name], linewidth=1.2)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        previous = records[0].get("phase")
        for record in records[1:]:  # a dashed line where the sequence-length phase changes
            if record.get("phase") != previous:
                ax.axvline(record["step"], color="grey", linestyle="--", linewidth=0.8)
                ax.text(record["step"], 0.98, f" {record.get('phase')}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
                previous = record.get("phase")
    _save(fig, path)
    return True


def plot_tasks(tasks: Mapping[str, dict], path: str) -> bool:
    """Per task, the median of its primary validation metric over seeds for each model
    (the pretrained or, after distillation, the teacher and the student; the randomly
    initialised one), with min-max bars. False when there is no task."""
    names = [name for name, t in tasks.items() if t.get(t.get("subject", "pretrained"), {}).get("validation")]
    if not names:
        return False
    subject = tasks[names[0]].get("subject", "pretrained")
    models = [m for m in ("teacher", subject, "random_init") if any(m in tasks[n] for n in names)]
    fig = Figure(figsize=(max(4.5, 0.8 * len(models) * len(names) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(names))
    width = 0.76 / len(models)
    for i, model in enumerate(models):
        offset, label = (i - (len(models) - 1) / 2) * width, model.replace("_", " ")
        medians, low, high = [], [], []
        for name in names:
            summary = tasks[name].get(model, {}).get("validation", {}).get(tasks[name]["primary_metric"])
            factor = scale(tasks[name]["primary_metric"])
            if summary is None or summary.get("median") is None or not math.isfinite(summary["median"]):
                medians.append(np.nan), low.append(0.0), high.append(0.0)
                continue
            medians.append(summary["median"] * factor)
            low.append((summary["median"] - summary["min"]) * factor)
            high.append((summary["max"] - summary["median"]) * factor)
        if all(np.isnan(medians)):
            continue
        ax.bar(x + offset, medians, width, yerr=[low, high], capsize=3, label=label)
    ax.set_xticks(x, [f"{n}\n({tasks[n]['primary_metric']})" for n in names])
    ax.set_ylabel("validation score (x100), median over seeds")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    _save(fig, path)
    return True
