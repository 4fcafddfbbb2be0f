"""Word similarity: how well the encoder's word vectors rank word pairs the way people do
(WordSim-353, SimLex-999, MEN): Spearman correlation of the cosine of two words' vectors
with the human scores. Nothing is trained, so the pretrained model scores the same on
every seed; the random-init baseline differs per seed, which gives the spread.

A word's vector is either the mean of its WordPiece rows of the input embedding matrix
("input"; MLM shapes these rows through the tied output layer, so words that fit the same
contexts move together) or the encoder's hidden states for the word alone, `[CLS] word
[SEP]`, averaged over its pieces ("contextual"; the layers a TaskConfig names, summed or
concatenated).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertcore.eval import metrics
from bertcore.eval.config import TaskConfig
from bertcore.eval.embeddings import cosine_rows
from bertcore.eval.encoder import (
    hidden_states,
    layer_indexes,
    load_encoder,
    load_tokenizer,
)
from bertcore.eval.tasks import WordPair, read_split
from bertcore.rng import keyed_seed


def input_vectors(encoder: torch.nn.Module, tokenizer, words: Sequence[str]) -> np.ndarray:
    """(N, H): mean of each word's piece rows of the input embedding matrix."""
    matrix = encoder.get_input_embeddings().weight.detach().float().cpu().numpy()  # (V, H)
    pieces = tokenizer(list(words), add_special_tokens=False)["input_ids"]
    return np.stack([matrix[ids].mean(0) if ids else np.zeros(matrix.shape[1], dtype=matrix.dtype) for ids in pieces])


@torch.no_grad()
def contextual_vectors(encoder: torch.nn.Module, tokenizer, words: Sequence[str], layers, combine: str, batch_size: int = 256) -> np.ndarray:
    """(N, H) or (N, k*H): the word alone through the encoder, its pieces averaged, the
    chosen hidden states summed ("sum") or concatenated (otherwise)."""
    encoder.eval()
    where = next(encoder.parameters()).device
    chunks = []
    for start in range(0, len(words), batch_size):
        batch = tokenizer(list(words[start : start + batch_size]), padding=True, return_tensors="pt", return_token_type_ids=True)
        batch = {k: v.to(where) for k, v in batch.items()}
        states, _ = hidden_states(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        chosen = [states[i] for i in layer_indexes(layers, len(states))]
        hidden = torch.stack(chosen).sum(0) if combine == "sum" else torch.cat(chosen, dim=-1)  # (B, T, H')
        special = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
        for token_id in tokenizer.all_special_ids:
            special |= batch["input_ids"] == token_id
        mask = (batch["attention_mask"].bool() & ~special).unsqueeze(-1).to(hidden.dtype)  # (B, T, 1): the word's pieces
        chunks.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu().numpy())
    return np.concatenate(chunks)


def score_pairs(vectors: dict[str, np.ndarray], pairs: Sequence[WordPair]) -> dict[str, float]:
    """Spearman and Pearson correlation of cosine similarity with the human scores."""
    a = np.stack([vectors[p.a] for p in pairs])
    b = np.stack([vectors[p.b] for p in pairs])
    cosine = cosine_rows(a, b)
    gold = [p.score for p in pairs]
    return {"spearman": metrics.spearman(cosine, gold), "pearson": metrics.pearson(cosine, gold)}


def run_word_similarity(task: TaskConfig, encoder_dir: str, tokenizer_dir: str, seed: int, *, random_init: bool) -> dict:
    """The `run_task` result of a word_similarity task: {"validation": {spearman,
    pearson}, "word_pairs": {"pairs", "words", "unknown_words"}, "skipped", ...}."""
    read = read_split(task, "validation")
    pairs: list[WordPair] = read.examples
    if len(pairs) < 3:
        raise ValueError(f"{task.validation}: {len(pairs)} usable word pairs; a correlation needs at least 3")
    tokenizer = load_tokenizer(tokenizer_dir)
    words = sorted({w for p in pairs for w in (p.a, p.b)})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(keyed_seed(seed, task.name, "full", "init"))
        encoder = load_encoder(encoder_dir, random_init=random_init)
    if task.word_vectors == "input":
        matrix = input_vectors(encoder, tokenizer, words)
    else:
        matrix = contextual_vectors(encoder, tokenizer, words, task.layers, task.combine)
    vectors = dict(zip(words, matrix))
    unknown = sum(tokenizer.unk_token_id in ids for ids in tokenizer(words, add_special_tokens=False)["input_ids"])
    return {
        "validation": score_pairs(vectors, pairs),
        "word_pairs": {"pairs": len(pairs), "words": len(words), "unknown_words": unknown},
        "labels": [],
        "train_examples": 0,
        "skipped": {"validation": read.skipped},
        "skipped_problems": read.problems,
        "final_train_loss": None,
        "epochs_trained": 0,
        "best_epoch": None,
        "baselines": {},
    }
