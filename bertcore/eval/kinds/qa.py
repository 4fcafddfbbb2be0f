"""Extractive question answering (SQuAD v1.1 and v2.0): the answer is a span of the
context, found by start and end scores per token; scored by exact match and F1 with the
official answer normalisation.

A context longer than one input is covered by overlapping windows, each laid out as
`[CLS] question [SEP] context-piece [SEP]` by the tokenizer itself (so RoBERTa-style
templates work too). Windows start `doc_stride` context tokens apart, as in Google's
run_squad. Offsets from the fast tokenizer map every context token back to characters,
so answers are cut from the original context, never detokenized.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import fsspec

from bertcore.eval.kinds.base import Feature, HeadShape, Judged, Lengths, TaskKind
from bertcore.eval.readers import Malformed, Problems, ReadResult
from bertcore.eval.settings import Split, TaskSettings

if TYPE_CHECKING:
    import numpy as np
    import torch


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


class ExtractiveQA(TaskKind):
    name: ClassVar[str] = "qa"
    summary: ClassVar[str] = "extractive answer spans, SQuAD"
    formats: ClassVar[tuple[str, ...]] = ("squad",)
    primary_metric: ClassVar[str] = "f1"
    pooled: ClassVar[bool] = False
    head_shape: ClassVar[HeadShape] = "span"

    def check(self, task: TaskSettings) -> None:
        if task.max_query_length + 4 >= task.max_seq_length:
            raise ValueError("max_query_length leaves no room for context within max_seq_length")

    def read(self, task: TaskSettings, split: Split, labels: list[str] | None = None) -> ReadResult:
        return read_squad(
            getattr(task, split), version_2=task.version_2, encoding=task.encoding, on_error=task.on_error
        )

    def expected(self, task: TaskSettings) -> str:
        return (
            'SQuAD JSON: {"data": [{"paragraphs": [{"context": ..., "qas": [{"id": ..., "question": ..., '
            '"answers": [...]}]}]}]} with at least one question'
        )

    def features(self, examples: Sequence[QAExample], tokenizer, task: TaskSettings, labels: list[str]):
        """One feature per window, labelled (start, end) of the answer in it; the windows are what decoding needs."""
        windows = build_windows(
            examples,
            tokenizer,
            max_seq_length=task.max_seq_length,
            doc_stride=task.doc_stride,
            max_query_length=task.max_query_length,
        )
        return [Feature(w.input_ids, w.token_type_ids, (w.start_position, w.end_position)) for w in windows], windows

    def num_outputs(self, labels: list[str]) -> int:
        return 2

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from torch import nn

        start, end = logits.unbind(-1)  # (B, T) each; labels (B, 2)
        return (nn.functional.cross_entropy(start, labels[:, 0]) + nn.functional.cross_entropy(end, labels[:, 1])) / 2

    def score(self, task: TaskSettings, labels: list[str], examples: list[QAExample], outputs: list, extra) -> dict:
        from bertcore.eval import metrics

        spans = decode_spans(
            examples,
            extra,
            [o[:, 0] for o in outputs],
            [o[:, 1] for o in outputs],
            n_best=task.n_best,
            max_answer_length=task.max_answer_length,
        )
        golds = {e.id: [a.text for a in e.answers] for e in examples}
        answers = final_answers(spans, version_2=task.version_2, null_score_threshold=task.null_score_threshold)
        out = metrics.squad_scores(answers, golds)
        if task.version_2:
            out.update(best_null_threshold(spans, golds))
        return out

    def pair(self, task: TaskSettings) -> bool:
        return True

    def text_parts(self, example: QAExample) -> tuple[str, ...]:
        return (example.question, example.context)

    def given(self, example: QAExample) -> str:
        return example.answers[0].text if example.answers else "(no answer)"

    def classes(self, task: TaskSettings, labels: list[str]) -> None:
        return None

    def judge(
        self, task: TaskSettings, labels: list[str], examples: list[QAExample], outputs: list, extra
    ) -> list[Judged]:
        """Per question, the predicted span beside the given answers; its loss is 1 - F1."""
        from bertcore.eval.metrics import squad_f1

        spans = decode_spans(
            examples,
            extra,
            [o[:, 0] for o in outputs],
            [o[:, 1] for o in outputs],
            n_best=task.n_best,
            max_answer_length=task.max_answer_length,
        )
        answers = final_answers(spans, version_2=task.version_2, null_score_threshold=task.null_score_threshold)
        out = []
        for example in examples:
            predicted = answers.get(example.id, "")
            f1 = squad_f1(predicted, [a.text for a in example.answers])  # no answers: only "" is right
            view = f"question: {example.question}"
            out.append(Judged(self.given(example), predicted or "(no answer)", 1.0 - f1, view=view))
        return out

    def lengths(self, tokenizer, examples: list[QAExample], task: TaskSettings) -> Lengths:
        """Contexts are read in windows doc_stride apart, so no context is cut; questions
        longer than max_query_length are."""
        questions = tokenizer([e.question for e in examples], add_special_tokens=False, verbose=False)["input_ids"]
        sizes = [len(q) for q in questions]
        pairs = tokenizer(
            [e.question for e in examples], [e.context for e in examples], truncation=False, verbose=False
        )["input_ids"]
        longer = sum(len(ids) > task.max_seq_length for ids in pairs)
        cut = sum(n > task.max_query_length for n in sizes)
        note = (
            f"contexts longer than a window are read in windows {task.doc_stride} tokens apart (nothing cut); "
            f"the cut counts questions longer than max_query_length {task.max_query_length}"
        )
        tokens = sum(len(ids) for ids in pairs)
        return Lengths(len(examples), longer, cut, tokens, sum(max(0, n - task.max_query_length) for n in sizes), note)

    def decode(self, logits: np.ndarray, labels: list[str]) -> dict[str, int]:
        """The likeliest start and end token of one window's (T, 2) scores, each on its own."""
        return {"start": int(logits[:, 0].argmax()), "end": int(logits[:, 1].argmax())}


