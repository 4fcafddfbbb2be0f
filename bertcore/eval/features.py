"""Examples to model inputs: the features of text, tagged-word and QA examples (a text
longer than the window cut, or read in windows: bertcore/eval/windows.py), and padded
batches of them (B, T), with the labels each task type trains on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertcore.eval import qa
from bertcore.eval.config import TaskConfig
from bertcore.eval.tasks import QAExample, TaggedSentence, TextExample
from bertcore.eval.windows import Windowing, Windows, split_windows


@dataclass
class Feature:
    input_ids: list[int]
    token_type_ids: list[int]
    label: object  # int | float | list[int] (per token, -100 = not scored) | tuple[int, int] (QA)
    windows: Windows | None = None
    """long_inputs windows: every window of the input (input_ids: the first)."""


def text_features(examples: Sequence[TextExample], tokenizer, task: TaskConfig, labels: list[str]) -> list[Feature]:
    index = {label: i for i, label in enumerate(labels)}
    spec = Windowing.of(task)
    if spec is not None:
        features = []
        for e in examples:
            windows = split_windows(tokenizer, e.text_a, e.text_b, spec)
            label = float(e.label) if task.type == "regression" else index[e.label]
            features.append(Feature(windows.input_ids[0], windows.token_type_ids[0], label, windows))
        return features
    encoded = tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples] if any(e.text_b is not None for e in examples) else None,
        truncation=True,
        max_length=task.max_seq_length,
        return_token_type_ids=True,
    )
    return [
        Feature(ids, types, float(e.label) if task.type == "regression" else index[e.label])
        for ids, types, e in zip(encoded["input_ids"], encoded["token_type_ids"], examples)
    ]


def token_features(examples: Sequence[TaggedSentence], tokenizer, task: TaskConfig, labels: list[str]):
    """Features plus, per sentence, the position of each word's first sub-token (None when
    truncation cut the word off): only that piece is trained and read, as in BERT's NER."""
    index = {label: i for i, label in enumerate(labels)}
    encoded = tokenizer(
        [list(e.words) for e in examples],
        is_split_into_words=True,
        truncation=True,
        max_length=task.max_seq_length,
        return_token_type_ids=True,
    )
    features, first_pieces = [], []
    for i, example in enumerate(examples):
        word_ids = encoded.word_ids(i)
        first = [None] * len(example.words)
        token_labels = [-100] * len(word_ids)
        for position, word in enumerate(word_ids):
            if word is not None and first[word] is None:
                first[word] = position
                token_labels[position] = index[example.tags[word]]
        features.append(Feature(encoded["input_ids"][i], encoded["token_type_ids"][i], token_labels))
        first_pieces.append(first)
    return features, first_pieces


def qa_features(examples: Sequence[QAExample], tokenizer, task: TaskConfig):
    windows = qa.build_windows(
        examples,
        tokenizer,
        max_seq_length=task.max_seq_length,
        doc_stride=task.doc_stride,
        max_query_length=task.max_query_length,
    )
    features = [Feature(w.input_ids, w.token_type_ids, (w.start_position, w.end_position)) for w in windows]
    return features, windows


def make_batch(features: Sequence[Feature], pad_id: int, task_type: str, where: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Pads to the longest feature in the batch (B, T); padding costs little on CPU this way.
    Features read in windows give one row per window (W, T) and `window_owner` (W,).
    The tensors are moved to `where` (default: stay on the CPU)."""
    if features[0].windows is not None:
        rows = [(ids, types) for f in features for ids, types in zip(f.windows.input_ids, f.windows.token_type_ids)]
        owner = [i for i, f in enumerate(features) for _ in f.windows.input_ids]
    else:
        rows, owner = [(f.input_ids, f.token_type_ids) for f in features], None
    width = max(len(row_ids) for row_ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (row_ids, row_types) in enumerate(rows):
        n = len(row_ids)
        ids[row, :n] = torch.tensor(row_ids)
        types[row, :n] = torch.tensor(row_types)
        mask[row, :n] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if owner is not None:
        batch["window_owner"] = torch.tensor(owner, dtype=torch.long)
    if task_type == "classification":
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.long)
    elif task_type == "regression":
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.float)
    elif task_type == "token_classification":
        labels = torch.full((len(features), width), -100, dtype=torch.long)
        for row, f in enumerate(features):
            labels[row, : len(f.label)] = torch.tensor(f.label)
        batch["labels"] = labels
    else:
        batch["labels"] = torch.tensor([f.label for f in features], dtype=torch.long)  # (B, 2) start, end
    return batch if where is None else {k: v.to(where) for k, v in batch.items()}
