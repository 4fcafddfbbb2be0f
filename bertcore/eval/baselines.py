"""What a model that learned nothing scores, so every number in the report has a floor
beside it.

- Tasks: the majority class (always predict the training data's most frequent label) and
  chance (uniform random guessing: accuracy 1/C, correlation 0), each kind's own
  (bertcore/eval/kinds/: `majority`, `chance`) with `most_frequent` from here.
- Masked LM: the unigram predictor, which always guesses the most frequent token and
  scores each target by its frequency in the training sequences. A freshly trained BERT
  first learns exactly this ("the unigram plateau"): held-out accuracy near the share of
  the most frequent token and a loss near the unigram entropy. Leaving it means using the
  context.
- Next-sentence prediction: the share of the majority label among the held-out pairs; an
  NSP accuracy at that level is the label balance, not a skill.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np


def most_frequent(values: Iterable):
    """The most frequent value; ties go to the smallest (sorted first), so the choice is
    the same on every run."""
    counts = Counter(values)
    if not counts:
        raise ValueError("most_frequent: no values")
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def target_counts(
    batches: Iterable, vocab_size: int, special_ids: Iterable[int] = (), max_rows: int | None = None
) -> np.ndarray:
    """(V,) int64 counts of MLM targets in examples record batches (Arrow): the stored
    `masked_ids` (static masking), or every non-special token of `input_ids` when masks
    are drawn at training time (the targets are drawn from those uniformly). At most
    `max_rows` sequences are read."""
    import pyarrow.compute as pc

    counts = np.zeros(vocab_size, dtype=np.int64)
    rows = 0
    for batch in batches:
        if max_rows is not None and rows >= max_rows:
            break
        batch = batch if max_rows is None else batch.slice(0, max_rows - rows)
        rows += batch.num_rows
        targets = pc.list_flatten(batch.column("masked_ids")).to_numpy(zero_copy_only=False)
        if targets.size == 0:
            targets = pc.list_flatten(batch.column("input_ids")).to_numpy(zero_copy_only=False)
        counts += np.bincount(targets.astype(np.int64), minlength=vocab_size)[:vocab_size]
    counts[list(special_ids)] = 0
    return counts


class UnigramMeter:
    """Scores held-out MLM targets with the unigram predictor of `counts` (training token
    counts): accuracy of always guessing the most frequent token, and the cross-entropy of
    the add-one smoothed unigram distribution."""

    def __init__(self, counts: np.ndarray) -> None:
        counts = np.asarray(counts, dtype=np.float64)
        self.token = int(np.argmax(counts))
        self.log_probs = np.log((counts + 1.0) / (counts.sum() + len(counts)))
        self.correct = 0
        self.loss_sum = 0.0
        self.count = 0

    def update(self, targets: np.ndarray) -> None:
        targets = np.asarray(targets, dtype=np.int64).ravel()
        self.correct += int((targets == self.token).sum())
        self.loss_sum += float(-self.log_probs[targets].sum())
        self.count += int(targets.size)

    def result(self) -> dict[str, float | int]:
        if not self.count:
            return {}
        return {
            "token_id": self.token,
            "mlm_accuracy": self.correct / self.count,
            "mlm_loss": self.loss_sum / self.count,
        }


def nsp_balance(label_counts: dict[int, int]) -> dict[str, float] | None:
    """{"is_next": share of label 0 (B follows A), "random": share of 1, "majority_accuracy":
    the larger share} of held-out NSP labels; None when there are none."""
    total = label_counts.get(0, 0) + label_counts.get(1, 0)
    if not total:
        return None
    is_next, random = label_counts.get(0, 0) / total, label_counts.get(1, 0) / total
    return {"is_next": is_next, "random": random, "majority_accuracy": max(is_next, random), "pairs": total}


def spread(*summaries: dict | None) -> float | None:
    """The seed spread of a comparison: the largest max - min over seeds among the given
    summaries ({median, min, max, n}); None when no summary has two or more seeds."""
    ranges = [
        s["max"] - s["min"]
        for s in summaries
        if s and s.get("n", 0) > 1 and _finite(s.get("max")) and _finite(s.get("min"))
    ]
    return max(ranges) if ranges else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
