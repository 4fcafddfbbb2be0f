"""Reading task files row by row, checking every row: what every task kind's reader shares,
and the readers of text rows (TSV, CSV, JSON lines, fastText lines) that classification,
regression and the STS file of the embedding check read.

A malformed row raises a TaskDataError (a ValueError and a bertpipe InputDataError)
naming the file and the 1-based line, or, with on_error="skip", is left out and counted
in `ReadResult.skipped`. A kind's own format (CoNLL, SQuAD, word pairs, candidate
answers) is read in its module under bertcore/eval/kinds/, with the same `Problems`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec

from bertcore.errors import InputDataError


class TaskDataError(InputDataError, ValueError):
    """A task file cannot be used as it is (a malformed row, too few examples). A
    ValueError for library callers; an InputDataError, so the CLI prints it as one line."""


# --- example records -----------------------------------------------------------------------


@dataclass(frozen=True)
class TextExample:
    """A text or text pair with a class label (str) or a score (float)."""

    text_a: str
    text_b: str | None
    label: str | float


@dataclass
class ReadResult:
    """What a reader returns: the good examples and how many malformed rows were skipped."""

    examples: list
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    """The first problems met when skipping ("file:line: reason"), for the report."""


class Problems:
    """Raises on a malformed row or, when skipping, counts it and keeps the first few."""

    def __init__(self, path: str, on_error: str, keep: int = 20) -> None:
        self.path, self.on_error, self.keep = path, on_error, keep
        self.skipped, self.messages = 0, []

    def report(self, line: int | None, reason: str) -> None:
        where = f"{self.path}, line {line}" if line is not None else self.path
        message = f"{where}: {reason}"
        if self.on_error == "raise":
            raise TaskDataError(f"{message} (fix the row or set on_error: skip)")
        self.skipped += 1
        if len(self.messages) < self.keep:
            self.messages.append(message)

    def result(self, examples: list) -> ReadResult:
        return ReadResult(examples, self.skipped, self.messages)


class Malformed(Exception):
    """A row-level problem, turned into `Problems.report` by the reader's loop."""


