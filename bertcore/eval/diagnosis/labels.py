"""Suspect labels: every training row judged by a model that never trained on it (k-fold
fine-tuning: each fold's rows predicted by the model fine-tuned on the other folds), ranked
by how little that model believes the given label.

- Kinds with classes (classification, tagging, multiple choice): the label-quality score of
  a unit is its self-confidence, the out-of-fold probability of the given class (cleanlab's
  `get_label_quality_scores` default, written here as the plain probability so the ranking
  needs no library); a tagged sentence scores its least likely word. Which rows are likely
  mislabelled, rather than merely hard, is confident learning's call (Northcutt et al.
  2021): cleanlab's `find_label_issues` over the same probabilities (per-class thresholds,
  pruned by the estimated noise rate), a sentence counting when any of its words does.
  Without cleanlab installed (the `diagnose` extra) the ranking stands and the count is
  left out, saying so. A weak model flags many rows it is merely unsure of, so how grave the
  finding is counts the flagged rows whose given label it gives at most 20%.
- Regression: the out-of-fold residual (prediction minus given score), largest first; a
  row counts when it lies more than 3 robust standard deviations (1.4826 x the median
  absolute residual) from the rest.
- QA: the F1 of the out-of-fold predicted span against the given answers, lowest first;
  nothing is counted (a weak reader misses many right answers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding, percent, quoted
from bertcore.eval.kinds.base import Judged, TaskKind

OUTLIER_SIGMAS = 3.0
"""Robust standard deviations beyond which an out-of-fold residual counts (regression)."""
CONTRADICTED = 0.2
"""A flagged row whose given label the out-of-fold model gives at most this probability is
contradicted with confidence: the severity counts those (a weak model flags many rows it is
merely unsure of)."""
SHOWN = 3


@dataclass(frozen=True)
class Suspect:
    """One training row as the out-of-fold model judged it (a line of suspect_labels.tsv)."""

    row: int
    given: str
    predicted: str
    score: float
    """Label quality (the probability of the given label), the residual, or the span's F1."""
    flagged: bool | None
    """Likely mislabelled (confident learning, or a residual outlier); None where not counted."""
    text: str


def self_confidence(judged: Judged) -> float:
    """The probability of the given class, the least of the example's units (1.0 without units)."""
    if judged.probabilities is None or not judged.given_classes:
        return 1.0
    return float(min(judged.probabilities[u, c] for u, c in enumerate(judged.given_classes)))


def confident_learning(judged: Sequence[Judged]) -> list[bool] | None:
    """Per example, whether cleanlab's `find_label_issues` flags any of its units; None
    without cleanlab. Classes no unit is given are left out (cleanlab's thresholds are per
    given class), the rest of each unit's probabilities renormalised."""
    try:
        from cleanlab.filter import find_label_issues
    except ImportError:
        return None
    import numpy as np

    units = [(i, c, one.probabilities[u]) for i, one in enumerate(judged) for u, c in enumerate(one.given_classes)]
    if not units:
        return [False] * len(judged)
    present = sorted({c for _, c, _ in units})
    if len(present) < 2:
        return [False] * len(judged)
    column = {c: k for k, c in enumerate(present)}
    labels = np.asarray([column[c] for _, c, _ in units])
    probabilities = np.stack([p[present] for _, _, p in units])
    probabilities = probabilities / np.clip(probabilities.sum(1, keepdims=True), 1e-12, None)
    # n_jobs=1: cleanlab otherwise forks a multiprocessing.Pool from a process that holds
    # torch's and Prefect's threads, and a forked child can wait forever on a lock one of
    # them held (seen in CI: the pool's join never returned). The rows are few; one core is enough.
    issues = find_label_issues(labels, probabilities, filter_by="prune_by_noise_rate", n_jobs=1)
    flagged = [False] * len(judged)
    for (i, _, _), issue in zip(units, issues):
        flagged[i] = flagged[i] or bool(issue)
    return flagged


