"""Evaluation metrics: classification, correlation, cosine similarity, entity-level tagging, SQuAD, and
held-out pretraining (MLM/NSP) scores, plus the summary over fine-tuning seeds.

Every score is a fraction in [0, 1] (or a correlation in [-1, 1]); the report multiplies
by 100 where papers do. Functions take plain sequences and return floats, so they are
equally usable from a test, a fine-tuning loop or a notebook.

scikit-learn, scipy and seqeval are imported by the functions that use them: the run
config imports this package (TaskConfig), and every CLI command loads the run config.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch

from bertcore.eval.settings import TagScheme

# --- classification and regression -------------------------------------------------------


def accuracy(y_true: Sequence, y_pred: Sequence) -> float:
    from sklearn import metrics as sk

    return float(sk.accuracy_score(y_true, y_pred))


def f1(y_true: Sequence, y_pred: Sequence, *, average: Literal["binary", "macro"] = "binary", pos_label=1) -> float:
    """Binary F1 of `pos_label`, or the unweighted mean of per-class F1 (macro). A class
    that is never predicted and never true contributes nothing (zero_division=0)."""
    from sklearn import metrics as sk

    if average == "binary":
        return float(sk.f1_score(y_true, y_pred, average="binary", pos_label=pos_label, zero_division=0))
    return float(sk.f1_score(y_true, y_pred, average="macro", zero_division=0))


def matthews(y_true: Sequence, y_pred: Sequence) -> float:
    """Matthews correlation (CoLA's metric); 0 when either side is constant."""
    from sklearn import metrics as sk

    return float(sk.matthews_corrcoef(y_true, y_pred))


def _correlation(fn, x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")  # undefined: scipy would warn and return nan as well
    return float(fn(x, y)[0])


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson r; nan when either side is constant or shorter than 2."""
    from scipy import stats

    return _correlation(stats.pearsonr, x, y)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rho (ties get average ranks); nan when either side is constant."""
    from scipy import stats

    return _correlation(stats.spearmanr, x, y)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of a[i] and b[i] for every row i; 0 where a vector is zero."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


# --- entity-level tagging ------------------------------------------------------------------


def entity_scores(
    y_true: Sequence[Sequence[str]], y_pred: Sequence[Sequence[str]], *, scheme: TagScheme = "IOB2"
) -> dict[str, float]:
    """Entity-level precision, recall and F1 (an entity counts only when its type and both
    boundaries match exactly), plus per-token accuracy.

    IOB1 (the original CoNLL-2003 files): scored the way conlleval reads chunks, where an
    I- tag after O or after another type starts an entity and B- only separates two
    adjacent entities of one type. seqeval's strict IOB1 scheme is not used: it drops an
    entity that starts with B- after O. IOB2/BIO and IOBES: strict, so a prediction whose
    entity does not open with B- (or S-) is no entity at all.
    """
    from seqeval import metrics as seqeval_metrics
    from seqeval import scheme as seqeval_scheme

    if len(y_true) != len(y_pred) or any(len(t) != len(p) for t, p in zip(y_true, y_pred)):
        raise ValueError("entity_scores: gold and predicted tag sequences differ in length")
    true, pred = [list(t) for t in y_true], [list(p) for p in y_pred]
    if scheme == "IOB1":
        kwargs: dict = {}
    else:
        kwargs = {"mode": "strict", "scheme": seqeval_scheme.IOBES if scheme == "IOBES" else seqeval_scheme.IOB2}
    tokens = sum(len(t) for t in true)
    return {
        "precision": float(seqeval_metrics.precision_score(true, pred, zero_division=0, **kwargs)),
        "recall": float(seqeval_metrics.recall_score(true, pred, zero_division=0, **kwargs)),
        "f1": float(seqeval_metrics.f1_score(true, pred, zero_division=0, **kwargs)),
        "token_accuracy": sum(a == b for t, p in zip(true, pred) for a, b in zip(t, p)) / tokens if tokens else 0.0,
    }


# --- SQuAD ---------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation, in its order: lowercase, drop ASCII punctuation, drop
    the articles a/an/the as whole words, then collapse runs of whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _gold_or_empty(golds: Sequence[str]) -> list[str]:
    # v2: answers that normalise to nothing do not count; no answer at all means the gold is "".
    kept = [g for g in golds if normalize_answer(g)]
    return kept or [""]


def _token_f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)  # a no-answer scores 1 only against a no-answer
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_exact(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    return max(float(normalize_answer(prediction) == normalize_answer(g)) for g in _gold_or_empty(golds))


def squad_f1(prediction: str, golds: Sequence[str]) -> float:
    """Bag-of-tokens F1 against the best-matching gold answer."""
    return max(_token_f1(prediction, g) for g in _gold_or_empty(golds))


def squad_scores(predictions: Mapping[str, str], golds: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1 over every question in `golds` (a missing prediction is an
    empty answer). With any unanswerable question (gold list empty) the split into
    has_answer_* and no_answer_* is reported too, as SQuAD 2.0's script does."""
    if not golds:
        raise ValueError("squad_scores: no gold questions")
    exact = {qid: squad_exact(predictions.get(qid, ""), g) for qid, g in golds.items()}
    f1s = {qid: squad_f1(predictions.get(qid, ""), g) for qid, g in golds.items()}
    out = {"exact_match": float(np.mean(list(exact.values()))), "f1": float(np.mean(list(f1s.values())))}
    has_answer = [qid for qid, g in golds.items() if _gold_or_empty(g) != [""]]
    answered = set(has_answer)
    no_answer = [qid for qid in golds if qid not in answered]
    if no_answer:
        out["no_answer_exact_match"] = float(np.mean([exact[q] for q in no_answer]))
        out["no_answer_count"] = float(len(no_answer))
        if has_answer:
            out["has_answer_exact_match"] = float(np.mean([exact[q] for q in has_answer]))
            out["has_answer_f1"] = float(np.mean([f1s[q] for q in has_answer]))
        out["has_answer_count"] = float(len(has_answer))
    return out


# --- held-out pretraining metrics ----------------------------------------------------------


class PretrainingMeter:
    """Accumulates masked-LM and next-sentence (or sentence-order) scores over held-out
    batches; `result()` gives token-weighted MLM loss, perplexity and accuracy, and NSP
    loss and accuracy. Labels follow Hugging Face: -100 marks positions that are not
    predicted."""

    def __init__(self) -> None:
        self.mlm_loss_sum = 0.0
        self.mlm_correct = 0
        self.mlm_count = 0
        self.nsp_loss_sum = 0.0
        self.nsp_correct = 0
        self.nsp_count = 0

    @torch.no_grad()
    def update(
        self,
        mlm_logits: torch.Tensor,  # (B, T, V), or (N, V) for gathered masked positions
        mlm_labels: torch.Tensor,  # (B, T) or (N,), -100 where nothing is predicted
        nsp_logits: torch.Tensor | None = None,  # (B, 2)
        nsp_labels: torch.Tensor | None = None,  # (B,), negative (-100) where the objective has no NSP
    ) -> None:
        logits = mlm_logits.reshape(-1, mlm_logits.shape[-1]).float()
        labels = mlm_labels.reshape(-1)
        keep = labels != -100
        if keep.any():
            logits, labels = logits[keep], labels[keep]
            self.mlm_loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            self.mlm_correct += int((logits.argmax(-1) == labels).sum())
            self.mlm_count += int(labels.numel())
        if nsp_logits is not None and nsp_labels is not None:
            keep = nsp_labels >= 0
            if keep.any():
                logits, labels = nsp_logits[keep].float(), nsp_labels[keep].long()
                self.nsp_loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
                self.nsp_correct += int((logits.argmax(-1) == labels).sum())
                self.nsp_count += int(labels.numel())

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.mlm_count:
            loss = self.mlm_loss_sum / self.mlm_count
            out.update(
                mlm_loss=loss, mlm_perplexity=math.exp(min(loss, 700.0)), mlm_accuracy=self.mlm_correct / self.mlm_count
            )
        if self.nsp_count:
            out.update(nsp_loss=self.nsp_loss_sum / self.nsp_count, nsp_accuracy=self.nsp_correct / self.nsp_count)
        return out


# --- over seeds ----------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of one metric over fine-tuning seeds. BERT's small GLUE tasks vary
    by several points between seeds, so the median is reported rather than the best run;
    std is the sample standard deviation (0 for a single seed). nan values (an undefined
    correlation) are left out and counted in `n_nan`."""
    arr = np.asarray(values, dtype=float)
    finite = arr[~np.isnan(arr)]
    if finite.size == 0:
        return {
            "median": float("nan"),
            "min": float("nan"),
            "max": float("nan"),
            "std": float("nan"),
            "n": 0,
            "n_nan": int(arr.size),
        }
    return {
        "median": float(np.median(finite)),
        "min": float(finite.min()),
        "max": float(finite.max()),
        "std": float(finite.std(ddof=1)) if finite.size > 1 else 0.0,
        "n": int(finite.size),
        "n_nan": int(arr.size - finite.size),
    }


def summarize_runs(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """`summarize` for every metric name found in any run ({"accuracy": {...}, ...});
    a run without a metric counts as nan for it."""
    names = sorted({name for run in runs for name in run})
    return {name: summarize([run.get(name, float("nan")) for run in runs]) for name in names}
