"""Metric code against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from bertcore.eval import metrics as m

# --- classification and correlation --------------------------------------------------------

GOLD = [1, 0, 1, 1]
PRED = [1, 1, 1, 0]  # tp=2, fp=1, fn=1, tn=0


def test_classification_scores_by_hand():
    assert m.accuracy(GOLD, PRED) == 0.5
    assert m.f1(GOLD, PRED) == pytest.approx(2 / 3)  # P = R = 2/3
    assert m.f1(GOLD, PRED, average="macro") == pytest.approx((2 / 3 + 0) / 2)
    assert m.matthews(GOLD, PRED) == pytest.approx((2 * 0 - 1 * 1) / math.sqrt(3 * 3 * 1 * 1))


def test_binary_f1_of_a_string_positive_label():
    gold = ["neg", "pos", "pos", "neg"]
    pred = ["neg", "pos", "neg", "neg"]
    assert m.f1(gold, pred, pos_label="pos") == pytest.approx(2 / 3)  # P=1, R=1/2
    assert m.f1(gold, pred, pos_label="neg") == pytest.approx(0.8)  # P=2/3, R=1


def test_correlations_by_hand_and_undefined_cases():
    assert m.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))
    assert m.spearman([1, 2, 3], [2, 4, 7]) == pytest.approx(1.0)
    # ties get average ranks: x ranks (1, 2.5, 2.5, 4) against (1, 3, 2, 4)
    assert m.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
    assert math.isnan(m.pearson([1, 1, 1], [1, 2, 3]))
    assert math.isnan(m.spearman([1], [2]))


# --- entity-level tagging ------------------------------------------------------------------


def test_iob1_i_tag_starts_an_entity_and_b_splits_neighbours():
    gold = [["I-PER", "I-PER", "O", "I-LOC"]]
    assert m.entity_scores(gold, gold, scheme="IOB1")["f1"] == 1.0
    # I-PER B-PER is two one-word people; I-PER I-PER is one two-word person.
    scores = m.entity_scores([["I-PER", "B-PER", "O"]], [["I-PER", "I-PER", "O"]], scheme="IOB1")
    assert scores["precision"] == scores["recall"] == scores["f1"] == 0.0
    assert scores["token_accuracy"] == pytest.approx(2 / 3)
    # B- after O is still a valid entity start in IOB1 (seqeval's strict IOB1 drops it).
    assert m.entity_scores([["O", "B-PER", "O"]], [["O", "I-PER", "O"]], scheme="IOB1")["f1"] == 1.0


def test_iob2_is_strict_about_entities_opening_with_b():
    gold = [["B-PER", "I-PER", "O"]]
    pred = [["I-PER", "I-PER", "O"]]
    assert m.entity_scores(gold, pred, scheme="IOB2")["f1"] == 0.0
    assert m.entity_scores(gold, pred, scheme="BIO")["f1"] == 0.0
    assert m.entity_scores(gold, pred, scheme="IOB1")["f1"] == 1.0  # conlleval reading: same span


def test_type_mismatch_and_partial_overlap_are_errors():
    type_swap = m.entity_scores([["B-PER", "I-PER", "O"]], [["B-LOC", "I-LOC", "O"]])
    assert type_swap["f1"] == 0.0
    gold = [["B-PER", "I-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-PER", "I-PER", "O", "O", "B-LOC"]]  # PER cut short: wrong; LOC right
    scores = m.entity_scores(gold, pred)
    assert scores["precision"] == scores["recall"] == scores["f1"] == pytest.approx(0.5)
    assert scores["token_accuracy"] == pytest.approx(0.8)


def test_entities_do_not_cross_sentences_and_iobes_is_strict():
    # Read as one stream, gold would hold a single person spanning the sentence break.
    scores = m.entity_scores([["O", "I-PER"], ["I-PER", "O"]], [["O", "I-PER"], ["O", "O"]], scheme="IOB1")
    assert (scores["precision"], scores["recall"]) == (1.0, 0.5)
    iobes = m.entity_scores([["S-PER", "B-LOC", "E-LOC"]], [["S-PER", "B-LOC", "I-LOC"]], scheme="IOBES")
    assert (iobes["precision"], iobes["recall"]) == (1.0, 0.5)
    assert iobes["f1"] == pytest.approx(2 / 3)


def test_entity_scores_reject_misaligned_sequences():
    with pytest.raises(ValueError, match="differ in length"):
        m.entity_scores([["O", "B-PER"]], [["O"]])


# --- SQuAD ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an apple, a pear", "apple pear"),
        ("theatre Anthem", "theatre anthem"),  # articles only as whole words
        ("A.B.C.", "abc"),  # punctuation goes first, then "abc" is no article
        ("the", ""),
        ("don't", "dont"),
        ("  1,000\tmiles ", "1000 miles"),
        ("“Quoted”", "“quoted”"),  # only ASCII punctuation is removed, as in the official script
    ],
)
def test_normalize_answer(text, expected):
    assert m.normalize_answer(text) == expected


def test_squad_exact_and_f1_take_the_best_gold():
    assert m.squad_exact("Eiffel Tower", ["the Eiffel Tower", "Paris"]) == 1.0
    assert m.squad_exact("Tower", ["the Eiffel Tower"]) == 0.0
    # pred {tower, in, paris} vs {eiffel, tower}: P=1/3, R=1/2 -> 0.4; vs {paris}: P=1/3, R=1 -> 0.5
    assert m.squad_f1("Tower in Paris", ["the Eiffel Tower"]) == pytest.approx(0.4)
    assert m.squad_f1("Tower in Paris", ["the Eiffel Tower", "Paris"]) == pytest.approx(0.5)
    assert m.squad_f1("x y y", ["y y y"]) == pytest.approx(2 / 3)  # repeated tokens count once each
    assert m.squad_f1("nothing shared", ["Paris"]) == 0.0


def test_squad_v2_empty_answers():
    assert m.squad_exact("", []) == m.squad_f1("", []) == 1.0
    assert m.squad_exact("Paris", []) == m.squad_f1("Paris", []) == 0.0
    assert m.squad_exact("", ["Paris"]) == m.squad_f1("", ["Paris"]) == 0.0
    # gold answers that normalise to nothing count as no answer
    assert m.squad_exact("", ["the", "."]) == 1.0


def test_squad_scores_split_answerable_and_unanswerable():
    golds = {"a": ["Paris"], "b": [], "c": ["x y"], "d": ["Lima"]}
    predictions = {"a": "paris.", "b": "", "c": "x"}  # "d" missing: counts as ""
    scores = m.squad_scores(predictions, golds)
    assert scores["exact_match"] == pytest.approx(2 / 4)
    assert scores["f1"] == pytest.approx((1 + 1 + 2 / 3 + 0) / 4)
    assert scores["has_answer_exact_match"] == pytest.approx(1 / 3)
    assert scores["has_answer_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert scores["no_answer_exact_match"] == 1.0
    assert (scores["has_answer_count"], scores["no_answer_count"]) == (3, 1)
    assert set(m.squad_scores({"a": "Paris"}, {"a": ["Paris"]})) == {"exact_match", "f1"}


# --- pretraining metrics -------------------------------------------------------------------


def test_pretraining_meter_weights_by_token_and_ignores_unlabelled():
    meter = m.PretrainingMeter()
    mlm_logits = torch.tensor([[[2.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 5.0, 0.0]]])  # (1, 3, 3)
    mlm_labels = torch.tensor([[0, 1, -100]])
    meter.update(mlm_logits, mlm_labels, torch.tensor([[1.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 0, -1]))
    meter.update(torch.tensor([[0.0, 0.0, 4.0]]), torch.tensor([2]))  # gathered positions, (N, V)
    losses = [math.log(math.exp(2) + 2) - 2, math.log(math.exp(10) + 2), math.log(math.exp(4) + 2) - 4]
    nsp_losses = [math.log(math.e + 1) - 1, math.log(math.e + 1)]
    result = meter.result()
    assert result["mlm_loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    assert result["mlm_perplexity"] == pytest.approx(math.exp(sum(losses) / 3), rel=1e-5)
    assert result["mlm_accuracy"] == pytest.approx(2 / 3)
    assert result["nsp_accuracy"] == 0.5
    assert result["nsp_loss"] == pytest.approx(sum(nsp_losses) / 2, rel=1e-5)
    assert m.PretrainingMeter().result() == {}


# --- over seeds ----------------------------------------------------------------------------


def test_summary_over_seeds():
    s = m.summarize([0.8, 0.9, 0.7])
    assert (s["median"], s["min"], s["max"], s["n"]) == (pytest.approx(0.8), 0.7, 0.9, 3)
    assert s["std"] == pytest.approx(0.1)
    one = m.summarize([0.5, float("nan")])
    assert (one["median"], one["std"], one["n"], one["n_nan"]) == (0.5, 0.0, 1, 1)
    runs = m.summarize_runs([{"a": 1.0, "b": 2.0}, {"a": 3.0}])
    assert runs["a"]["median"] == 2.0 and runs["b"]["n"] == 1 and runs["b"]["n_nan"] == 1
