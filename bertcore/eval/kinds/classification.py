"""Classification: one label per text or text pair (SST-2, MRPC, MNLI, a fastText file),
scored by accuracy, macro F1, Matthews correlation and, with two labels, the F1 of the
positive one (GLUE's conventions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bertcore.eval.kinds.text import TextKind
from bertcore.eval.readers import TaskDataError, TextExample, class_label
from bertcore.eval.settings import TaskSettings


class Classification(TextKind):
    name: ClassVar[str] = "classification"
    summary: ClassVar[str] = "one label per text or text pair"
    formats: ClassVar[tuple[str, ...]] = ("tsv", "csv", "jsonl", "fasttext")
    primary_metric: ClassVar[str] = "accuracy"
    stratified: ClassVar[bool] = True

    def parse_label(self, labels: list[str] | None) -> Callable[[Any], Any]:
        return lambda value: class_label(value, labels)

    def target(self, label: Any, index: dict[str, int]) -> int:
        return index[label]

    def check_train(self, task: TaskSettings, examples: list[TextExample]) -> None:
        seen = sorted({str(example.label) for example in examples})
        if len(seen) < 2:
            raise TaskDataError(
                f"{task.train}: every one of its {len(examples)} examples has the label {seen[0]!r}; "
                f"task {task.name!r} (classification) needs at least two labels in its train file"
            )

    def labels(self, task: TaskSettings, train_examples: list[TextExample]) -> list[str]:
        return list(task.labels) if task.labels is not None else sorted({e.label for e in train_examples})

    def score(
        self, task: TaskSettings, labels: list[str], examples: list[TextExample], outputs: list, extra: None
    ) -> dict[str, float]:
        import numpy as np

        return score_labels(task, labels, [e.label for e in examples], [labels[int(np.argmax(o))] for o in outputs])

    def majority(
        self, task: TaskSettings, labels: list[str], train: list[TextExample], evaluate: list[TextExample]
    ) -> dict[str, float]:
        from bertcore.eval.baselines import most_frequent

        majority = most_frequent([e.label for e in train])
        return score_labels(task, labels, [e.label for e in evaluate], [majority] * len(evaluate))

    def chance(self, task: TaskSettings, labels: list[str]) -> dict[str, float]:
        return {"accuracy": 1.0 / len(labels), "mcc": 0.0} if labels else {}

    def given(self, example: TextExample) -> str:
        return str(example.label)

    def label_counts(self, examples: list[TextExample]) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(str(e.label) for e in examples).most_common())

    def given_class(self, example: TextExample, labels: list[str]) -> int:
        return labels.index(example.label)


def score_labels(task: TaskSettings, labels: list[str], gold: list[str], predicted: list[str]) -> dict[str, float]:
    from bertcore.eval import metrics

    out = {
        "accuracy": metrics.accuracy(gold, predicted),
        "macro_f1": metrics.f1(gold, predicted, average="macro"),
        "mcc": metrics.matthews(gold, predicted),
    }
    if len(labels) == 2:
        out["f1"] = metrics.f1(gold, predicted, pos_label=task.positive_label or labels[1])
    return out
