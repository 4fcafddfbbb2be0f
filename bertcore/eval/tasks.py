# Over 500 lines on purpose: the readers of every task file format, each small, with the row checks they share; splitting by format would scatter those checks.
"""The readers of fine-tuning task files.

A task is one labelled data set (SST-2, MRPC, CoNLL-2003, SQuAD, a company's own TSV)
described by a `TaskConfig` (bertcore/eval/config.py); the readers turn its files into plain example records.
Readers check every row: a malformed one raises a TaskDataError (a ValueError and a
bertpipe InputDataError) naming the file and the 1-based line, or, with on_error="skip",
is left out and counted in `ReadResult.skipped`. (About 500 lines: one reader per file
format, each short, sharing the row checks above them.)
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec

from bertcore.errors import InputDataError
from bertcore.eval.config import Split, TaskConfig
from bertcore.rng import keyed_seed


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


@dataclass(frozen=True)
class TaggedSentence:
    """Words with one tag each (CoNLL)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    start: int
    """Character offset of `text` in the context."""


@dataclass(frozen=True)
class QAExample:
    """A question on a context; `answers` is empty when the question has no answer (v2)."""

    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]


@dataclass
class ReadResult:
    """What a reader returns: the good examples and how many malformed rows were skipped."""

    examples: list
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    """The first problems met when skipping ("file:line: reason"), for the report."""


class _Problems:
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


class _Malformed(Exception):
    """A row-level problem, turned into `_Problems.report` by the reader's loop."""


def _lines(path: str, encoding: str, problems: _Problems) -> Iterator[tuple[int, str]]:
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


def _class_label(value: Any, labels: list[str] | None) -> str:
    if value is None:
        raise _Malformed("the label is missing")
    label = str(value).strip()
    if labels is not None and label not in labels:
        raise _Malformed(f"label {label!r} is not one of {labels}")
    return label


def _score(value: Any) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise _Malformed(f"score {value!r} is not a number") from None
    if not math.isfinite(score):
        raise _Malformed(f"score {value!r} is not finite")
    return score


def _label_parser(task_type: str, labels: list[str] | None) -> Callable[[Any], str | float]:
    return _score if task_type == "regression" else (lambda value: _class_label(value, labels))


# --- tsv / csv / jsonl / fasttext ----------------------------------------------------------


def read_rows(
    path: str,
    *,
    format: Literal["tsv", "csv", "jsonl"],
    text_a: str | int,
    text_b: str | int | None = None,
    label_column: str | int = "label",
    task_type: Literal["classification", "regression"] = "classification",
    labels: list[str] | None = None,
    header: bool = True,
    encoding: str = "utf-8",
    on_error: Literal["raise", "skip"] = "raise",
) -> ReadResult:
    """TextExamples from delimited rows or JSON lines. TSV is read without quote handling
    (GLUE's files contain stray quotes); CSV follows RFC 4180 quoting. Blank lines are
    ignored. A row with a different number of columns than the header (or the first row,
    without a header) is malformed."""
    problems = _Problems(path, on_error)
    parse_label = _label_parser(task_type, labels)
    lines = _lines(path, encoding, problems)
    rows = _json_rows(lines, problems) if format == "jsonl" else _delimited_rows(lines, format, header, problems)
    columns = (text_a, text_b, label_column)
    examples = []
    for line, row in rows:
        try:
            a, b, label = (None if c is None else _cell(row, c) for c in columns)
            if not isinstance(a, str) or (text_b is not None and not isinstance(b, str)):
                raise _Malformed("a text column is not a string")
            examples.append(TextExample(a, b, parse_label(label)))
        except _Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(examples)


def _cell(row: dict | list, column: str | int) -> Any:
    try:
        return row[column]
    except (KeyError, IndexError):
        raise _Malformed(f"column {column!r} is missing") from None