def rank(kind: TaskKind, examples: Sequence, judged: Sequence[Judged]) -> tuple[list[Suspect], str]:
    """The training rows, most suspect first, and what their score is."""
    import numpy as np

    texts = [" / ".join(kind.text_parts(e)) for e in examples]
    if any(one.residual is not None for one in judged):
        residuals = np.asarray([one.residual for one in judged], dtype=float)
        sigma = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
        out = [
            Suspect(i, one.given, one.predicted, float(one.residual), bool(abs(r) > OUTLIER_SIGMAS * sigma), texts[i])
            for i, (one, r) in enumerate(zip(judged, residuals - np.median(residuals)))
        ]
        return sorted(out, key=lambda s: -abs(s.score)), "out-of-fold residual (prediction - given)"
    if not any(one.given_classes for one in judged):  # spans: 1 - loss is the F1
        out = [Suspect(i, one.given, one.predicted, 1.0 - one.loss, None, texts[i]) for i, one in enumerate(judged)]
        return sorted(out, key=lambda s: s.score), "out-of-fold F1 of the predicted span"
    flagged = confident_learning(judged)
    out = [
        Suspect(i, one.given, one.predicted, self_confidence(one), None if flagged is None else flagged[i], texts[i])
        for i, one in enumerate(judged)
    ]
    return sorted(out, key=lambda s: (s.score, s.row)), "label quality: out-of-fold probability of the given label"


def suspect_finding(
    kind: TaskKind,
    ranked: list[Suspect],
    method: str,
    folds: int,
    fold_score: float | None,
    floor: float | None,
    margin: float = 0.01,
) -> Finding:
    """What the ranking says: how many rows are likely mislabelled, with the worst quoted.
    fold_score: the out-of-fold models' primary metric (mean over folds); floor: the
    training file's majority-class score, which the models must beat by `margin` (twice
    the score's standard error) before their suspicions mean anything."""
    metric = kind.primary_metric
    n = len(ranked)
    counted = [s for s in ranked if s.flagged]
    shown = "; ".join(
        f"row {s.row} {quoted(s.text, 40)} given {quoted(s.given, 24)}, predicted {quoted(s.predicted, 24)} "
        f"({_score_text(method, s.score)})"
        for s in ranked[:SHOWN]
    )
    how = f"{folds}-fold out-of-fold predictions, {figures.name(metric)} {figures.metric(metric, fold_score)}"
    figures_ = {
        "rows": n,
        "flagged": len(counted) if ranked and ranked[0].flagged is not None else None,
        "folds": folds,
        "fold_score": fold_score,
        "metric": metric,
        "score": method,
        "top": [s.row for s in ranked[:20]],
    }
    advice = "read suspect_labels.tsv from the top; relabel or drop the rows that are wrong"
    if fold_score is not None and floor is not None and fold_score <= floor + max(margin, 0.01):
        return Finding(
            "suspect_labels",
            "note",
            f"the out-of-fold models score {figures.metric(metric, fold_score)}, not clearly above the majority class "
            f"({figures.metric(metric, floor)}), so their suspicions say little ({how}); most suspect: {shown}",
            "fix what keeps the model at the majority class first, then diagnose again",
            figures_,
        )
    if not ranked:
        return Finding("suspect_labels", "ok", "no training rows to judge", figures=figures_)
    if ranked[0].flagged is None:
        missing = "" if "span" in method else "; install bertpipe[diagnose] (cleanlab) to count the likely mislabelled"
        return Finding(
            "suspect_labels", "note", f"ranked by {method} ({how}); lowest: {shown}{missing}", advice, figures_
        )
    what = "residuals beyond 3 robust standard deviations" if "residual" in method else "likely mislabelled"
    who = "" if "residual" in method else "cleanlab's confident learning flags "
    share = percent(len(counted), n)
    text = f"{who}{len(counted)} of {n} training rows ({share}) as {what} ({how}); most suspect: {shown}"
    if not counted:
        return Finding("suspect_labels", "ok", text, figures=figures_)
    if "residual" in method:
        return Finding("suspect_labels", "problem" if len(counted) >= 0.05 * n else "warning", text, advice, figures_)
    sure = [s for s in counted if s.score <= CONTRADICTED]
    figures_["contradicted"] = len(sure)
    if not sure:  # a weak model's doubts: as likely its own errors as wrong labels
        return Finding(
            "suspect_labels",
            "note",
            text + f"; none of them is contradicted with confidence (the given label at most {CONTRADICTED:.0%}), so "
            "they are as likely the model's errors as wrong labels",
            advice,
            figures_,
        )
    text += f"; {len(sure)} are contradicted with confidence (the given label at most {CONTRADICTED:.0%})"
    return Finding("suspect_labels", "problem" if len(sure) >= 0.05 * n else "warning", text, advice, figures_)


def _score_text(method: str, score: float) -> str:
    if "residual" in method:
        return f"residual {score:+.3g}"
    if "span" in method:
        return f"F1 {figures.percent(score)}"
    return f"p(given) {score:.2f}"
