"""SQuAD windows and span decoding with a WordPiece tokenizer trained in-process."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertcore.eval.kinds import qa
from bertcore.eval.kinds.qa import Answer, QAExample
from bertcore.eval.metrics import squad_scores

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
CONTEXT = " ".join(f"{w} {n}" for n, w in enumerate(WORDS))  # "alpha 0 bravo 1 ... papa 15": 32 words


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    corpus = [CONTEXT, "what comes after which word ? where is it"] * 3
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    # The generic fast class with named special tokens, as bertcore.vocab.tokenizer saves it.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    )


def example(qid: str, word: str | None, question: str = "what comes after which word ?") -> QAExample:
    answers = () if word is None else (Answer(word, f" {CONTEXT} ".index(f" {word} ")),)
    return QAExample(qid, question, CONTEXT, answers)


def windows_for(examples, tokenizer, max_seq_length=24, doc_stride=7, max_query_length=16):
    return qa.build_windows(
        examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride, max_query_length=max_query_length
    )


def test_windows_step_by_doc_stride_and_cover_the_context(tokenizer):
    windows = windows_for([example("q", "papa")], tokenizer)
    context_offsets = tokenizer(CONTEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    first_tokens = []
    for w in windows:
        assert len(w.input_ids) <= 24
        spans = [span for span in w.offsets if span is not None]
        first_tokens.append(context_offsets.index(spans[0]))
    assert len(windows) > 2
    assert first_tokens == [7 * i for i in range(len(windows))]  # Google's doc_stride: the step
    covered = {span for w in windows for span in w.offsets if span is not None}
    assert covered == {tuple(span) for span in context_offsets}
    # every context token is "max context" in exactly one window
    owners = [
        sum(w.max_context[i] for w in windows for i, span in enumerate(w.offsets) if span == key) for key in covered
    ]
    assert owners == [1] * len(covered)


def test_labels_point_at_the_answer_or_at_cls(tokenizer):
    ex = example("q", "lima")
    windows = windows_for([ex], tokenizer)
    inside = [w for w in windows if w.start_position != w.cls_index]
    assert inside, "some window holds the answer"
    for w in inside:
        start, end = w.offsets[w.start_position][0], w.offsets[w.end_position][1]
        assert ex.context[start:end] == "lima"
    for w in windows:
        if w not in inside:
            assert w.start_position == w.end_position == w.cls_index == 0
            spans = [s for s in w.offsets if s is not None]
            assert not (spans[0][0] <= ex.answers[0].start and ex.answers[0].start + 4 <= spans[-1][1])
    assert all(w.start_position == w.cls_index for w in windows_for([example("n", None)], tokenizer))


def test_long_questions_are_cut_to_max_query_length(tokenizer):
    long_question = " ".join(WORDS) + " ?"
    windows = windows_for([example("q", "golf", long_question)], tokenizer, max_seq_length=32, max_query_length=5)
    separator = windows[0].input_ids.index(tokenizer.sep_token_id)
    assert separator - 1 == 5  # [CLS] + five question tokens


def oracle_logits(windows, big=10.0):
    """Logits that put the labelled start/end of every window far above everything else."""
    starts, ends = [], []
    for w in windows:
        s, e = np.zeros(len(w.input_ids) + 3), np.zeros(len(w.input_ids) + 3)  # longer: padding
        s[w.start_position] = e[w.end_position] = big
        starts.append(s)
        ends.append(e)
    return starts, ends


def test_oracle_logits_decode_to_the_gold_answers(tokenizer):
    examples = [example(f"q{i}", w) for i, w in enumerate(["alpha", "echo", "kilo", "papa", "mike"])]
    windows = windows_for(examples, tokenizer)
    starts, ends = oracle_logits(windows)
    spans = qa.decode_spans(examples, windows, starts, ends)
    answers = qa.final_answers(spans, version_2=False)
    assert answers == {"q0": "alpha", "q1": "echo", "q2": "kilo", "q3": "papa", "q4": "mike"}
    golds = {e.id: [a.text for a in e.answers] for e in examples}
    assert squad_scores(answers, golds)["exact_match"] == 1.0


def test_answers_keep_the_original_characters(tokenizer):
    context = "Ciudad de MÉXICO, 1968."
    ex = QAExample("q", "where is it ?", context, (Answer("MÉXICO", 10),))
    windows = windows_for([ex], tokenizer, max_seq_length=32)
    starts, ends = oracle_logits(windows)
    assert qa.decode_spans([ex], windows, starts, ends)["q"].text == "MÉXICO"


def test_decoding_respects_max_answer_length_and_order(tokenizer):
    ex = example("q", "golf")
    (window,) = windows_for([ex], tokenizer, max_seq_length=64)
    context = [i for i, span in enumerate(window.offsets) if span is not None]
    starts, ends = np.zeros(len(window.input_ids)), np.zeros(len(window.input_ids))
    starts[context[2]], ends[context[9]] = 10.0, 10.0  # best pair: 8 tokens long
    starts[context[5]], ends[context[6]] = 6.0, 6.0  # runner-up: 2 tokens
    ends[context[1]] = 20.0  # ends before every good start: never usable ...
    starts[context[0]] = starts[context[1]] = -100.0  # ... and the starts before it are poor
    short = qa.decode_spans([ex], [window], [starts], [ends], max_answer_length=3)["q"]
    long = qa.decode_spans([ex], [window], [starts], [ends], max_answer_length=30)["q"]
    assert long.text == CONTEXT[window.offsets[context[2]][0] : window.offsets[context[9]][1]]
    assert short.text == CONTEXT[window.offsets[context[5]][0] : window.offsets[context[6]][1]]
    assert short.score == pytest.approx(12.0)


def test_null_score_decides_no_answer_under_version_2(tokenizer):
    ex = example("q", None)
    windows = windows_for([ex], tokenizer)
    starts, ends = oracle_logits(windows)  # every window says [CLS]: null score 20
    for w, (s, e) in enumerate(zip(starts, ends)):
        context = [i for i, span in enumerate(windows[w].offsets) if span is not None]
        s[context[0]] = e[context[0]] = 4.0  # a one-token span scoring 8 in each window
    span = qa.decode_spans([ex], windows, starts, ends)["q"]
    assert (span.null_score, span.score, span.null_diff) == (20.0, 8.0, 12.0)
    assert qa.final_answers({"q": span}, version_2=True)["q"] == ""
    assert qa.final_answers({"q": span}, version_2=True, null_score_threshold=13.0)["q"] == span.text != ""
    assert qa.final_answers({"q": span}, version_2=False)["q"] == span.text


def test_best_null_threshold_as_squad_2_searches_it():
    spans = {
        "q1": qa.SpanPrediction("paris", score=3.0, null_score=2.0),  # diff -1, right
        "q2": qa.SpanPrediction("foo", score=1.0, null_score=1.5),  # diff 0.5, should be ""
        "q3": qa.SpanPrediction("oslo", score=0.0, null_score=1.0),  # diff 1.0, wrong anyway
    }
    golds = {"q1": ["Paris"], "q2": [], "q3": ["Lima"]}
    best = qa.best_null_threshold(spans, golds)
    assert best["best_f1"] == pytest.approx(2 / 3) and best["best_f1_threshold"] == -1.0
    answers = qa.final_answers(spans, version_2=True, null_score_threshold=best["best_f1_threshold"])
    assert squad_scores(answers, golds)["f1"] == pytest.approx(best["best_f1"])
    # no threshold beats answering nothing when every span is wrong
    wrong = {q: qa.SpanPrediction("nope", 1.0, 0.0) for q in golds}
    assert qa.best_null_threshold(wrong, golds)["best_f1_threshold"] == -math.inf


def test_slow_tokenizers_are_refused():
    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="fast tokenizer"):
        qa.build_windows([], Slow(), max_seq_length=32, doc_stride=8, max_query_length=8)