def numbered_lines(path: str, encoding: str, problems: Problems) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its newline). Lines are decoded one by one
    so an undecodable byte is reported with its line; a UTF-8 byte-order mark is dropped."""
    with fsspec.open(path, "rb", compression="infer") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode(encoding)
            except UnicodeDecodeError as err:
                problems.report(number, f"byte {raw[err.start]:#04x} is not valid {encoding} (set the task's encoding)")


# --- label checks --------------------------------------------------------------------------


def class_label(value: Any, labels: list[str] | None) -> str:
    if value is None:
        raise Malformed("the label is missing")
    label = str(value).strip()
    if labels is not None and label not in labels:
        raise Malformed(f"label {label!r} is not one of {labels}")
    return label


def score(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise Malformed(f"score {value!r} is not a number") from None
    if not math.isfinite(number):
        raise Malformed(f"score {value!r} is not finite")
    return number


# --- tsv / csv / jsonl / fasttext ----------------------------------------------------------


def read_rows(
    path: str,
    *,
    format: Literal["tsv", "csv", "jsonl"],
    text_a: str | int,
    text_b: str | int | None = None,
    label_column: str | int = "label",
    parse_label: Callable[[Any], Any] | None = None,
    labels: list[str] | None = None,
    header: bool = True,
    encoding: str = "utf-8",
    on_error: Literal["raise", "skip"] = "raise",
) -> ReadResult:
    """TextExamples from delimited rows or JSON lines. TSV is read without quote handling
    (GLUE's files contain stray quotes); CSV follows RFC 4180 quoting. Blank lines are
    ignored. A row with a different number of columns than the header (or the first row,
    without a header) is malformed. `parse_label` turns a label cell into the example's
    label (`score` for a number; default: a class label, one of `labels` when given)."""
    problems = Problems(path, on_error)
    parse_label = parse_label or (lambda value: class_label(value, labels))
    columns = (text_a, text_b, label_column)
    examples = []
    for line, row in table_rows(path, format, header, encoding, problems):
        try:
            a, b, label = (None if c is None else cell(row, c) for c in columns)
            if not isinstance(a, str) or (text_b is not None and not isinstance(b, str)):
                raise Malformed("a text column is not a string")
            examples.append(TextExample(a, b, parse_label(label)))
        except Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(examples)


def cell(row: dict | list, column: str | int) -> Any:
    try:
        return row[column]
    except (KeyError, IndexError):
        raise Malformed(f"column {column!r} is missing") from None


def table_rows(
    path: str, format: str, header: bool, encoding: str, problems: Problems
) -> Iterator[tuple[int, dict | list]]:
    """(line, row) of a TSV, CSV or JSON-lines file; a row is addressable by column name
    (header or JSON key) and, for TSV and CSV, by 0-based index."""
    lines = numbered_lines(path, encoding, problems)
    return _json_rows(lines, problems) if format == "jsonl" else _delimited_rows(lines, format, header, problems)


def _delimited_rows(
    lines: Iterator[tuple[int, str]], format: str, header: bool, problems: Problems
) -> Iterator[tuple[int, dict | list]]:
    """(first line of the record, row) pairs; rows are dicts by header name and also
    indexable by position, so a column may be given either way."""
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if format == "tsv" else {}
    seen: list[int] = []  # line numbers handed to csv, so a record knows where it began

    def text() -> Iterator[str]:
        for number, line in lines:
            seen.append(number)
            yield line

    reader = csv.reader(text(), **dialect)
    names: list[str] | None = None
    width: int | None = None
    while True:
        mark = len(seen)
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:  # e.g. an unterminated quote in a CSV
            problems.report(seen[mark] if len(seen) > mark else None, f"unreadable row ({err})")
            continue
        line = seen[mark]
        if not row or row == [""]:
            continue
        if header and names is None:
            names, width = [c.strip() for c in row], len(row)
            continue
        if width is None:
            width = len(row)
        if len(row) != width:
            problems.report(line, f"{len(row)} columns where {width} were expected")
            continue
        yield line, _Row(row, names)


class _Row(dict):
    """A row addressable by header name or by 0-based index."""

    def __init__(self, cells: list[str], names: list[str] | None) -> None:
        super().__init__(zip(names, cells) if names else ())
        self.cells = cells

    def __getitem__(self, key):
        return self.cells[key] if isinstance(key, int) else super().__getitem__(key)


def _json_rows(lines: Iterator[tuple[int, str]], problems: Problems) -> Iterator[tuple[int, dict]]:
    for line, text in lines:
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            problems.report(line, f"invalid JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            problems.report(line, "the line is not a JSON object")
            continue
        yield line, row


_FASTTEXT_LABEL = "__label__"


def read_fasttext(
    path: str, *, labels: list[str] | None = None, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise"
) -> ReadResult:
    """TextExamples from fastText-style lines, `__label__pos the text ...` (the
    pang_lee_polarity.cor sample). Labels are stored without the prefix; a line with no
    label, several labels or no text is malformed."""
    problems = Problems(path, on_error)
    examples = []
    for line, text in numbered_lines(path, encoding, problems):
        words = text.split()
        if not words:
            continue
        tags = [w for w in words if w.startswith(_FASTTEXT_LABEL)]
        rest = [w for w in words if not w.startswith(_FASTTEXT_LABEL)]
        try:
            if len(tags) != 1:
                raise Malformed(f"expected one {_FASTTEXT_LABEL}LABEL, found {len(tags)}")
            if not rest:
                raise Malformed("the line has a label but no text")
            examples.append(TextExample(" ".join(rest), None, class_label(tags[0][len(_FASTTEXT_LABEL) :], labels)))
        except Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(examples)


def expected_rows(format: str, columns: list[str | int | None], header: bool) -> str:
    """What a file of text rows should hold, in a few words, for the message about one
    that holds nothing usable."""
    named = " and ".join(repr(c) for c in columns if c is not None)
    first = "a header line, then " if header else ""
    return {
        "tsv": f"{first}tab-separated rows with columns {named}",
        "csv": f"{first}comma-separated rows with columns {named}",
        "jsonl": f"one JSON object per line with keys {named}",
        "fasttext": "lines of `__label__<label> <text>`",
    }[format]
