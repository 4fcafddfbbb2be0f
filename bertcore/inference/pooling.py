"""Sentence vectors from an encoder's last hidden states, in NumPy, as the evaluate stage
pools them (bertcore/eval/embeddings.py): "cls" is the state at [CLS], "mean" the mean
over the real tokens (special tokens included); a long text read in windows gets one
vector from its windows' vectors (mean, element-wise max or the first window's, as
bertcore/eval/windows.py pools them). `best_pooling` reads which of the two the
evaluation found better for a model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

DEFAULT_POOLING = "mean"


def pool(hidden: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """(B, H) from hidden states (B, T, H) and the attention mask (B, T)."""
    if how == "cls":
        return hidden[:, 0]
    weights = mask[..., None].astype(hidden.dtype)  # (B, T, 1)
    return (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1.0)


def pool_windows(vectors: np.ndarray, how: str) -> np.ndarray:
    """(H,) from the (W, H) vectors of one text's windows."""
    if how == "first":
        return vectors[0]
    if how == "max":
        return vectors.max(0)
    return vectors.mean(0)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def best_pooling(scores: Mapping[str, Mapping[str, float]] | None) -> tuple[str, str]:
    """(pooling, why) from the evaluate stage's embedding scores of one model,
    {"cls": {"anisotropy", "sts_spearman"?}, "mean": {...}}: the higher STS Spearman when
    both have one, else the lower anisotropy; DEFAULT_POOLING without scores."""
    if not scores or not all(isinstance(scores.get(p), Mapping) for p in ("cls", "mean")):
        return DEFAULT_POOLING, "the evaluation has no embedding scores for this model"
    cls, mean = scores["cls"], scores["mean"]
    if cls.get("sts_spearman") is not None and mean.get("sts_spearman") is not None:
        best = "cls" if cls["sts_spearman"] > mean["sts_spearman"] else "mean"
        return (
            best,
            (
                f"evaluate: STS Spearman {mean['sts_spearman']:.3f} with mean pooling, "
                f"{cls['sts_spearman']:.3f} with [CLS]"
            ),
        )
    if cls.get("anisotropy") is not None and mean.get("anisotropy") is not None:
        best = "cls" if cls["anisotropy"] < mean["anisotropy"] else "mean"
        return (
            best,
            (
                f"evaluate: anisotropy {mean['anisotropy']:.3f} with mean pooling, {cls['anisotropy']:.3f} with "
                "[CLS] (no STS file; lower is better)"
            ),
        )
    return DEFAULT_POOLING, "the evaluation's embedding scores are incomplete"
