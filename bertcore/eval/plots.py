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

from bertcore.figures import scale
from bertcore.train.metrics_log import intervals

MAX_PLOTTED_STEPS = 2000
"""Longer training logs are averaged over equal bins of steps before plotting."""


def _save(fig: Figure, path: str) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})


def _binned(steps: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean step and mean value of `bins` consecutive, equally long runs of points."""
    if len(steps) <= bins:
        return steps, values
    groups = np.array_split(np.arange(len(steps)), bins)
    return np.array([steps[g].mean() for g in groups]), np.array([values[g].mean() for g in groups])


def plot_pretraining(
    records: list[dict], validations: list[dict], every: int, unigram: float | None, path: str
) -> bool:
    """Training loss and MLM accuracy (in percent) against the optimizer step, as the
    console and the trackers show them: the means over each logging interval of `every`
    steps (bertcore.train.metrics_log), with the validations as points, the unigram baseline's
    accuracy as a line, and phase changes marked. Returns False (and writes nothing) when
    no record has a loss."""
    summaries = [s for s in intervals(records, max(1, every)) if s.get("loss") is not None]
    if not summaries:
        return False
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (("loss", "loss (MLM + NSP)", 1.0), ("mlm_accuracy", "MLM accuracy (%)", 100.0))
    for ax, (name, title, factor) in zip(axes, panels):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        points = [(s["step"], s[name] * factor) for s in summaries if s.get(name) is not None]
        if points:
            steps, values = (np.asarray(x, dtype=float) for x in zip(*points))
            ax.plot(
                *_binned(steps, values, MAX_PLOTTED_STEPS), linewidth=1.2, label=f"training (mean of {every} steps)"
            )
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        held = [
            (v["step"], v[name] * factor)
            for v in validations
            if isinstance(v.get(name), (int, float)) and math.isfinite(v[name])
        ]
        if held:
            ax.plot(*zip(*held), "o-", markersize=4, linewidth=0.8, label="validation")
        if name == "mlm_accuracy" and unigram is not None:
            ax.axhline(unigram * factor, color="grey", linestyle=":", linewidth=1.0, label="unigram baseline")
        _mark_phases(ax, records)
        if points or held:
            ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _mark_phases(ax, records: list[dict]) -> None:
    """A dashed line where the sequence-length phase changes."""
    previous = records[0].get("phase") if records else None
    for record in records[1:]:
        if record.get("phase") != previous:
            ax.axvline(record["step"], color="grey", linestyle="--", linewidth=0.8)
            ax.text(
                record["step"],
                0.98,
                f" {record.get('phase')}",
                transform=ax.get_xaxis_transform(),
                va="top",
                fontsize=8,
            )
            previous = record.get("phase")


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
    ax.set_ylabel("validation score x 100 (accuracy: %)\nmedian over seeds")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    _save(fig, path)
    return True


def plot_learning_curves(tasks: Mapping[str, dict], path: str) -> bool:
    """Per task with a learning curve (train_fractions), its primary validation metric
    against the share of training examples (log axis): each model's median over seeds as a
    line, its min-max over seeds as a band, the majority-class floor dotted. False (and
    nothing written) when no task has one."""
    curves = {name: t["learning_curve"] for name, t in tasks.items() if t.get("learning_curve")}
    if not curves:
        return False
    fig = Figure(figsize=(4.6 * len(curves), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(curves)))
    for ax, (name, curve) in zip(axes, curves.items()):
        points, factor = curve["points"], scale(curve["metric"])
        fractions = np.array([p["fraction"] for p in points])
        for model in ("teacher", tasks[name].get("subject", "pretrained"), "random_init"):
            if not all(model in p for p in points):
                continue
            median, low, high = (
                np.array([_number(p[model].get(k)) * factor for p in points]) for k in ("median", "min", "max")
            )
            (line,) = ax.plot(fractions, median, "o-", linewidth=1.4, markersize=4, label=model.replace("_", " "))
            ax.fill_between(fractions, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        floors = [p["majority"] for p in points if p.get("majority") is not None]
        if floors:
            ax.axhline(floors[-1] * factor, color="grey", linestyle=":", linewidth=1.0, label="majority class")
        ax.set_xscale("log")
        ax.set_xticks(fractions, [f"{100 * f:g}%" for f in fractions])
        ax.minorticks_off()
        ax.set_xlabel("share of the training examples")
        ax.set_ylabel(f"validation {curve['metric']} x 100\nmedian over seeds, band: min-max")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else np.nan
