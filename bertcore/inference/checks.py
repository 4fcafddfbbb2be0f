"""How close an ONNX graph runs to the PyTorch model it came from, on held-out sentences.

- fp32: the largest |difference| of each output, hidden states and token logits counted at
  real tokens only (what a padded position holds means nothing). It must stay under a
  tolerance: anything more is an export defect, not rounding.
- int8: quantization moves every number a little, so what is compared is what a user
  reads off the model: the argmax of its predictions. Which predictions:
  - with a task head, the head's: the label of each sentence (classification), the tag of
    each real token (token classification), the start and the end position of each
    window (QA). Regression has no argmax: its largest |difference| is reported;
  - without a head, when the model folder holds a masked-LM head: the predicted token at
    15% of the real (non-special) tokens, replaced by [MASK] (positions drawn with the
    export's seed). The same MLM head, in PyTorch, reads the hidden states of both
    models;
  - otherwise (an encoder alone, e.g. all-MiniLM-L6-v2): for each sentence, its nearest
    neighbour among the sample by cosine of the mean-pooled embeddings.
  Also, for every model, the cosine similarity of each sentence's mean-pooled embedding
  (int8 against PyTorch fp32): its minimum and mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertcore.inference.onnx import INPUTS

Batch = dict[str, np.ndarray]
"""input_ids, attention_mask, token_type_ids: int64 (B, T)."""


def tokenize(
    tokenizer, sentences: Sequence[str], *, max_length: int, batch_size: int, pairs: bool = False
) -> list[Batch]:
    """Sentences in their order, in batches padded to their longest member; with `pairs`,
    each sentence with the next one (the last with the first) as a text pair, token types
    0 then 1, as a head fine-tuned on pairs reads them."""
    batches = []
    for start in range(0, len(sentences), batch_size):
        firsts = list(sentences[start : start + batch_size])
        seconds = [sentences[(start + i + 1) % len(sentences)] for i in range(len(firsts))] if pairs else None
        encoded = tokenizer(
            firsts,
            seconds,
            padding=True,
            truncation=True,
            max_length=max_length,
            return_token_type_ids=True,
            return_tensors="np",
        )
        batches.append({name: encoded[name].astype(np.int64) for name in INPUTS})
    return batches


def torch_outputs(model, batches: Sequence[Batch]) -> list[dict[str, np.ndarray]]:
    """The outputs of an InferenceModel (by output name) on each batch."""
    out = []
    with torch.no_grad():
        for batch in batches:
            values = model(*(torch.from_numpy(batch[name]) for name in INPUTS))
            out.append({name: value.float().numpy() for name, value in zip(model.output_names, values)})
    return out


def onnx_outputs(session, batches: Sequence[Batch]) -> list[dict[str, np.ndarray]]:
    """The outputs of an ONNX Runtime session (by output name) on each batch."""
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, dict(batch)))) for batch in batches]


def max_differences(
    reference, got, batches: Sequence[Batch], per_token: Sequence[str] = ("last_hidden_state",)
) -> dict[str, float]:
    """{output: max |got - reference|} over every batch; the (B, T, ...) outputs named in
    `per_token` are compared at real tokens only."""
    worst: dict[str, float] = {}
    for ref, out, batch in zip(reference, got, batches):
        real = batch["attention_mask"].astype(bool)  # (B, T)
        for name, value in ref.items():
            a, b = (out[name][real], value[real]) if name in per_token else (out[name], value)
            worst[name] = max(worst.get(name, 0.0), float(np.abs(a - b).max()) if a.size else 0.0)
    return worst


def mean_pooled(outputs, batches: Sequence[Batch]) -> np.ndarray:
    """(N, H) mean of last_hidden_state over each sentence's real tokens."""
    pooled = []
    for out, batch in zip(outputs, batches):
        mask = batch["attention_mask"][..., None].astype(np.float32)  # (B, T, 1)
        pooled.append((out["last_hidden_state"] * mask).sum(1) / np.maximum(mask.sum(1), 1.0))
    return np.concatenate(pooled)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cosines(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Minimum and mean cosine similarity of matching rows (N, H)."""
    cos = (_unit(reference) * _unit(got)).sum(1)
    return {"min": round(float(cos.min()), 6), "mean": round(float(cos.mean()), 6)}


def neighbours(embeddings: np.ndarray) -> np.ndarray:
    """(N,) index of each row's nearest other row by cosine."""
    unit = _unit(embeddings)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return similarity.argmax(1)


def _labels(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return logits.argmax(-1)  # (B,)


def _tags(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return logits.argmax(-1)[mask]  # (real tokens,)


def _span(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    scores = np.where(mask[..., None], logits, -np.inf)  # (B, T, 2): padding excluded
    return scores.argmax(1).reshape(-1)  # (2B,) start and end position per window


ARGMAX = {"labels": _labels, "tags": _tags, "span": _span}
"""The predictions a head's logits make, by the head's shape (bertcore.eval.kinds.HeadShape);
a score head (regression) has none to compare."""


def task_predictions(outputs, batches: Sequence[Batch], head_shape: str) -> np.ndarray:
    """The argmax predictions of a task head's logits, flattened (see the module docstring)."""
    argmax = ARGMAX[head_shape]
    return np.concatenate(
        [argmax(out["logits"], batch["attention_mask"].astype(bool)) for out, batch in zip(outputs, batches)]
    )


def mask_tokens(
    batches: Sequence[Batch], rng: np.random.Generator, mask_id: int, special_ids: Sequence[int], rate: float = 0.15
):
    """Copies of the batches with `rate` of each sentence's real non-special tokens (at
    least one) replaced by `mask_id`, and per batch the (rows, columns) replaced."""
    masked, positions = [], []
    for batch in batches:
        ids = batch["input_ids"].copy()
        candidates = (batch["attention_mask"] == 1) & ~np.isin(ids, list(special_ids))
        rows, cols = [], []
        for row in range(ids.shape[0]):
            where = np.flatnonzero(candidates[row])
            if where.size:
                chosen = np.sort(rng.choice(where, size=max(1, round(rate * where.size)), replace=False))
                rows += [row] * chosen.size
                cols += chosen.tolist()
        ids[rows, cols] = mask_id
        masked.append({**batch, "input_ids": ids})
        positions.append((np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)))
    return masked, positions


def mlm_predictions(mlm_head, outputs, positions) -> np.ndarray:
    """The MLM head's argmax token at the masked positions, from last_hidden_state."""
    picked = []
    with torch.no_grad():
        for out, (rows, cols) in zip(outputs, positions):
            hidden = torch.from_numpy(out["last_hidden_state"][rows, cols])  # (M, H)
            picked.append(mlm_head(hidden).argmax(-1).numpy())
    return np.concatenate(picked)


def agreement(reference: np.ndarray, got: np.ndarray) -> dict[str, float | int]:
    """Share of equal predictions and how many were compared."""
    return {
        "agreement": round(float((reference == got).mean()), 6) if reference.size else None,
        "compared": int(reference.size),
    }
