"""Optimisation: a learning-rate sweep and the loss curves of the task's own settings.

The sweep fine-tunes the task with the task's settings (epochs, batch size, schedule, seed)
at each learning rate of a fixed log-spaced grid, 1e-5 to 1e-3 in half decades, plus the
task's own, and scores each on the evaluation split. A fixed grid, not a search: five or six
points of a short budget are what fit in minutes on a CPU, and an evenly spaced curve is
what a reader can judge (a sampler such as Optuna's chooses uneven points to find one
optimum, which a handful of trials cannot). The best range is every rate within the
tolerance (the seed spread, at least one point) of the best score; the task's rate is too
high or too low when it lies outside that range.

The loss curves are the task's own fit (its first seed): the mean training loss of each
epoch and the loss and score on the evaluation split after each epoch (which training never
sees; early stopping, when set, chooses on a held-out part of the training file).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding

GRID = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
"""The sweep's learning rates (half decades from 1e-5 to 1e-3); the task's own is added."""
TOLERANCE = 0.01
"""The least distance from the best score (one point) that still counts as the best range."""
STALLED = 0.95
"""Training loss at the last epoch above this share of the first epoch's: it barely moved."""
RISE = 1.05
RISE_ABSOLUTE = 0.02
"""Evaluation loss this many times its lowest by the last epoch, and this much above it: overfitting."""


def rates(task_lr: float, grid: Sequence[float] = GRID) -> list[float]:
    """The grid and the task's learning rate, in increasing order (a grid point within 1% of
    the task's rate is the task's)."""
    out = [lr for lr in grid if abs(lr - task_lr) > 0.01 * task_lr]
    return sorted([*out, task_lr])


@dataclass
class SweepPoint:
    learning_rate: float
    score: float
    """The primary metric on the evaluation split."""
    train_losses: list[float] = field(default_factory=list)
    """Mean training loss per epoch."""

    @property
    def moved(self) -> str:
        """`0.693 -> 0.412`: the training loss from the first epoch to the last."""
        if not self.train_losses:
            return "-"
        return f"{figures.loss(self.train_losses[0])} -> {figures.loss(self.train_losses[-1])}"

    @property
    def diverged(self) -> bool:
        """The training loss went non-finite, or did not fall from the first epoch to the last."""
        losses = self.train_losses
        return not all(math.isfinite(x) for x in losses) or (len(losses) > 1 and losses[-1] >= losses[0])


def _lr(value: float) -> str:
    return f"{value:.0e}".replace("e-0", "e-") if value < 0.01 else f"{value:g}"


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else -math.inf


def noise(metric: str, score: float | None, n: int) -> float:
    """How far a score on `n` evaluation units moves by chance alone (one standard error):
    sqrt(p(1 - p) / n) for a share such as accuracy, (1 - r^2) / sqrt(n - 3) for a correlation."""
    from bertcore.figures import is_correlation

    if score is None or not math.isfinite(score) or n < 4:
        return TOLERANCE
    if is_correlation(metric):
        return (1 - min(score * score, 1.0)) / math.sqrt(n - 3)
    return math.sqrt(max(score * (1 - score), 0.0) / n)


