"""The interface of a task kind, and what most kinds do the same way.

A kind is everything that depends on what a task asks of the encoder: which files hold
it and how a row is checked, how examples become model inputs, the head's outputs and
its loss, how outputs become predictions and scores, what a model that learned nothing
scores, what serving needs to know of the fine-tuned head, and what a diagnosis asks of
its examples and outputs (bertcore/eval/diagnosis/). The fine-tuning loop
(bertcore/eval/finetune.py), the plan of the evaluate stage, the summary and the report
ask the task's kind (`TaskConfig.kind`) and never compare its name.

Tensors: B inputs, T tokens, C outputs; a kind whose inputs have several rows (windows of
a long text, the candidates of a multiple-choice question) says how rows map to inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from bertcore.eval.readers import ReadResult
from bertcore.eval.settings import FileFormat, Split, TaskSettings
from bertcore.eval.windows import Windows

if TYPE_CHECKING:
    import numpy as np
    import torch

HeadShape = Literal["labels", "score", "tags", "span", "choice"]
"""What a head's logits are: labels (B, C) class scores; score (B, 1) one number; tags
(B, T, C) class scores per token; span (B, T, 2) start and end scores per token; choice
(B x N, 1) one score per candidate, the N candidates of an input on consecutive rows."""


@dataclass
class Feature:
    """One example as model input (not padded)."""

    input_ids: list[int]
    token_type_ids: list[int]
    label: object
    """What the loss compares with: a class index, a score, per-token tags (-100: not scored), (start, end)."""
    windows: Windows | None = None
    """long_inputs windows: every window of the input (input_ids: the first)."""
    rows: tuple[tuple[list[int], list[int]], ...] | None = None
    """Inputs read as several rows scored apart, (input ids, token types) each (multiple choice: one per candidate)."""


@dataclass(frozen=True)
class HeadSpec:
    """What serving needs to know of a fine-tuned task head."""

    shape: HeadShape
    pair: bool
    """The head was fine-tuned on text pairs (text_a and text_b; QA: question and context; a
    multiple-choice candidate after its context), so a served input is a pair too."""
    labels: list[str]
    """The names of the outputs, in output order (empty for a score or a candidate's score)."""


@dataclass
class Judged:
    """One example as a fine-tuned model saw it, for the diagnosis (bertcore/eval/diagnosis/):
    what was given, what was predicted, how wrong it was, and for a kind with classes the
    probabilities of its units (one unit per example; one per word for tags)."""

    given: str
    predicted: str
    loss: float
    """How wrong the model was on it: the cross-entropy of the given label (the mean over the
    units), the squared error, or 1 - F1 of the predicted span; the worst examples have the highest."""
    given_classes: list[int] = field(default_factory=list)
    """The given class of each unit (empty for a kind without classes)."""
    probabilities: np.ndarray | None = None
    """(U, C) the model's probability of each class for each unit."""
    residual: float | None = None
    """A score's prediction minus the given score (regression)."""
    view: str | None = None
    """The example as a reader checks it: the words with wrong tags marked, the candidates, the question and span."""


@dataclass(frozen=True)
class Lengths:
    """How the inputs of one split fit max_seq_length (`TaskKind.lengths`)."""

    inputs: int
    longer: int
    """Inputs longer than max_seq_length, special tokens included."""
    cut: int
    """Inputs of which the model reads less than all (truncated, or past max_windows)."""
    tokens: int
    """Tokens of all the inputs, before any cut."""
    cut_tokens: int | None
    """Tokens the model never reads (None where windows read them and the count is not kept)."""
    note: str = ""
    """What the counts mean for this kind, when it is not plain truncation."""


class TaskKind:
    """One kind of task. Subclasses set the class attributes and implement what they need;
    a kind that trains nothing (`trains = False`) implements `score_encoder` instead of the
    model methods."""

    name: ClassVar[str]
    """The `type` of a task in a recipe."""
    summary: ClassVar[str]
    """One line for the recipe reference: what a task of this kind is."""
    formats: ClassVar[tuple[FileFormat, ...]]
    """File formats that can hold it."""
    primary_metric: ClassVar[str]
    """The score it is ranked by, chosen on by early stopping and judged by the verdict."""
    trains: ClassVar[bool] = True
    """It fine-tunes a model (word similarity only reads the encoder)."""
    pooled: ClassVar[bool] = True
    """Its head reads one pooled vector per row (`pooling`), else the hidden state of every token."""
    windowed: ClassVar[bool] = False
    """It can read inputs longer than max_seq_length in windows (`long_inputs: windows`)."""
    stratified: ClassVar[bool] = False
    """Every example has one class label (`example.label`), kept in proportion by
    cross-validation folds, train-fraction subsets and early-stopping hold-outs."""
    head_shape: ClassVar[HeadShape | None] = "labels"
    """What its head's logits are (HeadShape); None for a kind that trains no head."""

    # --- the recipe and the files ------------------------------------------------------------

    def check(self, task: TaskSettings) -> None:
        """What the recipe must hold for this kind beyond its format: a ValueError naming the setting."""

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        """The examples of one split; `labels` overrides `task.labels` (the list inferred from train)."""
        raise NotImplementedError

    def expected(self, task: TaskSettings) -> str:
        """What a file of the task should hold, in a few words, for the message about one that holds nothing usable."""
        raise NotImplementedError

    def check_train(self, task: TaskSettings, examples: list) -> None:
        """Refuses a training file whose examples cannot train this kind (TaskDataError)."""

    def labels(self, task: TaskSettings, train_examples: list) -> list[str]:
        """The names of the outputs: `task.labels` if set, else what the training examples use; [] without names."""
        return []

    # --- the model ---------------------------------------------------------------------------

    def features(
        self, examples: Sequence, tokenizer, task: TaskSettings, labels: list[str]
    ) -> tuple[list[Feature], Any]:
        """(one Feature per model input, what `score` needs besides the outputs or None)."""
        raise NotImplementedError

    def num_outputs(self, labels: list[str]) -> int:
        """Width of the head's linear layer: C."""
        return len(labels)

    def rows(self, features: Sequence[Feature]) -> tuple[list[tuple[list[int], list[int]]], list[int] | None]:
        """(the rows the encoder reads, (input ids, token types) each; with windows, each row's
        feature, whose windows the model pools into one vector, else None). Features with
        `rows` give each of them, in order, scored apart."""
        if features[0].rows is not None:
            return [row for f in features for row in f.rows], None
        if features[0].windows is not None:
            rows = [(ids, types) for f in features for ids, types in zip(f.windows.input_ids, f.windows.token_type_ids)]
            return rows, [i for i, f in enumerate(features) for _ in f.windows.input_ids]
        return [(f.input_ids, f.token_type_ids) for f in features], None

    def batch(
        self, features: Sequence[Feature], pad_id: int, where: torch.device | None = None
    ) -> dict[str, torch.Tensor]:
        """Model inputs padded to the longest row (R, T) plus "labels", moved to `where` (default:
        the CPU); with windows also "window_owner" (R,). Padding to the batch's longest row costs
        little on CPU."""
        import torch

        rows, owner = self.rows(features)
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
        batch["labels"] = self.batch_labels(features, width)
        return batch if where is None else {k: v.to(where) for k, v in batch.items()}

    def batch_labels(self, features: Sequence[Feature], width: int) -> torch.Tensor:
        """What the loss compares the batch's logits with (default: a class index per input, (B,))."""
        import torch

        return torch.tensor([f.label for f in features], dtype=torch.long)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (default: cross-entropy over classes, logits (B, C))."""
        from torch import nn

        return nn.functional.cross_entropy(logits, labels)

    def split_outputs(self, logits: np.ndarray, features: Sequence[Feature]) -> list[np.ndarray]:
        """Per feature, its logits from a batch's: (C,) for a pooled head, (T, C) cut to the
        feature's length for a per-token one."""
        if self.pooled:
            return [logits[row] for row in range(len(features))]
        return [logits[row, : len(f.input_ids)] for row, f in enumerate(features)]

    # --- the scores --------------------------------------------------------------------------

    def score(
        self, task: TaskSettings, labels: list[str], examples: list, outputs: list, extra: Any
    ) -> dict[str, float]:
        """The metrics of one model's outputs (`split_outputs`, one per feature) on `examples`."""
        raise NotImplementedError

    def majority(self, task: TaskSettings, labels: list[str], train: list, evaluate: list) -> dict[str, float] | None:
        """Scores of always predicting the training data's most frequent answer; None where that means nothing."""
        return None

    def chance(self, task: TaskSettings, labels: list[str]) -> dict[str, float]:
        """Expected scores of guessing uniformly at random (no entry where that is not a simple number)."""
        return {}

    def long_inputs(self, tokenizer, examples: list, task: TaskSettings) -> dict[str, int] | None:
        """How many inputs were longer than the window (bertcore/eval/windows.py), for kinds that count them."""
        return None

    def score_encoder(
        self, task: TaskSettings, encoder_dir: str, tokenizer_dir: str, seed: int, *, random_init: bool
    ) -> dict:
        """A kind that trains nothing: the `run_task` result of scoring the encoder itself."""
        raise NotImplementedError(f"{self.name} fine-tunes a model; run it through bertcore.eval.finetune")

    # --- diagnosis (bertcore/eval/diagnosis/) -----------------------------------------------

    def text_parts(self, example: Any) -> tuple[str, ...]:
        """The texts of one example, as the model reads them: what duplicate and leaked
        rows are matched on, and the text held-out MLM accuracy is measured on."""
        raise NotImplementedError

    def given(self, example: Any) -> str:
        """The example's label as a reader sees it (a class, a score, the tags, the answer)."""
        raise NotImplementedError

    def label_counts(self, examples: Sequence) -> dict[str, int] | None:
        """How often each class (a tag, for tagging) is given; None for a kind without classes."""
        return None

    def classes(self, task: TaskSettings, labels: list[str]) -> list[str] | None:
        """The names of the classes `judge` gives probabilities over; None without classes."""
        return list(labels) or None

    def lengths(self, tokenizer, examples: Sequence, task: TaskSettings) -> Lengths | None:
        """How the inputs fit max_seq_length; None where no input is cut (a word pair)."""
        return None

    def judge(self, task: TaskSettings, labels: list[str], examples: list, outputs: list, extra: Any) -> list[Judged]:
        """Per example, the model's outputs (`split_outputs`, as `score` reads them) judged
        against the given label (default: one label per example, softmax over the outputs)."""
        import numpy as np

        names = self.classes(task, labels) or []
        out = []
        for example, logits in zip(examples, outputs):
            probabilities = softmax(np.asarray(logits, dtype=np.float64).reshape(1, -1))  # (1, C)
            given = self.given_class(example, labels)
            predicted = int(probabilities[0].argmax())
            out.append(
                Judged(
                    given=self.given(example),
                    predicted=names[predicted] if predicted < len(names) else str(predicted),
                    loss=float(-np.log(max(probabilities[0, given], 1e-12))),
                    given_classes=[given],
                    probabilities=probabilities,
                )
            )
        return out

    def given_class(self, example: Any, labels: list[str]) -> int:
        """The index of the example's class among `classes` (kinds that judge with the default)."""
        raise NotImplementedError

    # --- serving -----------------------------------------------------------------------------

    def pair(self, task: TaskSettings) -> bool:
        """Whether the task's inputs are text pairs (default: when it names a second text column)."""
        return task.text_b is not None

    def head(self, task: TaskSettings, labels: list[str]) -> HeadSpec:
        """What serving needs to know of the head fine-tuned on `task`."""
        return HeadSpec(self.head_shape, self.pair(task), list(labels))

    def decode(self, logits: np.ndarray, labels: list[str]) -> Any:
        """One served input's answer from its logits (default: labels ranked by softmax probability)."""
        import numpy as np

        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
        names = labels or [str(i) for i in range(len(scores))]
        return [{"label": names[i], "score": float(scores[i])} for i in np.argsort(-scores, kind="stable")]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (U, C) logits, in float64."""
    import numpy as np

    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)
