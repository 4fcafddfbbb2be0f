"""Word similarity: how well the encoder's word vectors rank word pairs the way people do
(WordSim-353, SimLex-999, MEN): Spearman correlation of the cosine of two words' vectors
with the human scores. Nothing is trained, so the pretrained model scores the same on
every seed; the random-init baseline differs per seed, which gives the spread.

A word's vector is either the mean of its WordPiece rows of the input embedding matrix
("input"; MLM shapes these rows through the tied output layer, so words that fit the same
contexts move together) or the encoder's hidden states for the word alone, `[CLS] word
[SEP]`, averaged over its pieces ("contextual"; the layers a task names, summed or
concatenated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from bertcore.eval.kinds.base import TaskKind
from bertcore.eval.readers import Malformed, Problems, ReadResult, numbered_lines, score
from bertcore.eval.settings import Split, TaskSettings

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class WordPair:
    """Two words and a human similarity (or relatedness) score."""

    a: str
    b: str
    score: float


class WordSimilarity(TaskKind):
    name: ClassVar[str] = "word_similarity"
    summary: ClassVar[str] = (
        "word pairs with human similarity scores, e.g. WordSim-353, SimLex-999: Spearman correlation of the cosine "
        "of the encoder's word vectors; nothing is trained"
    )
    formats: ClassVar[tuple[str, ...]] = ("word_pairs",)
    primary_metric: ClassVar[str] = "spearman"
    trains: ClassVar[bool] = False
    pooled: ClassVar[bool] = False
    head_shape: ClassVar[None] = None  # trains no head

    def check(self, task: TaskSettings) -> None:
        if task.combine == "scalar_mix":
            raise ValueError(
                "combine scalar_mix learns its weights, and a word_similarity task trains nothing; use concat or sum"
            )
        if (
            task.validation is None
            or task.train is not None
            or task.cross_validation_folds is not None
            or task.test is not None
        ):
            raise ValueError(
                "a word_similarity task is scored on its `validation` file (the word pairs) alone; "
                "leave train, test and cross_validation_folds unset"
            )

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        return read_word_pairs(getattr(task, split), encoding=task.encoding, on_error=task.on_error)

    def expected(self, task: TaskSettings) -> str:
        return "lines of `word1 word2 score` (tab or space separated)"

    def chance(self, task: TaskSettings, labels: list[str]) -> dict[str, float]:
        return {"spearman": 0.0, "pearson": 0.0}

    def text_parts(self, example: WordPair) -> tuple[str, ...]:
        return (example.a, example.b)

    def given(self, example: WordPair) -> str:
        return f"{example.score:g}"

    def classes(self, task: TaskSettings, labels: list[str]) -> None:
        return None

    def score_encoder(
        self, task: TaskSettings, encoder_dir: str, tokenizer_dir: str, seed: int, *, random_init: bool
    ) -> dict:
        return run_word_similarity(task, encoder_dir, tokenizer_dir, seed, random_init=random_init)


def read_word_pairs(path: str, *, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise") -> ReadResult:
    """WordPairs from `word1 word2 score` lines (tab or space separated, further columns
    ignored; blank lines and lines starting with # skipped): WordSim-353 and SimLex-999
    as gensim ships them, MEN, RW."""
    problems = Problems(path, on_error)
    pairs = []
    for line, text in numbered_lines(path, encoding, problems):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        columns = text.split("\t") if "\t" in text else text.split()
        try:
            if len(columns) < 3 or not columns[0].strip() or not columns[1].strip():
                raise Malformed(f"expected word1, word2 and a score, found {text.strip()!r}")
            pairs.append(WordPair(columns[0].strip(), columns[1].strip(), score(columns[2].strip())))
        except Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(pairs)


# --- word vectors --------------------------------------------------------------------------


def input_vectors(encoder: torch.nn.Module, tokenizer, words: Sequence[str]) -> np.ndarray:
    """(N, H): mean of each word's piece rows of the input embedding matrix."""
    import numpy as np

    matrix = encoder.get_input_embeddings().weight.detach().float().cpu().numpy()  # (V, H)
    pieces = tokenizer(list(words), add_special_tokens=False)["input_ids"]
    return np.stack([matrix[ids].mean(0) if ids else np.zeros(matrix.shape[1], dtype=matrix.dtype) for ids in pieces])


def contextual_vectors(
    encoder: torch.nn.Module, tokenizer, words: Sequence[str], layers, combine: str, batch_size: int = 256
) -> np.ndarray:
    """(N, H) or (N, k*H): the word alone through the encoder, its pieces averaged, the
    chosen hidden states summed ("sum") or concatenated (otherwise)."""
    import numpy as np
    import torch

    from bertcore.eval.encoder import hidden_states, layer_indexes

    encoder.eval()
    where = next(encoder.parameters()).device
    chunks = []
    with torch.no_grad():
        for start in range(0, len(words), batch_size):
            batch = tokenizer(
                list(words[start : start + batch_size]), padding=True, return_tensors="pt", return_token_type_ids=True
            )
            batch = {k: v.to(where) for k, v in batch.items()}
            states, _ = hidden_states(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            chosen = [states[i] for i in layer_indexes(layers, len(states))]
            hidden = torch.stack(chosen).sum(0) if combine == "sum" else torch.cat(chosen, dim=-1)  # (B, T, H')
            special = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
            for token_id in tokenizer.all_special_ids:
                special |= batch["input_ids"] == token_id
            mask = (
                (batch["attention_mask"].bool() & ~special).unsqueeze(-1).to(hidden.dtype)
            )  # (B, T, 1): the word's pieces
            chunks.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1)).float().cpu().numpy())
    return np.concatenate(chunks)


def score_pairs(vectors: dict[str, np.ndarray], pairs: Sequence[WordPair]) -> dict[str, float]:
    """Spearman and Pearson correlation of cosine similarity with the human scores."""
    import numpy as np

    from bertcore.eval import metrics

    a = np.stack([vectors[p.a] for p in pairs])
    b = np.stack([vectors[p.b] for p in pairs])
    cosine = metrics.cosine_rows(a, b)
    gold = [p.score for p in pairs]
    return {"spearman": metrics.spearman(cosine, gold), "pearson": metrics.pearson(cosine, gold)}


def run_word_similarity(
    task: TaskSettings, encoder_dir: str, tokenizer_dir: str, seed: int, *, random_init: bool
) -> dict:
    """The `run_task` result of a word_similarity task: {"validation": {spearman,
    pearson}, "word_pairs": {"pairs", "words", "unknown_words"}, "skipped", ...}."""
    import torch

    from bertcore.eval.encoder import load_encoder, load_tokenizer
    from bertcore.rng import keyed_seed

    read = read_word_pairs(task.validation, encoding=task.encoding, on_error=task.on_error)
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