def _delimited_rows(
    lines: Iterator[tuple[int, str]], format: str, header: bool, problems: _Problems
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


def _json_rows(lines: Iterator[tuple[int, str]], problems: _Problems) -> Iterator[tuple[int, dict]]:
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
    problems = _Problems(path, on_error)
    examples = []
    for line, text in _lines(path, encoding, problems):
        words = text.split()
        if not words:
            continue
        tags = [w for w in words if w.startswith(_FASTTEXT_LABEL)]
        rest = [w for w in words if not w.startswith(_FASTTEXT_LABEL)]
        try:
            if len(tags) != 1:
                raise _Malformed(f"expected one {_FASTTEXT_LABEL}LABEL, found {len(tags)}")
            if not rest:
                raise _Malformed("the line has a label but no text")
            examples.append(TextExample(" ".join(rest), None, _class_label(tags[0][len(_FASTTEXT_LABEL) :], labels)))
        except _Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(examples)


# --- CoNLL ---------------------------------------------------------------------------------

_TAG = re.compile(r"^(O|[BIES]-\S+)$")


def read_conll(
    path: str, *, labels: list[str] | None = None, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise"
) -> ReadResult:
    """TaggedSentences from a CoNLL-2003 style file: one token per line, its tag in the last
    column, blank lines between sentences, -DOCSTART- lines ignored. A line with a single
    column, or a tag outside `labels` (or, with no list, not O/B-/I-/E-/S-TYPE), makes its
    sentence malformed; skipping drops the whole sentence and counts it once."""
    problems = _Problems(path, on_error)
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

    for line, text in _lines(path, encoding, problems):
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


# --- SQuAD ---------------------------------------------------------------------------------


def read_squad(
    path: str, *, version_2: bool = False, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise"
) -> ReadResult:
    """QAExamples from a SQuAD v1.1 or v2.0 JSON file. Every answer must lie inside its
    context with its text found exactly at answer_start; a question without answers (or
    is_impossible) is malformed unless version_2. Problems are reported with the line of
    the question's id in the file (SQuAD files are often a single line) and the id."""
    problems = _Problems(path, on_error)
    fatal = _Problems(path, "raise")  # a file that does not parse has nothing to skip to
    with fsspec.open(path, "rb", compression="infer") as f:
        data = f.read()
    try:
        raw = data.decode("utf-8-sig" if encoding.replace("-", "").lower() == "utf8" else encoding)
    except UnicodeDecodeError as err:
        fatal.report(data.count(b"\n", 0, err.start) + 1, f"not valid {encoding} (set the task's encoding)")
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as err:
        fatal.report(err.lineno, f"invalid JSON ({err.msg})")
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        fatal.report(1, 'not a SQuAD file: expected {"data": [...]} at the top')

    # Ids appear in file order, so each is looked up after the previous one: a line number
    # without a position-tracking JSON parser.
    cursor = 0

    def line_of(qid: str) -> int | None:
        nonlocal cursor
        found = raw.find(json.dumps(qid), cursor)
        if found < 0:
            found = raw.find(json.dumps(qid, ensure_ascii=False), cursor)
        if found < 0:
            return None
        cursor = found + 1
        return raw.count("\n", 0, found) + 1

    examples = []
    for article in document["data"]:
        for paragraph in article.get("paragraphs", []):
            context = paragraph.get("context", "")
            for qa in paragraph.get("qas", []):
                qid = str(qa.get("id", ""))
                try:
                    examples.append(_squad_example(qa, qid, context, version_2))
                except _Malformed as problem:
                    problems.report(line_of(qid), f"question {qid!r}: {problem}")
                    continue
                line_of(qid)  # advance the cursor past this id
    return problems.result(examples)


def _squad_example(qa: dict, qid: str, context: str, version_2: bool) -> QAExample:
    if not qid:
        raise _Malformed("the question has no id")
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise _Malformed("the question text is missing")
    impossible = bool(qa.get("is_impossible", False))
    answers = [] if impossible else qa.get("answers", [])
    if impossible and not version_2:
        raise _Malformed("is_impossible is set but version_2 is false")
    if not answers and not version_2:
        raise _Malformed("no answers (set version_2 for unanswerable questions)")
    checked = []
    for answer in answers:
        text, start = answer.get("text"), answer.get("answer_start")
        if not isinstance(text, str) or not text or not isinstance(start, int):
            raise _Malformed("an answer lacks its text or answer_start")
        if start < 0 or start + len(text) > len(context):
            raise _Malformed(f"answer {text!r} at {start} lies outside the context ({len(context)} characters)")
        if context[start : start + len(text)] != text:
            raise _Malformed(f"answer {text!r} is not at answer_start {start} (found {context[start:start + len(text)]!r})")
        checked.append(Answer(text, start))
    return QAExample(qid, question, context, tuple(checked))


# --- word pairs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WordPair:
    """Two words and a human similarity (or relatedness) score."""

    a: str
    b: str
    score: float


def read_word_pairs(path: str, *, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise") -> ReadResult:
    """WordPairs from `word1 word2 score` lines (tab or space separated, further columns
    ignored; blank lines and lines starting with # skipped): WordSim-353 and SimLex-999
    as gensim ships them, MEN, RW."""
    problems = _Problems(path, on_error)
    pairs = []
    for line, text in _lines(path, encoding, problems):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        columns = text.split("\t") if "\t" in text else text.split()
        try:
            if len(columns) < 3 or not columns[0].strip() or not columns[1].strip():
                raise _Malformed(f"expected word1, word2 and a score, found {text.strip()!r}")
            pairs.append(WordPair(columns[0].strip(), columns[1].strip(), _score(columns[2].strip())))
        except _Malformed as problem:
            problems.report(line, str(problem))
    return problems.result(pairs)


# --- task level ----------------------------------------------------------------------------


def read_split(task: TaskConfig, split: Split, labels: list[str] | None = None) -> ReadResult:
    """The examples of one split of `task`. `labels` overrides `task.labels` (run_task
    passes the list inferred from train when the config leaves it unset)."""
    path = getattr(task, split)
    if path is None:
        raise ValueError(f"task {task.name!r} has no {split} file")
    labels = labels if labels is not None else task.labels
    if task.format == "word_pairs":
        return read_word_pairs(path, encoding=task.encoding, on_error=task.on_error)
    if task.format == "squad":
        return read_squad(path, version_2=task.version_2, encoding=task.encoding, on_error=task.on_error)
    if task.format == "conll":
        return read_conll(path, labels=labels, encoding=task.encoding, on_error=task.on_error)
    if task.format == "fasttext":
        return read_fasttext(path, labels=labels, encoding=task.encoding, on_error=task.on_error)
    return read_rows(
        path,
        format=task.format,
        text_a=task.text_a,
        text_b=task.text_b,
        label_column=task.label_column,
        task_type=task.type,
        labels=labels,
        header=task.header,
        encoding=task.encoding,
        on_error=task.on_error,
    )


def _expected(task: TaskConfig) -> str:
    """What a file of `task` should hold, in a few words, for the message about one that holds nothing usable."""
    columns = " and ".join(repr(c) for c in (task.text_a, task.text_b, task.label_column) if c is not None)
    header = "a header line, then " if task.header else ""
    return {
        "tsv": f"{header}tab-separated rows with columns {columns}",
        "csv": f"{header}comma-separated rows with columns {columns}",
        "jsonl": f"one JSON object per line with keys {columns}",
        "fasttext": "lines of `__label__<label> <text>`",
        "conll": "sentences of one `token ... tag` line per word, separated by blank lines",
        "squad": 'SQuAD JSON: {"data": [{"paragraphs": [{"context": ..., "qas": [{"id": ..., "question": ..., "answers": [...]}]}]}]} with at least one question',
        "word_pairs": "lines of `word1 word2 score` (tab or space separated)",
    }[task.format]


def check_task_files(task: TaskConfig) -> dict[str, int]:
    """Read every file `task` names (when the task is planned, before any job starts): the
    number of examples per split, or a TaskDataError naming a file that holds none (an
    empty validation TSV, an empty CoNLL file, SQuAD's `{"data": []}`) and what it should hold."""
    counts = {}
    for split in ("train", "validation", "test"):
        path = getattr(task, split)
        if path is None:
            continue
        result = read_split(task, split)
        if not result.examples:
            skipped = f"; its {result.skipped} malformed rows were skipped, the first: {result.problems[0]}" if result.problems else ""
            raise TaskDataError(f"{path}: no examples for task {task.name!r} ({split} file){skipped}; expected {_expected(task)}")
        if split == "train" and task.type == "classification":
            seen = sorted({str(example.label) for example in result.examples})
            if len(seen) < 2:
                raise TaskDataError(
                    f"{path}: every one of its {len(result.examples)} examples has the label {seen[0]!r}; "
                    f"task {task.name!r} (classification) needs at least two labels in its train file"
                )
        folds = task.cross_validation_folds
        if split == "train" and folds is not None and len(result.examples) < folds:
            raise TaskDataError(
                f"{path}: {len(result.examples)} training examples cannot make the {folds} cross-validation folds of task "
                f"{task.name!r}; add examples or lower its cross_validation_folds"
            )
        counts[split] = len(result.examples)
    return counts


def infer_labels(task: TaskConfig, train_examples: list) -> list[str]:
    """The task's label list: `task.labels` if set, else the sorted labels seen in train."""
    if task.labels is not None:
        return list(task.labels)
    if task.type == "token_classification":
        return sorted({tag for sentence in train_examples for tag in sentence.tags})
    return sorted({example.label for example in train_examples})


def fold_splits(task: TaskConfig, examples: list) -> list[tuple[list[int], list[int]]]:
    """(train indexes, held-out indexes) per cross-validation fold. The folds depend only on
    the task name, never on the fine-tuning seed, so seeds differ by training alone.
    Classification folds keep the label proportions (when every label has k examples)."""
    from sklearn.model_selection import (  # here: the run config imports this module
        KFold,
        StratifiedKFold,
    )

    k = task.cross_validation_folds
    if k is None:
        raise ValueError(f"task {task.name!r} has no cross_validation_folds")
    if len(examples) < k:
        raise TaskDataError(f"task {task.name!r}: {len(examples)} training examples cannot make {k} folds")
    state = keyed_seed(0, task.name, "folds") % 2**32
    indexes = list(range(len(examples)))
    if task.type == "classification":
        y = [e.label for e in examples]
        if min(y.count(label) for label in set(y)) >= k:
            splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=state)
            return [(list(a), list(b)) for a, b in splitter.split(indexes, y)]
    splitter = KFold(n_splits=k, shuffle=True, random_state=state)
    return [(list(a), list(b)) for a, b in splitter.split(indexes)]