def sweep_finding(
    points: list[SweepPoint],
    task_lr: float,
    metric: str,
    tolerance: float,
    floor: float | None,
    seed_points: Sequence[SweepPoint] = (),
) -> Finding:
    """Where the task's learning rate lies against the best range of the sweep (every rate
    within `tolerance` of the best, one seed each). `seed_points`: the task's rate with each
    of its seeds; a seed that diverges there while a lower rate learns makes it too high too."""
    tolerance = max(tolerance, TOLERANCE)
    best = max(points, key=lambda p: _finite(p.score))
    good = [p for p in points if _finite(p.score) >= _finite(best.score) - tolerance]
    low, high = min(p.learning_rate for p in good), max(p.learning_rate for p in good)
    mine = next(p for p in points if p.learning_rate == task_lr)
    curve = ", ".join(f"{_lr(p.learning_rate)} {figures.metric(metric, p.score)}" for p in points)
    span = _lr(low) if low == high else f"{_lr(low)} to {_lr(high)}"
    figures_ = {
        "metric": metric,
        "task_learning_rate": task_lr,
        "best_learning_rate": best.learning_rate,
        "best_range": [low, high],
        "tolerance": tolerance,
        "floor": floor,
        "points": [
            {"learning_rate": p.learning_rate, "score": p.score, "train_losses": p.train_losses} for p in points
        ],
        "task_rate_seeds": [{"score": p.score, "train_losses": p.train_losses} for p in seed_points],
    }
    name = figures.name(metric)
    if floor is not None and _finite(best.score) <= floor + tolerance:
        return Finding(
            "learning_rate",
            "note",
            f"no learning rate of the sweep scores above the majority class ({figures.metric(metric, floor)}) by "
            f"more than the noise ({figures.points(tolerance)} points): {curve} {name}; the cause lies elsewhere",
            figures=figures_,
        )
    unstable = [p for p in seed_points if p.diverged and _finite(p.score) < _finite(best.score) - tolerance]
    if task_lr <= high and unstable and task_lr >= best.learning_rate and task_lr > low:
        worst = min(unstable, key=lambda p: _finite(p.score))
        return Finding(
            "learning_rate",
            "warning",
            f"learning_rate {_lr(task_lr)} is too high for some seeds: {len(unstable)} of {len(seed_points)} diverge "
            f"(one scores {figures.metric(metric, worst.score)} {name}, training loss {worst.moved}) where "
            f"{_lr(best.learning_rate)} scores {figures.metric(metric, best.score)}; best range {span} "
            f"(sweep: {curve})",
            f"set learning_rate to {_lr(best.learning_rate if best.learning_rate < task_lr else low)}",
            figures_,
        )
    at = f"{_lr(task_lr)} scores {figures.metric(metric, mine.score)} {name} (training loss {mine.moved})"
    where = f"{_lr(best.learning_rate)} scores {figures.metric(metric, best.score)}"
    if task_lr > high:
        stuck = mine.diverged or (floor is not None and _finite(mine.score) <= floor + TOLERANCE)
        stuck = stuck or any(p.diverged for p in seed_points)
        return Finding(
            "learning_rate",
            "problem" if stuck else "warning",
            f"learning_rate {_lr(task_lr)} is too high: {at} where {where}; best range {span} (sweep: {curve})",
            f"set learning_rate to {_lr(best.learning_rate)}",
            figures_,
        )
    if task_lr < low:
        return Finding(
            "learning_rate",
            "warning",
            f"learning_rate {_lr(task_lr)} is too low: {at} where {where}; best range {span} (sweep: {curve})",
            f"set learning_rate to {_lr(best.learning_rate)}, or train more epochs",
            figures_,
        )
    return Finding(
        "learning_rate",
        "ok",
        f"learning_rate {_lr(task_lr)} lies in the best range {span} (within {figures.points(tolerance)} points of "
        f"the best; sweep: {curve} {name})",
        figures=figures_,
    )


@dataclass
class Curve:
    """The task's own fit, epoch by epoch."""

    train: list[float]
    """Mean training loss per epoch."""
    evaluate: list[float]
    """Loss on the evaluation split after each epoch."""
    scores: list[float]
    """The primary metric on the evaluation split after each epoch."""
    best_epoch: int | None = None
    """The epoch early stopping kept (1-based), when the task stops early."""


