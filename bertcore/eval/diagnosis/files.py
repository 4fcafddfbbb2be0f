"""A diagnosis as files in a local folder: diagnosis.md (report.py), diagnosis.json (every
finding with its figures), the tables as tab-separated files with a header line, and the
plots (matplotlib `Figure` on the Agg canvas, never pyplot):

    diagnosis.json       task, model, evaluation split, findings worst first, fits, timings (strict JSON)
    suspect_labels.tsv   row, given, predicted, score, flagged, text: every training row, most suspect first
                         (row: 0-based among the training file's examples, header and blank lines not counted)
    leaked_rows.tsv      split, row, train_row, similarity, text
    lr_sweep.tsv         learning_rate, score, first_train_loss, last_train_loss
    loss_curve.tsv       epoch, train_loss, evaluation_loss, score
    confusion.tsv        given class per line, predicted class per column (kinds with classes)
    per_class.tsv        class, support, predicted, precision, recall, f1
    worst_examples.tsv   row, given, predicted, loss, text, view (row: of the validation file, or of the
                         training file for a cross-validated task)
    lr_sweep.png, loss_curve.png, confusion.png

Texts are written on one line (tabs and line breaks as spaces).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from bertcore.eval.diagnosis.report import render_markdown
from bertcore.eval.diagnosis.run import Diagnosis
from bertcore.eval.scores import json_dumps


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return " ".join(str(value).split())


def _tsv(path: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\t".join(header) + "\n")
        for row in rows:
            handle.write("\t".join(_cell(v) for v in row) + "\n")


def to_json(diagnosis: Diagnosis) -> dict:
    return {
        "task": diagnosis.task,
        "kind": diagnosis.kind,
        "metric": diagnosis.metric,
        "model": diagnosis.model,
        "evaluated_on": diagnosis.evaluated_on,
        "findings": [f.to_json() for f in diagnosis.findings],
        "suspect_score": diagnosis.suspect_score,
        "fits": diagnosis.fits,
        "timings": {k: round(v, 3) for k, v in diagnosis.timings.items()},
    }


def write(diagnosis: Diagnosis, folder: str) -> list[str]:
    """Every file of the diagnosis in `folder` (created); returns their names."""
    os.makedirs(folder, exist_ok=True)
    written = []

    def table(name: str, header: Sequence[str], rows: Sequence[Sequence]) -> None:
        _tsv(os.path.join(folder, name), header, rows)
        written.append(name)

    d = diagnosis
    if d.suspects:
        table(
            "suspect_labels.tsv",
            ("row", "given", "predicted", "score", "flagged", "text"),
            [(s.row, s.given, s.predicted, s.score, s.flagged, s.text) for s in d.suspects],
        )
    table(
        "leaked_rows.tsv",
        ("split", "row", "train_row", "similarity", "text"),
        [(x.split, x.row, x.train_row, x.similarity, x.text) for x in d.leaks],
    )
    if d.sweep:
        table(
            "lr_sweep.tsv",
            ("learning_rate", "score", "first_train_loss", "last_train_loss"),
            [
                (
                    p.learning_rate,
                    p.score,
                    p.train_losses[0] if p.train_losses else None,
                    p.train_losses[-1] if p.train_losses else None,
                )
                for p in d.sweep
            ],
        )
    if d.curve is not None and d.curve.train:
        c = d.curve
        table(
            "loss_curve.tsv",
            ("epoch", "train_loss", "evaluation_loss", "score"),
            [(e + 1, c.train[e], c.evaluate[e], c.scores[e]) for e in range(len(c.evaluate))],
        )
    if d.confusion is not None:
        table(
            "confusion.tsv",
            ("given \\ predicted", *d.classes),
            [(name, *row) for name, row in zip(d.classes, d.confusion)],
        )
        table(
            "per_class.tsv",
            ("class", "support", "predicted", "precision", "recall", "f1"),
            [(r["class"], r["support"], r["predicted"], r["precision"], r["recall"], r["f1"]) for r in d.per_class],
        )
    if d.worst:
        table(
            "worst_examples.tsv",
            ("row", "given", "predicted", "loss", "text", "view"),
            [(w.row, w.given, w.predicted, w.loss, w.text, w.view) for w in d.worst],
        )
    plots = {}
    for name, draw in (("lr_sweep", _plot_sweep), ("loss_curve", _plot_curve), ("confusion", _plot_confusion)):
        if draw(d, os.path.join(folder, f"{name}.png")):
            plots[name] = f"{name}.png"
            written.append(f"{name}.png")
    with open(os.path.join(folder, "diagnosis.json"), "w", encoding="utf-8") as handle:
        handle.write(json_dumps(to_json(d)))
    written.append("diagnosis.json")
    with open(os.path.join(folder, "diagnosis.md"), "w", encoding="utf-8") as handle:
        handle.write(render_markdown(d, plots, sorted(written)))
    written.append("diagnosis.md")
    return sorted(written)


def _figure(width: float = 5.0, height: float = 3.4):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})


def _plot_sweep(d: Diagnosis, path: str) -> bool:
    """The primary metric against the learning rate (log axis), the task's rate marked."""
    from bertcore import figures

    if not d.sweep:
        return False
    fig = _figure()
    ax = fig.subplots()
    factor = figures.scale(d.metric)
    rates = [p.learning_rate for p in d.sweep]
    ax.plot(rates, [p.score * factor for p in d.sweep], marker="o")
    sweep = next((f.figures for f in d.findings if f.name == "learning_rate"), {})
    if sweep.get("task_learning_rate") is not None:
        ax.axvline(
            sweep["task_learning_rate"], color="grey", linestyle="--", linewidth=1, label="the task's learning_rate"
        )
    if sweep.get("floor") is not None:
        ax.axhline(sweep["floor"] * factor, color="tab:red", linestyle=":", linewidth=1, label="majority class")
    if sweep:
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel(figures.name(d.metric))
    ax.set_title(f"{d.task}: learning-rate sweep")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return True


def _plot_curve(d: Diagnosis, path: str) -> bool:
    """Training and evaluation loss per epoch."""
    if d.curve is None or not d.curve.train:
        return False
    fig = _figure()
    ax = fig.subplots()
    epochs = list(range(1, len(d.curve.train) + 1))
    ax.plot(epochs, d.curve.train, marker="o", label="training (mean of the epoch)")
    ax.plot(epochs[: len(d.curve.evaluate)], d.curve.evaluate, marker="o", label="evaluation split")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(f"{d.task}: loss per epoch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _plot_confusion(d: Diagnosis, path: str) -> bool:
    """The confusion matrix as counts (at most 30 classes: more do not read)."""
    import numpy as np

    if d.confusion is None or not d.classes or len(d.classes) > 30:
        return False
    matrix = np.asarray(d.confusion)
    size = 2.5 + 0.35 * len(d.classes)
    fig = _figure(size + 1, size)
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(d.classes)), d.classes, rotation=90, fontsize=8)
    ax.set_yticks(range(len(d.classes)), d.classes, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("given")
    for (i, j), value in np.ndenumerate(matrix):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=7, color="black")
    fig.colorbar(image, ax=ax)
    ax.set_title(f"{d.task}: confusion")
    _save(fig, path)
    return True
