"""Regression: one number per text or text pair (STS-B's similarity scores), trained by
mean squared error and scored by Pearson and Spearman correlation (GLUE's conventions)
and the mean squared error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from bertcore.eval.kinds.base import Feature, HeadShape, Judged
from bertcore.eval.kinds.text import TextKind
from bertcore.eval.readers import TextExample, score
from bertcore.eval.settings import TaskSettings

if TYPE_CHECKING:
    import numpy as np
    import torch


class Regression(TextKind):
    name: ClassVar[str] = "regression"
    summary: ClassVar[str] = "one number per text or pair, e.g. STS-B"
    formats: ClassVar[tuple[str, ...]] = ("tsv", "csv", "jsonl")
    primary_metric: ClassVar[str] = "spearman"
    head_shape: ClassVar[HeadShape] = "score"

    def check(self, task: TaskSettings) -> None:
        if task.labels is not None:
            raise ValueError("labels must be unset for a regression task")

    def parse_label(self, labels: list[str] | None) -> Callable[[Any], Any]:
        return score

    def target(self, label: Any, index: dict[str, int]) -> float:
        return float(label)

    def num_outputs(self, labels: list[str]) -> int:
        return 1

    def batch_labels(self, features: list[Feature], width: int) -> torch.Tensor:
        import torch

        return torch.tensor([f.label for f in features], dtype=torch.float)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from torch import nn

        return nn.functional.mse_loss(logits.squeeze(-1), labels)

    def score(
        self, task: TaskSettings, labels: list[str], examples: list[TextExample], outputs: list, extra: None
    ) -> dict[str, float]:
        import numpy as np

        from bertcore.eval import metrics

        gold = [float(e.label) for e in examples]
        predicted = [float(o[0]) for o in outputs]
        return {
            "pearson": metrics.pearson(gold, predicted),
            "spearman": metrics.spearman(gold, predicted),
            "mse": float(np.mean((np.asarray(gold) - np.asarray(predicted)) ** 2)),
        }

    def chance(self, task: TaskSettings, labels: list[str]) -> dict[str, float]:
        return {"spearman": 0.0, "pearson": 0.0}

    def given(self, example: TextExample) -> str:
        return f"{float(example.label):g}"

    def classes(self, task: TaskSettings, labels: list[str]) -> None:
        return None

    def judge(
        self, task: TaskSettings, labels: list[str], examples: list[TextExample], outputs: list, extra: None
    ) -> list[Judged]:
        out = []
        for example, output in zip(examples, outputs):
            predicted = float(output[0])
            residual = predicted - float(example.label)
            out.append(Judged(self.given(example), f"{predicted:.3g}", residual**2, residual=residual))
        return out

    def decode(self, logits: np.ndarray, labels: list[str]) -> dict[str, float]:
        return {"score": float(logits[0])}
