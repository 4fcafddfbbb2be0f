"""Sentence embeddings straight from the encoder, without fine-tuning: how anisotropic
they are, and how well their cosine similarity ranks STS sentence pairs, for [CLS] and
for mean pooling.

Anisotropy (Ethayarajh, 2019) is the mean cosine similarity of random pairs of different
sentences: near 1 means every sentence points the same way (the known weakness of raw
BERT embeddings), near 0 means directions carry information. "cls" is the last layer's
hidden state at [CLS] (not the NSP-trained pooler); "mean" averages the hidden states
of every non-padding token, special tokens included. A sentence longer than the window is
truncated, or with `long_inputs: windows` read as overlapping windows whose vectors are
pooled into one (bertcore/eval/windows.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from bertcore.eval import metrics
from bertcore.eval.config import StsConfig
from bertcore.eval.encoder import encode, load_encoder, load_tokenizer, mean_pool
from bertcore.eval.metrics import cosine_rows
from bertcore.eval.readers import ReadResult, TextExample, read_rows, score
from bertcore.eval.windows import Windowing, pool_windows, split_windows
from bertcore.rng import keyed_numpy, keyed_seed

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[Pooling, ...] = ("cls", "mean")


@torch.no_grad()
def embed(
    encoder: torch.nn.Module,
    tokenizer,
    sentences: Sequence[str],
    *,
    pooling: Pooling,
    batch_size: int = 64,
    max_seq_length: int = 128,
    windowing: Windowing | None = None,
) -> np.ndarray:
    """(N, H) float32 sentence embeddings; with `windowing`, a long sentence's windows are
    embedded each and pooled into one vector by `windowing.pool`."""
    encoder.eval()
    chunks = []
    for start in range(0, len(sentences), batch_size):
        texts = list(sentences[start : start + batch_size])
        owner = None
        if windowing is None:
            batch = tokenizer(
                texts,
                truncation=True,
                max_length=max_seq_length,
                padding=True,
                return_tensors="pt",
                return_token_type_ids=True,
            )
        else:
            windows = [split_windows(tokenizer, text, None, windowing).input_ids for text in texts]
            rows = [ids for text_windows in windows for ids in text_windows]
            ids = torch.full((len(rows), max(map(len, rows))), tokenizer.pad_token_id or 0, dtype=torch.long)
            for row, row_ids in enumerate(rows):
                ids[row, : len(row_ids)] = torch.tensor(row_ids)
            mask = (torch.arange(ids.shape[1]) < torch.tensor([len(r) for r in rows])[:, None]).long()
            batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
            owner = torch.tensor([i for i, text_windows in enumerate(windows) for _ in text_windows])
        hidden, _ = encode(
            encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        )  # (B, T, H): B windows with windowing
        pooled = hidden[:, 0] if pooling == "cls" else mean_pool(hidden, batch["attention_mask"])
        if owner is not None:
            pooled = pool_windows(pooled, owner, windowing.pool)  # (B windows, H) -> (sentences, H)
        chunks.append(pooled.float().numpy())
    return np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)


def read_sts(sts: StsConfig, path: str) -> ReadResult:
    """The sentence pairs and gold scores of an STS-style file (at local `path`)."""
    return read_rows(
        path,
        format=sts.format,
        text_a=sts.text_a,
        text_b=sts.text_b,
        label_column=sts.score_column,
        parse_label=score,
        header=sts.header,
        encoding=sts.encoding,
        on_error=sts.on_error,
    )


def anisotropy(embeddings: np.ndarray, rng: np.random.Generator, num_pairs: int = 1000) -> float:
    """Mean cosine similarity of `num_pairs` random pairs of different rows."""
    n = len(embeddings)
    if n < 2:
        raise ValueError("anisotropy needs at least two embeddings")
    first = rng.integers(0, n, size=num_pairs)
    second = (first + rng.integers(1, n, size=num_pairs)) % n  # never the same row
    return float(cosine_rows(embeddings[first], embeddings[second]).mean())


def sts_spearman(embeddings_a: np.ndarray, embeddings_b: np.ndarray, scores: Sequence[float]) -> float:
    """Spearman correlation of cosine(a_i, b_i) with the gold similarity scores (the
    unsupervised STS protocol of SBERT and SimCSE)."""
    return metrics.spearman(cosine_rows(embeddings_a, embeddings_b), scores)


def embedding_report(
    encoder_dir: str,
    tokenizer_dir: str,
    sentences: Sequence[str],
    *,
    seed: int,
    sts_pairs: Sequence[TextExample] | None = None,
    num_pairs: int = 1000,
    max_seq_length: int = 128,
    random_init: bool = False,
    num_threads: int = 1,
    windowing: Windowing | None = None,
) -> dict[str, dict[str, float]]:
    """{"cls": {"anisotropy", "sts_spearman"}, "mean": {...}} for the encoder in
    encoder_dir (or, with random_init, its architecture with seeded fresh weights).
    sts_pairs: TextExamples with text_b and a float score, e.g. STS-B read with
    readers.read_rows(..., parse_label=readers.score). windowing: read sentences longer than
    max_seq_length in windows (None: truncate them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(keyed_seed(seed, "embeddings", "init"))
            encoder = load_encoder(encoder_dir, random_init=random_init)
        report: dict[str, dict[str, float]] = {}
        for pooling in POOLINGS:
            vectors = embed(
                encoder, tokenizer, sentences, pooling=pooling, max_seq_length=max_seq_length, windowing=windowing
            )
            # Same pairs for both poolings, so the two numbers are comparable.
            entry = {"anisotropy": anisotropy(vectors, keyed_numpy(seed, "embeddings", "pairs"), num_pairs)}
            if sts_pairs:
                a = embed(
                    encoder,
                    tokenizer,
                    [p.text_a for p in sts_pairs],
                    pooling=pooling,
                    max_seq_length=max_seq_length,
                    windowing=windowing,
                )
                b = embed(
                    encoder,
                    tokenizer,
                    [p.text_b or "" for p in sts_pairs],
                    pooling=pooling,
                    max_seq_length=max_seq_length,
                    windowing=windowing,
                )
                entry["sts_spearman"] = sts_spearman(a, b, [float(p.label) for p in sts_pairs])
            report[pooling] = entry
    finally:
        torch.set_num_threads(threads)
    return report
