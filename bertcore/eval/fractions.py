"""Learning curves over the share of labelled examples (`train_fractions`): nested,
seeded subsets of a fit's training examples.

One keyed draw orders a fit's examples so that every prefix is a sample of them; the
subset for fraction f is the first round(f x n), put back in file order. So the 1%
subset lies inside the 10% one, which lies inside the whole, and the whole (f = 1.0) is
the file as it is. For classification the order is stratified: its first entries hold
one example of each label, so no label goes missing from a subset of at least as many
examples as labels, and after them each place goes to the label furthest below its share
of the places so far, so a prefix keeps the file's label proportions as closely as those
first places allow (with two labels, to within one example). The draw is
keyed by (run seed, task, fit: "full" or "fold<k>"), never by the fine-tuning seed, the
model or the worker, so pretrained and random init, and every seed, see the same subset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bertcore.eval.config import TaskConfig
from bertcore.eval.readers import TaskDataError
from bertcore.eval.tasks import fold_splits, infer_labels, read_split
from bertcore.rng import keyed_numpy


def subset_size(fraction: float, n: int) -> int:
    """Examples a fraction of n keeps: round(fraction x n), halves up; all of them at 1.0."""
    return n if fraction >= 1.0 else int(math.floor(fraction * n + 0.5))


def nested_order(labels: Sequence[object] | None, n: int, rng: np.random.Generator) -> list[int]:
    """A permutation of range(n) whose every prefix is a sample; `labels` (one per example,
    classification) makes it stratified, None a plain shuffle."""
    if labels is None:
        return [int(i) for i in rng.permutation(n)]
    groups: dict[object, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    names = sorted(groups, key=str)
    queues = {name: [groups[name][j] for j in rng.permutation(len(groups[name]))] for name in names}
    order = [queues[names[j]][0] for j in rng.permutation(len(names))]  # one of each label first
    taken = dict.fromkeys(names, 1)
    rank = {name: i for i, name in enumerate(names)}
    while len(order) < n:
        k = len(order) + 1
        # the label furthest below its share of the first k places (ties: the first name)
        name = max(
            (m for m in names if taken[m] < len(queues[m])), key=lambda m: (len(queues[m]) * k / n - taken[m], -rank[m])
        )
        order.append(queues[name][taken[name]])
        taken[name] += 1
    return order


def fraction_subset(examples: Sequence, fraction: float, task: TaskConfig, seed: int, fit: str) -> list:
    """The examples a fit trains on at `fraction`, in file order (all of them at 1.0).
    seed: the run seed; fit: "full" or "fold<k>"."""
    if fraction >= 1.0:
        return list(examples)
    labels = [e.label for e in examples] if task.kind.stratified else None
    order = nested_order(labels, len(examples), keyed_numpy(seed, task.name, fit, "train-fraction"))
    return [examples[i] for i in sorted(order[: subset_size(fraction, len(examples))])]


def check_fractions(task: TaskConfig, key: str) -> None:
    """Before any job starts: every fraction leaves each fit at least one example per label
    (classification; one example otherwise), and one more to hold out with early
    stopping, else a TaskDataError naming `key` (e.g. evaluate.tasks[2].train_fractions)."""
    if task.train_fractions == [1.0]:
        return
    examples = read_split(task, "train").examples
    labels = infer_labels(task, examples) if task.kind.stratified else []
    pools = [len(examples)]
    if task.cross_validation_folds is not None:
        pools = [len(fit) for fit, _ in fold_splits(task, examples)] + (
            [len(examples)] if task.test is not None else []
        )
    need = max(1, len(labels)) + (1 if task.early_stopping_patience is not None else 0)
    for fraction in task.train_fractions:
        kept, n = min((subset_size(fraction, n), n) for n in pools)
        if kept < need:
            of = f"{n} training examples" + (" of a fold" if task.cross_validation_folds is not None else "")
            what = f"its {len(labels)} labels" if labels else "the 1 example a fit needs"
            held = " plus 1 held out for early stopping" if task.early_stopping_patience is not None else ""
            raise TaskDataError(
                f"{key}: {fraction:g} of task {task.name!r}'s {of} keeps {kept}, fewer than {what}{held}; "
                f"use fractions of at least {_ceil2(need / n):g} ({need} examples)"
            )


def _ceil2(value: float) -> float:
    """`value` rounded up to two significant digits (a fraction safe to suggest)."""
    scale = 10 ** (1 - math.floor(math.log10(value)))
    return math.ceil(value * scale - 1e-9) / scale
