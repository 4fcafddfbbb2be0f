"""Multiple choice: a context and N candidate answers, one of them right (SWAG, COPA,
HellaSwag), read from TSV, CSV or JSON-lines rows and scored by accuracy.

Each candidate is read as a pair, `[CLS] context [SEP] candidate [SEP]` (the candidate
after the row's `text_b` when the task names one: SWAG's start of the ending), pooled to
one vector, and given one score by the head; the N scores of a question are its logits,
trained by cross-entropy against the right candidate's index, as BERT's SWAG head is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from bertcore.eval.kinds.base import Feature, HeadShape, Judged, Lengths, TaskKind
from bertcore.eval.readers import Malformed, Problems, ReadResult, cell, expected_rows, table_rows
from bertcore.eval.settings import Split, TaskSettings

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class ChoiceExample:
    """A context, the candidates that may follow it, and the index of the right one."""

    context: str
    candidates: tuple[str, ...]
    """Each candidate as the model reads it after the context (with the row's start of the candidate, if any)."""
    label: int


class MultipleChoice(TaskKind):
    name: ClassVar[str] = "multiple_choice"
    summary: ClassVar[str] = "a context and N candidate answers, one of them right, e.g. SWAG, COPA"
    formats: ClassVar[tuple[str, ...]] = ("tsv", "csv", "jsonl")
    primary_metric: ClassVar[str] = "accuracy"
    head_shape: ClassVar[HeadShape] = "choice"

    def check(self, task: TaskSettings) -> None:
        if task.choices is None or len(task.choices) < 2:
            raise ValueError("a multiple_choice task needs `choices`: the columns of its two or more candidate answers")
        if len(set(task.choices)) != len(task.choices):
            raise ValueError("choices names a column twice")
        if task.labels is not None:
            raise ValueError(
                "labels must be unset for a multiple_choice task (its label column holds the right candidate's index)"
            )

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        """ChoiceExamples; a row with a missing or non-text column, or a label that is not the
        0-based index of one of its candidates, is malformed."""
        path = getattr(task, split)
        problems = Problems(path, task.on_error)
        count = len(task.choices)
        examples = []
        for line, row in table_rows(path, task.format, task.header, task.encoding, problems):
            try:
                texts = [cell(row, c) for c in (task.text_a, *task.choices)]
                start = cell(row, task.text_b) if task.text_b is not None else None
                if not all(isinstance(t, str) for t in texts) or not isinstance(start, str | None):
                    raise Malformed("a text column is not a string")
                label = _index(cell(row, task.label_column), count)
                candidates = tuple(t if start is None else f"{start} {t}" for t in texts[1:])
                examples.append(ChoiceExample(texts[0], candidates, label))
            except Malformed as problem:
                problems.report(line, str(problem))
        return problems.result(examples)

    def expected(self, task: TaskSettings) -> str:
        columns = [task.text_a, task.text_b, *(task.choices or []), task.label_column]
        return (
            expected_rows(task.format, columns, task.header) + " (the label: the 0-based index of the right candidate)"
        )

    def features(
        self, examples: Sequence[ChoiceExample], tokenizer, task: TaskSettings, labels: list[str]
    ) -> tuple[list[Feature], None]:
        """One feature per example with one row per candidate (the context cut first when too long)."""
        count = len(task.choices)
        encoded = tokenizer(
            [e.context for e in examples for _ in range(count)],
            [candidate for e in examples for candidate in e.candidates],
            truncation=True,
            max_length=task.max_seq_length,
            return_token_type_ids=True,
        )
        ids, types = encoded["input_ids"], encoded["token_type_ids"]
        features = []
        for i, example in enumerate(examples):
            rows = tuple(zip(ids[i * count : (i + 1) * count], types[i * count : (i + 1) * count]))
            features.append(Feature(rows[0][0], rows[0][1], example.label, rows=rows))
        return features, None

    def num_outputs(self, labels: list[str]) -> int:
        return 1  # one score per candidate

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from torch import nn

        return nn.functional.cross_entropy(logits.view(len(labels), -1), labels)  # (B x N, 1) -> (B, N)

    def split_outputs(self, logits: np.ndarray, features: Sequence[Feature]) -> list[np.ndarray]:
        return list(logits.reshape(len(features), -1))  # (B, N): the candidates' scores of each question

    def score(
        self, task: TaskSettings, labels: list[str], examples: list[ChoiceExample], outputs: list, extra: None
    ) -> dict[str, float]:
        from bertcore.eval import metrics

        return {"accuracy": metrics.accuracy([e.label for e in examples], [int(o.argmax()) for o in outputs])}

    def majority(
        self, task: TaskSettings, labels: list[str], train: list[ChoiceExample], evaluate: list[ChoiceExample]
    ) -> dict[str, float]:
        """Always the candidate position that is most often right in the training data."""
        from bertcore.eval import metrics
        from bertcore.eval.baselines import most_frequent

        majority = most_frequent([e.label for e in train])
        return {"accuracy": metrics.accuracy([e.label for e in evaluate], [majority] * len(evaluate))}

    def chance(self, task: TaskSettings, labels: list[str]) -> dict[str, float]:
        return {"accuracy": 1.0 / len(task.choices)}

    def pair(self, task: TaskSettings) -> bool:
        return True

    def text_parts(self, example: ChoiceExample) -> tuple[str, ...]:
        return (example.context, *example.candidates)

    def given(self, example: ChoiceExample) -> str:
        return str(example.label)

    def label_counts(self, examples: list[ChoiceExample]) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(str(e.label) for e in examples).most_common())

    def classes(self, task: TaskSettings, labels: list[str]) -> list[str]:
        return [str(i) for i in range(len(task.choices))]

    def given_class(self, example: ChoiceExample, labels: list[str]) -> int:
        return example.label

    def judge(
        self, task: TaskSettings, labels: list[str], examples: list[ChoiceExample], outputs: list, extra: None
    ) -> list[Judged]:
        """The default judgement over the candidates' scores; the view lists the candidates."""
        judged = super().judge(task, labels, examples, outputs, extra)
        for one, example in zip(judged, examples):
            one.view = " | ".join(f"{i}: {candidate}" for i, candidate in enumerate(example.candidates))
        return judged

    def lengths(self, tokenizer, examples: list[ChoiceExample], task: TaskSettings) -> Lengths:
        """An input is a question with its candidates: longer when any candidate's pair is."""
        count = len(task.choices)
        encoded = tokenizer(
            [e.context for e in examples for _ in range(count)],
            [candidate for e in examples for candidate in e.candidates],
            truncation=False,
            verbose=False,
        )["input_ids"]
        sizes = [len(ids) for ids in encoded]
        per_question = [sizes[i * count : (i + 1) * count] for i in range(len(examples))]
        longer = sum(max(row) > task.max_seq_length for row in per_question)
        cut = sum(max(0, n - task.max_seq_length) for n in sizes)
        return Lengths(len(examples), longer, longer, sum(sizes), cut, "each candidate read after the context")

    def decode(self, logits: np.ndarray, labels: list[str]) -> list[dict]:
        """The candidates of one question ranked by softmax probability: [{"choice": index, "score"}]."""
        return [{"choice": int(r["label"]), "score": r["score"]} for r in super().decode(logits, [])]


def _index(value, count: int) -> int:
    """The 0-based index of the right candidate from a label cell (an integer, or its digits as text)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"label {value!r} is not the index of a candidate")
    if not 0 <= value < count:
        raise Malformed(f"label {value} is not the index of one of the {count} candidates (0 to {count - 1})")
    return value
