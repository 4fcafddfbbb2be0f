"""What the kinds that put one label or one number on a text or a text pair share
(classification, regression): rows read from TSV, CSV, JSON lines (or fastText lines),
one pooled vector per input, and inputs longer than the window cut or read in windows
(bertcore/eval/windows.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from bertcore.eval.kinds.base import Feature, Lengths, TaskKind
from bertcore.eval.readers import ReadResult, TextExample, expected_rows, read_fasttext, read_rows
from bertcore.eval.settings import Split, TaskSettings
from bertcore.eval.windows import Windowing, long_input_counts, split_windows


class TextKind(TaskKind):
    """A label or a number per text or text pair. Subclasses say how a label cell is read
    (`parse_label`) and what the loss compares with (`target`)."""

    windowed: ClassVar[bool] = True

    def parse_label(self, labels: list[str] | None) -> Callable[[Any], Any]:
        raise NotImplementedError

    def target(self, label: Any, index: dict[str, int]) -> Any:
        """What the loss compares the head's output with, for one example's label."""
        raise NotImplementedError

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        path = getattr(task, split)
        labels = labels if labels is not None else task.labels
        if task.format == "fasttext":
            return read_fasttext(path, labels=labels, encoding=task.encoding, on_error=task.on_error)
        return read_rows(
            path,
            format=task.format,
            text_a=task.text_a,
            text_b=task.text_b,
            label_column=task.label_column,
            parse_label=self.parse_label(labels),
            header=task.header,
            encoding=task.encoding,
            on_error=task.on_error,
        )

    def expected(self, task: TaskSettings) -> str:
        return expected_rows(task.format, [task.text_a, task.text_b, task.label_column], task.header)

    def features(
        self, examples: Sequence[TextExample], tokenizer, task: TaskSettings, labels: list[str]
    ) -> tuple[list[Feature], None]:
        index = {label: i for i, label in enumerate(labels)}
        spec = Windowing.of(task)
        if spec is not None:
            features = []
            for e in examples:
                windows = split_windows(tokenizer, e.text_a, e.text_b, spec)
                features.append(
                    Feature(windows.input_ids[0], windows.token_type_ids[0], self.target(e.label, index), windows)
                )
            return features, None
        encoded = tokenizer(
            [e.text_a for e in examples],
            [e.text_b for e in examples] if any(e.text_b is not None for e in examples) else None,
            truncation=True,
            max_length=task.max_seq_length,
            return_token_type_ids=True,
        )
        ids, types = encoded["input_ids"], encoded["token_type_ids"]
        return [Feature(i, t, self.target(e.label, index)) for i, t, e in zip(ids, types, examples)], None

    def long_inputs(self, tokenizer, examples: list[TextExample], task: TaskSettings) -> dict[str, int]:
        return long_input_counts(tokenizer, [e.text_a for e in examples], [e.text_b for e in examples], task)

    def text_parts(self, example: TextExample) -> tuple[str, ...]:
        return (example.text_a,) if example.text_b is None else (example.text_a, example.text_b)

    def lengths(self, tokenizer, examples: Sequence[TextExample], task: TaskSettings) -> Lengths:
        """Tokens of each input (the pair with its special tokens) against max_seq_length;
        truncation cuts what is past it, windows only what is past max_windows windows."""
        pairs = [e.text_b for e in examples] if any(e.text_b is not None for e in examples) else None
        encoded = tokenizer([e.text_a for e in examples], pairs, truncation=False, verbose=False)["input_ids"]
        sizes = [len(ids) for ids in encoded]
        longer = sum(n > task.max_seq_length for n in sizes)
        if task.long_inputs == "windows":
            counts = self.long_inputs(tokenizer, list(examples), task)
            note = f"read in windows of {task.max_seq_length} tokens, at most {task.max_windows} per input"
            return Lengths(len(sizes), longer, counts["cut"], sum(sizes), None, note)
        cut = sum(max(0, n - task.max_seq_length) for n in sizes)
        return Lengths(len(sizes), longer, longer, sum(sizes), cut)
