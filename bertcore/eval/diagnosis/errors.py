"""The errors of the task's own fit (its first seed) on the evaluation split: the confusion
matrix and per-class precision, recall and F1 over the units the kind judges (a label per
example; a tag per word for tagging, so the matrix is token-level; the candidate position
for multiple choice), and the worst-scored examples with what the model predicted (a
token-level view for tagging, the predicted span for QA, the largest errors for a score)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding, not_applicable, percent, quoted
from bertcore.eval.kinds.base import Judged, TaskKind

SHOWN = 2


@dataclass(frozen=True)
class Worst:
    """One of the worst-scored evaluation examples (a line of worst_examples.tsv)."""

    row: int
    given: str
    predicted: str
    loss: float
    text: str
    view: str


def confusion(judged: Sequence[Judged], classes: int):
    """(C, C) counts over the units: rows the given class, columns the predicted one."""
    import numpy as np

    matrix = np.zeros((classes, classes), dtype=np.int64)
    for one in judged:
        if one.probabilities is None:
            continue
        for unit, given in enumerate(one.given_classes):
            matrix[given, int(one.probabilities[unit].argmax())] += 1
    return matrix


def per_class(matrix, classes: Sequence[str]) -> list[dict]:
    """Per class: support (units given it), predicted, precision, recall and F1."""
    out = []
    for k, name in enumerate(classes):
        support, predicted, right = int(matrix[k].sum()), int(matrix[:, k].sum()), int(matrix[k, k])
        precision = right / predicted if predicted else 0.0
        recall = right / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out.append(
            {
                "class": name,
                "support": support,
                "predicted": predicted,
                "precision": precision,
                "recall": recall,
                "f1": f1,
            }
        )
    return out


def worst(
    kind: TaskKind, examples: Sequence, judged: Sequence[Judged], count: int, rows: Sequence[int] | None = None
) -> list[Worst]:
    """The `count` examples with the highest loss, worst first; `rows`: each example's row
    in its file (a cross-validation fold's rows are rows of the training file)."""
    order = sorted(range(len(judged)), key=lambda i: (-judged[i].loss, i))[:count]
    return [
        Worst(
            i if rows is None else rows[i],
            judged[i].given,
            judged[i].predicted,
            judged[i].loss,
            " / ".join(kind.text_parts(examples[i])),
            judged[i].view or "",
        )
        for i in order
    ]


def errors_finding(
    kind: TaskKind,
    classes: list[str] | None,
    matrix,
    table: list[dict],
    worst_rows: list[Worst],
    judged: Sequence[Judged],
    evaluated_on: str,
) -> Finding:
    """What the model gets wrong: the per-class recall, the most common confusion, the worst examples."""
    shown = "; ".join(
        f"row {w.row} {quoted(w.view or w.text, 50)} given {quoted(w.given, 24)}, predicted {quoted(w.predicted, 24)}"
        for w in worst_rows[:SHOWN]
    )
    if classes is None:
        if judged and judged[0].residual is not None:
            import numpy as np

            residuals = np.asarray([one.residual for one in judged])
            rmse = float(np.sqrt(np.mean(residuals**2)))
            return Finding(
                "errors",
                "note",
                f"{evaluated_on}: root mean squared error {rmse:.3g}, mean residual {float(residuals.mean()):+.3g} "
                f"(a bias when far from 0); largest: {shown}",
                figures={"rmse": rmse, "bias": float(residuals.mean())},
            )
        if not judged:
            return not_applicable("errors", f"a {kind.name} task fine-tunes nothing to make errors with")
        wrong = sum(one.loss > 0.5 for one in judged)
        return Finding(
            "errors",
            "note",
            f"{evaluated_on}: {wrong} of {len(judged)} answers with F1 below 50%; worst: {shown}",
            figures={"below_half": wrong, "examples": len(judged)},
        )
    units = int(matrix.sum())
    right = int(matrix.trace())
    supported = [row for row in table if row["support"]]
    recall = ", ".join(f"{row['class']} {figures.percent(row['recall'])}" for row in supported[:8])
    off = matrix.copy()
    for k in range(len(classes)):
        off[k, k] = 0
    given, predicted = divmod(int(off.argmax()), len(classes))
    confused = (
        f"; most confused: {int(off[given, predicted])} {classes[given]!r} predicted {classes[predicted]!r}"
        if off.max()
        else ""
    )
    what = "words" if units != len(judged) else "examples"
    text = (
        f"{evaluated_on}: {right} of {units} {what} right ({percent(right, units)}); recall per class: {recall}"
        f"{confused}; worst: {shown}"
    )
    never = [row["class"] for row in supported if row["recall"] == 0.0]
    figures_ = {"units": units, "right": right, "per_class": table, "never_right": never}
    if never:
        return Finding(
            "errors",
            "warning",
            f"the model never gets {', '.join(repr(c) for c in never[:5])} right; " + text,
            "see balance and suspect_labels; more examples of those classes, or weigh them in the loss",
            figures_,
        )
    return Finding("errors", "note", text, figures=figures_)