# --- SQuAD files ---------------------------------------------------------------------------


def read_squad(
    path: str, *, version_2: bool = False, encoding: str = "utf-8", on_error: Literal["raise", "skip"] = "raise"
) -> ReadResult:
    """QAExamples from a SQuAD v1.1 or v2.0 JSON file. Every answer must lie inside its
    context with its text found exactly at answer_start; a question without answers (or
    is_impossible) is malformed unless version_2. Problems are reported with the line of
    the question's id in the file (SQuAD files are often a single line) and the id."""
    problems = Problems(path, on_error)
    fatal = Problems(path, "raise")  # a file that does not parse has nothing to skip to
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
                except Malformed as problem:
                    problems.report(line_of(qid), f"question {qid!r}: {problem}")
                    continue
                line_of(qid)  # advance the cursor past this id
    return problems.result(examples)


def _squad_example(qa: dict, qid: str, context: str, version_2: bool) -> QAExample:
    if not qid:
        raise Malformed("the question has no id")
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise Malformed("the question text is missing")
    impossible = bool(qa.get("is_impossible", False))
    answers = [] if impossible else qa.get("answers", [])
    if impossible and not version_2:
        raise Malformed("is_impossible is set but version_2 is false")
    if not answers and not version_2:
        raise Malformed("no answers (set version_2 for unanswerable questions)")
    checked = []
    for answer in answers:
        text, start = answer.get("text"), answer.get("answer_start")
        if not isinstance(text, str) or not text or not isinstance(start, int):
            raise Malformed("an answer lacks its text or answer_start")
        if start < 0 or start + len(text) > len(context):
            raise Malformed(f"answer {text!r} at {start} lies outside the context ({len(context)} characters)")
        if context[start : start + len(text)] != text:
            raise Malformed(
                f"answer {text!r} is not at answer_start {start} (found {context[start : start + len(text)]!r})"
            )
        checked.append(Answer(text, start))
    return QAExample(qid, question, context, tuple(checked))


# --- windows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QAWindow:
    """One model input cut from one example (not padded)."""

    example_index: int
    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int] | None]
    """Character span in the context of each context token; None for question and special tokens."""
    max_context: list[bool]
    """True where this window gives the token more context on both sides than any other window (Google's rule; a span
    may only start at such a token)."""
    start_position: int
    end_position: int
    """Token indexes of the first answer in this window; both the [CLS] index when the answer is absent or not wholly
    inside."""
    cls_index: int


