"""Token classification: one tag per word (CoNLL-2003 NER), read from CoNLL files and
scored at the entity level (precision, recall, F1 with seqeval, by the task's tag scheme).
As in BERT's NER, only the first piece of each word is trained and read."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from bertcore.eval.kinds.base import Feature, HeadShape, Judged, Lengths, TaskKind, softmax
from bertcore.eval.readers import Problems, ReadResult, numbered_lines
from bertcore.eval.settings import Split, TaskSettings

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class TaggedSentence:
    """Words with one tag each (CoNLL)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]


class TokenClassification(TaskKind):
    name: ClassVar[str] = "token_classification"
    summary: ClassVar[str] = "one tag per word, e.g. NER"
    formats: ClassVar[tuple[str, ...]] = ("conll",)
    primary_metric: ClassVar[str] = "f1"
    pooled: ClassVar[bool] = False
    head_shape: ClassVar[HeadShape] = "tags"

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        labels = labels if labels is not None else task.labels
        return read_conll(getattr(task, split), labels=labels, encoding=task.encoding, on_error=task.on_error)

    def expected(self, task: TaskSettings) -> str:
        return "sentences of one `token ... tag` line per word, separated by blank lines"

    def labels(self, task: TaskSettings, train_examples: list[TaggedSentence]) -> list[str]:
        if task.labels is not None:
            return list(task.labels)
        return sorted({tag for sentence in train_examples for tag in sentence.tags})

    def features(self, examples: Sequence[TaggedSentence], tokenizer, task: TaskSettings, labels: list[str]):
        """Features plus, per sentence, the position of each word's first sub-token (None when
        truncation cut the word off): only that piece is trained and read."""
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

    def batch_labels(self, features: Sequence[Feature], width: int) -> torch.Tensor:
        import torch

        labels = torch.full((len(features), width), -100, dtype=torch.long)  # (B, T), -100: not scored
        for row, f in enumerate(features):
            labels[row, : len(f.label)] = torch.tensor(f.label)
        return labels

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from torch import nn

        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

    def score(
        self, task: TaskSettings, labels: list[str], examples: list[TaggedSentence], outputs: list, extra
    ) -> dict[str, float]:
        import numpy as np

        from bertcore.eval import metrics

        outside = "O" if "O" in labels else labels[0]
        predicted = []
        for logits, first in zip(outputs, extra):
            # A word cut off by truncation is predicted O, so it costs recall rather than vanishing.
            predicted.append([outside if p is None else labels[int(np.argmax(logits[p]))] for p in first])
        return metrics.entity_scores([list(e.tags) for e in examples], predicted, scheme=task.tag_scheme)

    def majority(self, task: TaskSettings, labels: list[str], train: list, evaluate: list) -> dict[str, float]:
        from bertcore.eval import metrics
        from bertcore.eval.baselines import most_frequent

        majority = most_frequent([t for e in train for t in e.tags])
        return metrics.entity_scores(
            [list(e.tags) for e in evaluate], [[majority] * len(e.tags) for e in evaluate], scheme=task.tag_scheme
        )

    def pair(self, task: TaskSettings) -> bool:
        return False

    def text_parts(self, example: TaggedSentence) -> tuple[str, ...]:
        return (" ".join(example.words),)

    def given(self, example: TaggedSentence) -> str:
        return " ".join(example.tags)

    def label_counts(self, examples: list[TaggedSentence]) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(tag for e in examples for tag in e.tags).most_common())

    def judge(
        self, task: TaskSettings, labels: list[str], examples: list[TaggedSentence], outputs: list, extra
    ) -> list[Judged]:
        """One unit per word that truncation left (its first piece); a word cut off counts as
        predicted O in the view, as in scoring. The view marks each wrong word `word[given>predicted]`."""
        import numpy as np

        outside = "O" if "O" in labels else labels[0]
        index = {label: i for i, label in enumerate(labels)}
        out = []
        for example, logits, first in zip(examples, outputs, extra):
            kept = [w for w, p in enumerate(first) if p is not None]
            probabilities = softmax(np.asarray(logits, dtype=np.float64)[[first[w] for w in kept]]) if kept else None
            predicted = [outside] * len(example.words)
            for row, w in enumerate(kept):
                predicted[w] = labels[int(probabilities[row].argmax())]
            given = [index[example.tags[w]] for w in kept]
            loss = (
                float(np.mean([-np.log(max(probabilities[row, g], 1e-12)) for row, g in enumerate(given)]))
                if kept
                else 0.0
            )
            view = " ".join(
                word if tag == guess else f"{word}[{tag}>{guess}]"
                for word, tag, guess in zip(example.words, example.tags, predicted)
            )
            out.append(Judged(self.given(example), " ".join(predicted), loss, given, probabilities, view=view))
        return out

    def lengths(self, tokenizer, examples: list[TaggedSentence], task: TaskSettings) -> Lengths:
        """Sentences longer than max_seq_length pieces lose their last words (scored as O)."""
        encoded = tokenizer(
            [list(e.words) for e in examples], is_split_into_words=True, truncation=False, verbose=False
        )
        sizes = [len(ids) for ids in encoded["input_ids"]]
        longer = sum(n > task.max_seq_length for n in sizes)
        cut = sum(max(0, n - task.max_seq_length) for n in sizes)
        return Lengths(len(sizes), longer, longer, sum(sizes), cut, "the words past the cut are predicted O")

    def decode(self, logits: np.ndarray, labels: list[str]) -> list[str]:
        """The tag of every token (T, C) -> [tag] * T."""
        return [labels[int(i)] for i in logits.argmax(-1)]


_TAG = re.compile(r"^(O|[BIES]-\S+)$")


def read_conll(
    path: str, *, labels: list[str] | None = None, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise"
) -> ReadResult:
    """TaggedSentences from a CoNLL-2003 style file: one token per line, its tag in the last
    column, blank lines between sentences, -DOCSTART- lines ignored. A line with a single
    column, or a tag outside `labels` (or, with no list, not O/B-/I-/E-/S-TYPE), makes its
    sentence malformed; skipping drops the whole sentence and counts it once."""
    problems = Problems(path, on_error)
    examples: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    bad: tuple[int, str] | None = None

    def close() -> None:
        nonlocal words, tags, bad
        if bad is not None:
            problems.report(*bad)
        elif words:
            examples.append(TaggedSentence(tuple(words), tuple(tags)))
        words, tags, bad = [], [], None

    for line, text in numbered_lines(path, encoding, problems):
        columns = text.split()
        if not columns:
            close()
            continue
        if columns[0] == "-DOCSTART-":
            close()
            continue
        if bad is not None:
            continue
        tag = columns[-1]
        if len(columns) < 2:
            bad = (line, f"expected a token and a tag, found {text.strip()!r}")
        elif labels is not None and tag not in labels:
            bad = (line, f"tag {tag!r} is not one of the task's labels")
        elif labels is None and not _TAG.match(tag):
            bad = (line, f"{tag!r} is not a tag of the form O, B-TYPE, I-TYPE, E-TYPE or S-TYPE")
        else:
            words.append(columns[0])
            tags.append(tag)
    close()
    return problems.result(examples)