def curve_findings(
    curve: Curve, metric: str, tolerance: float, patience: int | None, floor: float | None = None
) -> list[Finding]:
    """The loss curve (overfitting, underfitting) and the epoch to stop at; `tolerance`: the
    noise of one score, `floor`: the majority-class score."""
    train, evaluate, scores = curve.train, curve.evaluate, curve.scores
    epochs = len(train)
    figures_ = {"train_loss": train, "evaluate_loss": evaluate, "scores": scores, "metric": metric}
    if epochs < 2:
        one = Finding("loss_curve", "note", "one epoch: no curve to read", "train 2 or more epochs", figures_)
        return [one, _stopping(curve, metric, tolerance, patience, floor)]
    lowest = min(range(epochs), key=lambda e: evaluate[e])
    shape = (
        f"training loss {figures.loss(train[0])} -> {figures.loss(train[-1])}, evaluation loss "
        f"{figures.loss(evaluate[0])} -> {figures.loss(evaluate[-1])} (lowest {figures.loss(evaluate[lowest])} at "
        f"epoch {lowest + 1}) over {epochs} epochs"
    )
    rose = evaluate[-1] > RISE * evaluate[lowest] and evaluate[-1] - evaluate[lowest] > RISE_ABSOLUTE
    if lowest < epochs - 1 and rose and train[-1] < train[lowest]:
        fell = _finite(scores[-1]) < max(_finite(s) for s in scores) - tolerance
        found = Finding(
            "loss_curve",
            "warning" if fell else "note",
            f"overfitting after epoch {lowest + 1}: {shape}"
            + ("" if fell else f"; the {figures.name(metric)} did not fall with it (the model grew overconfident)"),
            f"stop at epoch {lowest + 1} (epochs: {lowest + 1}, or early_stopping_patience: 1), or raise dropout or "
            "weight_decay",
            figures_,
        )
    elif lowest < epochs - 1 and rose:
        found = Finding(
            "loss_curve",
            "warning",
            f"unstable: the evaluation loss rose after epoch {lowest + 1} while the training loss did not fall below "
            f"that epoch's ({figures.loss(train[lowest])}) ({shape})",
            "lower the learning rate (see learning_rate)",
            figures_,
        )
    elif train[-1] >= train[0]:
        found = Finding(
            "loss_curve",
            "warning",
            f"diverging: the training loss rose ({shape})",
            "lower the learning rate (see learning_rate)",
            figures_,
        )
    elif train[-1] > STALLED * train[0]:
        found = Finding(
            "loss_curve",
            "warning",
            f"underfitting: the training loss barely moved ({shape})",
            "raise the learning rate (see learning_rate) or train more epochs",
            figures_,
        )
    elif lowest == epochs - 1 and evaluate[-2] - evaluate[-1] > 0.05 * evaluate[-2]:
        found = Finding(
            "loss_curve",
            "note",
            f"still learning at the last epoch: {shape}",
            "train more epochs",
            figures_,
        )
    else:
        found = Finding("loss_curve", "ok", shape, figures=figures_)
    return [found, _stopping(curve, metric, tolerance, patience, floor)]


def _stopping(curve: Curve, metric: str, tolerance: float, patience: int | None, floor: float | None) -> Finding:
    scores = curve.scores
    epochs = len(scores)
    best = max(range(epochs), key=lambda e: _finite(scores[e]))
    figures_ = {"best_epoch": best + 1, "epochs": epochs, "early_stopping_epoch": curve.best_epoch}
    per_epoch = ", ".join(figures.metric(metric, s) for s in scores)
    if patience is not None:
        kept = curve.best_epoch
        return Finding(
            "early_stopping",
            "note",
            f"early stopping (patience {patience}) kept epoch {kept} of the {epochs} it ran, chosen on a held-out "
            f"part of the training file; on the evaluation split the best epoch is {best + 1} ({per_epoch} "
            f"{figures.name(metric)})",
            figures=figures_,
        )
    lost = _finite(scores[best]) - _finite(scores[-1])
    if floor is not None and _finite(scores[best]) <= floor + max(tolerance, TOLERANCE):
        return Finding(
            "early_stopping",
            "note",
            f"no epoch scores above the majority class ({figures.metric(metric, floor)}) by more than the noise "
            f"({figures.points(max(tolerance, TOLERANCE))} points): {per_epoch} {figures.name(metric)}; no epoch to "
            "stop at",
            figures=figures_,
        )
    if best < epochs - 1 and lost > max(tolerance, TOLERANCE):
        return Finding(
            "early_stopping",
            "warning",
            f"the best epoch on the evaluation split is {best + 1} of {epochs}: training on cost "
            f"{figures.points(lost)} points ({per_epoch} {figures.name(metric)})",
            "set early_stopping_patience: 1 (it chooses on a held-out part of the training file), or epochs: "
            f"{best + 1}",
            figures_,
        )
    return Finding(
        "early_stopping",
        "ok",
        f"the best epoch on the evaluation split is {best + 1} of {epochs} ({per_epoch} {figures.name(metric)}); "
        f"the last is within the noise ({figures.points(max(tolerance, TOLERANCE))} points) of it",
        figures=figures_,
    )