def build_windows(
    examples: Sequence[QAExample],
    tokenizer,
    *,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
) -> list[QAWindow]:
    """Windows for every example, in example order. `tokenizer` is a transformers fast
    tokenizer (offsets and sequence ids come from its Rust encodings)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("build_windows needs a fast tokenizer (tokenizer.json) for character offsets")
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    windows: list[QAWindow] = []
    for index, example in enumerate(examples):
        question = _cut_question(example.question, tokenizer, max_query_length)
        question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
        room = max_seq_length - question_tokens - specials  # context tokens per window
        if room < 1:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for context after the question")
        # Hugging Face's `stride` is the overlap between windows; Google's doc_stride is the step.
        overlap = max(0, room - doc_stride)
        encoded = tokenizer(
            question,
            example.context,
            truncation="only_second",
            max_length=max_seq_length,
            stride=overlap,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_token_type_ids=True,
        )
        first = len(windows)
        for w in range(len(encoded["input_ids"])):
            sequence_ids = encoded.sequence_ids(w)
            offsets = [
                tuple(span) if sid == 1 else None for sid, span in zip(sequence_ids, encoded["offset_mapping"][w])
            ]
            ids = list(encoded["input_ids"][w])
            cls_index = ids.index(tokenizer.cls_token_id) if tokenizer.cls_token_id in ids else 0
            start, end = _answer_tokens(example, offsets, cls_index)
            windows.append(QAWindow(index, ids, list(encoded["token_type_ids"][w]), offsets, [], start, end, cls_index))
        _mark_max_context(windows[first:])
    return windows


def _cut_question(question: str, tokenizer, max_query_length: int) -> str:
    encoded = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    if len(offsets) <= max_query_length:
        return question
    return question[: offsets[max_query_length - 1][1]]


def _answer_tokens(example: QAExample, offsets: list[tuple[int, int] | None], cls_index: int) -> tuple[int, int]:
    if not example.answers:
        return cls_index, cls_index
    answer = example.answers[0]
    first_char, last_char = answer.start, answer.start + len(answer.text)  # [first, last)
    context = [i for i, span in enumerate(offsets) if span is not None]
    if not context or offsets[context[0]][0] > first_char or offsets[context[-1]][1] < last_char:
        return cls_index, cls_index
    start = max(i for i in context if offsets[i][0] <= first_char)
    end = min(i for i in context if offsets[i][1] >= last_char)
    return start, end


def _mark_max_context(windows: list[QAWindow]) -> None:
    # score = min(tokens to the left, tokens to the right) + 0.01 * window length, per
    # token; the window with the highest score owns the token.
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for w, window in enumerate(windows):
        positions = [i for i, span in enumerate(window.offsets) if span is not None]
        for j, i in enumerate(positions):
            score = min(j, len(positions) - 1 - j) + 0.01 * len(positions)
            key = window.offsets[i]
            if key not in best or score > best[key][0]:
                best[key] = (score, w)
    for w, window in enumerate(windows):
        window.max_context.extend(span is not None and best[span][1] == w for span in window.offsets)


@dataclass(frozen=True)
class SpanPrediction:
    """The best non-empty span of one question and the no-answer score beside it."""

    text: str
    score: float
    """start logit + end logit of the best span; -inf when no valid span exists."""
    null_score: float
    """Smallest [CLS] start + end logit over the question's windows (SQuAD 2.0 no-answer score)."""

    @property
    def null_diff(self) -> float:
        """How much more the model believes in no answer than in the best span."""
        return self.null_score - self.score


def decode_spans(
    examples: Sequence[QAExample],
    windows: Sequence[QAWindow],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> dict[str, SpanPrediction]:
    """Best span per question id over all of its windows: among the `n_best` highest start
    and end logits of each window, pairs inside the context, end >= start, at most
    max_answer_length tokens, starting where the window has the token's maximum context.
    Logit arrays may be longer than their window (padding is ignored)."""
    import numpy as np

    per_example: dict[int, list[int]] = {}
    for w, window in enumerate(windows):
        per_example.setdefault(window.example_index, []).append(w)
    predictions = {}
    for index, example in enumerate(examples):
        best_score, best_text, null_score = -math.inf, "", math.inf
        for w in per_example.get(index, []):
            window = windows[w]
            n = len(window.input_ids)
            starts, ends = np.asarray(start_logits[w][:n], dtype=float), np.asarray(end_logits[w][:n], dtype=float)
            null_score = min(null_score, starts[window.cls_index] + ends[window.cls_index])
            for s in np.argsort(-starts, kind="stable")[:n_best]:
                if window.offsets[s] is None or not window.max_context[s]:
                    continue
                for e in np.argsort(-ends, kind="stable")[:n_best]:
                    if window.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    score = starts[s] + ends[e]
                    if score > best_score:
                        best_score = float(score)
                        best_text = example.context[window.offsets[s][0] : window.offsets[e][1]]
        predictions[example.id] = SpanPrediction(best_text, best_score, float(null_score))
    return predictions


def final_answers(
    spans: Mapping[str, SpanPrediction], *, version_2: bool, null_score_threshold: float = 0.0
) -> dict[str, str]:
    """Answer text per id: the best span, or "" (no answer) under version_2 when the null
    score exceeds the best span's score by more than the threshold."""
    if not version_2:
        return {qid: span.text for qid, span in spans.items()}
    return {qid: "" if span.null_diff > null_score_threshold else span.text for qid, span in spans.items()}


def best_null_threshold(spans: Mapping[str, SpanPrediction], golds: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """The threshold on `null_diff` that maximises mean F1 (and, separately, exact match)
    over `golds`, as SQuAD 2.0's evaluation script searches it: questions are switched
    from no-answer to their span in increasing null_diff order."""
    from bertcore.eval.metrics import squad_exact, squad_f1

    result = {}
    for name, score in (("f1", squad_f1), ("exact_match", squad_exact)):
        # Start with every question answered "": the score is the share of no-answer golds.
        current = sum(score("", golds[qid]) for qid in golds)
        best, threshold = current, -math.inf
        for qid in sorted(golds, key=lambda q: spans[q].null_diff if q in spans else math.inf):
            if qid not in spans:
                continue
            current += score(spans[qid].text, golds[qid]) - score("", golds[qid])
            if current > best:
                best, threshold = current, spans[qid].null_diff
        result[f"best_{name}"] = best / len(golds)
        result[f"best_{name}_threshold"] = threshold
    return result
