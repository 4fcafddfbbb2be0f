"""The floors beside every score (majority class, chance, unigram MLM predictor, NSP label
balance) and the verdicts the report opens with, on numbers written here."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bertcore.eval import baselines, kinds, summary
from bertcore.eval.config import TaskConfig


def _summary(values: list[float]) -> dict:
    return {
        "median": float(np.median(values)),
        "min": min(values),
        "max": max(values),
        "std": 0.0,
        "n": len(values),
        "n_nan": 0,
    }


def _entry(
    pretrained: list[float], random_init: list[float] | None, majority: float | None = 0.5, metric: str = "accuracy"
) -> dict:
    entry = {
        "type": "classification",
        "primary_metric": metric,
        "pretrained": {"validation": {metric: _summary(pretrained)}},
    }
    if random_init is not None:
        entry["random_init"] = {"validation": {metric: _summary(random_init)}}
    if majority is not None:
        entry["baselines"] = {"validation": {"majority": {metric: majority}}}
    return entry


def test_gain_above_the_seed_spread_is_measurable():
    verdict = summary.task_verdict(_entry([0.81, 0.83, 0.80], [0.70, 0.72, 0.71]))
    assert verdict["text"] == "gain 10.0 points, above the seed spread of 3.0"
    assert verdict["measurable"] and verdict["gain"] == pytest.approx(0.10) and verdict["spread"] == pytest.approx(0.03)


def test_gain_inside_the_spread_is_no_measurable_gain():
    verdict = summary.task_verdict(_entry([0.60, 0.66, 0.58], [0.57, 0.61, 0.62]))
    assert (
        verdict["text"].startswith("no measurable gain (-1.0 points, within the seed spread of 8.0)")
        and not verdict["measurable"]
    )


def test_a_loss_beyond_the_spread_says_random_init_does_better():
    verdict = summary.task_verdict(_entry([0.696, 0.693, 0.711], [0.740, 0.724, 0.747]))
    assert verdict["text"] == "loss of 4.4 points, beyond the seed spread of 2.3: random init does better"
    assert not verdict["measurable"]


def test_both_models_at_the_majority_class_learned_nothing():
    verdict = summary.task_verdict(_entry([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]))
    assert verdict["text"] == (
        "no measurable gain (0.0 points, within the seed spread of 0.0); both models score at the "
        "majority-class level (50.0%): neither learned the task"
    )
    one = summary.task_verdict(_entry([0.70, 0.72, 0.74], [0.50, 0.50, 0.505]))
    assert one["text"].endswith("; random init scores at the majority-class level (50.0%)") and one["measurable"]


def test_one_seed_or_no_baseline_cannot_be_judged():
    undecided = summary.task_verdict(_entry([0.8], [0.7]))
    assert (
        undecided["text"]
        == "undecided: 10.0 points (add seeds to judge it); note: one seed, so no seed spread to judge it by"
    )
    assert not undecided["measurable"]
    alone = summary.task_verdict(_entry([0.8, 0.81], None))
    assert alone["text"].startswith("accuracy 80.5%; no random-init baseline") and alone["gain"] is None


def test_a_one_seed_gain_over_a_random_init_that_learned_nothing_is_a_gain_with_a_note():
    # the case that led here: 27.2 points over a random init at the majority-class level, one seed
    verdict = summary.task_verdict(_entry([0.772], [0.5], majority=0.5))
    assert verdict["text"] == (
        "gain 27.2 points; random init scores at the majority-class level (50.0%); note: one seed, so no "
        "seed spread to judge it by"
    )
    assert verdict["measurable"] and verdict["gain"] == pytest.approx(0.272)


def test_a_score_that_ignores_the_seed_is_judged_by_its_rank_among_random_draws():
    # word similarity: the pretrained model scores once; a spread of 5 random draws would
    # call 8.7 a gain, but one more random draw beats all 5 a sixth of the time.
    def entry(random_scores: list[float], score: float = 0.087) -> dict:
        out = _entry([score], random_scores, majority=None, metric="spearman")
        out["type"] = "word_similarity"
        out["random_init"]["runs"] = [{"seed": i, "validation": {"spearman": v}} for i, v in enumerate(random_scores)]
        return out

    few = summary.task_verdict(entry([0.010, 0.026, 0.032, 0.060, 0.020]))
    assert few["text"] == (
        "no measurable gain (6.1 points; rank among 5 random-init draws: p = 0.17); "
        "note: the rank test cannot go below p = 0.17 with 5 draws (19 or more reach 0.05)"
    )
    assert not few["measurable"] and few["p_value"] == pytest.approx(1 / 6)
    draws = [0.01 * (i % 5) for i in range(19)]
    many = summary.task_verdict(entry(draws, score=0.075))
    assert many["measurable"] and many["p_value"] == pytest.approx(0.05)
    assert many["text"] == "gain 5.5 points: above all 19 random-init draws (rank test p = 0.05)"
    one_above = summary.task_verdict(entry([*draws[:-1], 0.09], score=0.075))
    assert not one_above["measurable"] and one_above["p_value"] == pytest.approx(0.10)


def test_a_score_far_beyond_every_random_draw_is_a_gain_whatever_the_rank_test_resolves():
    # the case that led here: all-MiniLM-L6-v2 on SimLex-999, 47.1 against 9 draws in [-8.4, 2.1]
    draws = [-0.084, -0.060, -0.042, -0.025, -0.011, 0.003, 0.009, 0.015, 0.021]
    entry = _entry([0.471], draws, majority=None, metric="spearman")
    entry["type"] = "word_similarity"
    entry["random_init"]["runs"] = [{"seed": i, "validation": {"spearman": v}} for i, v in enumerate(draws)]
    verdict = summary.task_verdict(entry)
    assert verdict["text"] == (
        "gain 48.2 points, beyond every random-init draw (9 draws from -8.4 to 2.1); "
        "note: the rank test cannot go below p = 0.10 with 9 draws (19 or more reach 0.05)"
    )
    assert verdict["measurable"] and verdict["p_value"] == pytest.approx(0.10)
    # inside the draws' range plus its width: the rank test decides, and 9 draws cannot reach 0.05
    entry["pretrained"]["validation"]["spearman"] = _summary([0.12])
    assert summary.task_verdict(entry)["text"].startswith(
        "no measurable gain (13.1 points; rank among 9 random-init draws: p = 0.10)"
    )
    # far below every draw: a loss, not a gain
    entry["pretrained"]["validation"]["spearman"] = _summary([-0.30])
    below = summary.task_verdict(entry)
    assert below["text"].startswith("loss of 28.9 points, below every random-init draw") and not below["measurable"]


def test_a_pretrained_model_runs_a_task_without_training_once():
    words = TaskConfig(name="w", type="word_similarity", format="word_pairs", validation="p.txt", seeds=[3, 4, 5])
    assert summary.seeds_of(words, random_init=False) == [3] and summary.seeds_of(words, random_init=True) == [3, 4, 5]
    trained = TaskConfig(
        name="t", type="classification", format="tsv", train="t.tsv", cross_validation_folds=2, seeds=[3, 4]
    )
    assert summary.seeds_of(trained, random_init=False) == [3, 4]


def test_task_entry_carries_floors_pooler_and_verdict():
    task = TaskConfig(
        name="s", type="classification", format="tsv", train="t.tsv", cross_validation_folds=2, seeds=[1, 2]
    )

    def run(seed: int, accuracy: float, pooler: str) -> dict:
        return {
            "seed": seed,
            "validation": {"accuracy": accuracy},
            "labels": ["neg", "pos"],
            "train_examples": 10,
            "pooler": pooler,
            "baselines": {"validation": {"majority": {"accuracy": 0.5}}},
            "skipped": {"train": 0},
            "skipped_problems": [],
            "final_train_loss": 0.1,
        }

    entry = summary.task_entry(
        task,
        {
            "pretrained": [run(1, 0.9, "pretrained"), run(2, 0.8, "pretrained")],
            "random_init": [run(1, 0.5, "fresh"), run(2, 0.5, "fresh")],
        },
    )
    assert entry["baselines"] == {
        "chance": {"accuracy": 0.5, "mcc": 0.0},
        "validation": {"majority": {"accuracy": 0.5}},
    }
    assert entry["pooler"] == {"pretrained": "pretrained", "random_init": "fresh"}
    assert entry["gain"]["accuracy"] == pytest.approx(0.35)
    assert (
        entry["verdict"]["text"]
        == "gain 35.0 points, above the seed spread of 10.0; random init scores at the majority-class level (50.0%)"
    )
    assert [r["seed"] for r in entry["pretrained"]["runs"]] == [1, 2] and "labels" not in entry["pretrained"]["runs"][0]


def test_mlm_and_nsp_verdicts_set_the_score_beside_the_floor():
    scores = {
        "pretrained": {
            "mlm_accuracy": 0.096,
            "nsp_accuracy": 0.541,
            "baselines": {
                "unigram": {"token": "the", "mlm_accuracy": 0.047},
                "nsp_balance": {"majority_accuracy": 0.541},
            },
        },
        "random_init": {"mlm_accuracy": 0.0001},
    }
    assert summary.mlm_verdict("seq128", scores) == (
        "seq128 validation MLM accuracy 9.6% vs 4.7% for always guessing 'the' and 0.0% for random init: 4.9 "
        "points above the unigram baseline"
    )
    assert summary.nsp_verdict("seq128", scores).endswith(
        "54.1% for always guessing the majority label: the label balance, no next-sentence skill"
    )
    scores["pretrained"]["mlm_accuracy"] = 0.052
    assert summary.mlm_verdict("seq128", scores).endswith(
        "still at the unigram plateau (it predicts frequent tokens, not from context)"
    )
    scores["pretrained"].pop("nsp_accuracy")  # an objective without NSP: no NSP line
    assert summary.nsp_verdict("seq128", scores) is None


def test_unigram_meter_and_label_balance():
    counts = np.array([0, 0, 50, 30, 20])  # ids 0 and 1 are specials
    meter = baselines.UnigramMeter(counts)
    meter.update(np.array([2, 2, 3, 4]))
    result = meter.result()
    assert result["token_id"] == 2 and result["mlm_accuracy"] == 0.5
    probabilities = (counts + 1) / (counts.sum() + 5)
    assert result["mlm_loss"] == pytest.approx(-np.log(probabilities[[2, 2, 3, 4]]).mean())
    assert baselines.nsp_balance({0: 258, 1: 579}) == pytest.approx(
        {"is_next": 258 / 837, "random": 579 / 837, "majority_accuracy": 579 / 837, "pairs": 837}
    )
    assert baselines.nsp_balance({0: 0, 1: 0}) is None


def test_target_counts_read_stored_masks_or_every_token():
    ids = pa.array([[2, 5, 6, 3], [2, 6, 6, 3]], type=pa.list_(pa.uint16()))
    static = pa.RecordBatch.from_arrays(
        [ids, pa.array([[5], [6, 6]], type=pa.list_(pa.uint16()))], ["input_ids", "masked_ids"]
    )
    assert baselines.target_counts([static], 8, [0, 2, 3]).tolist() == [0, 0, 0, 0, 0, 1, 2, 0]
    dynamic = pa.RecordBatch.from_arrays(
        [ids, pa.array([[], []], type=pa.list_(pa.uint16()))], ["input_ids", "masked_ids"]
    )
    assert baselines.target_counts([dynamic], 8, [0, 2, 3]).tolist() == [0, 0, 0, 0, 0, 1, 3, 0]
    assert baselines.target_counts([static], 8, [0, 2, 3], max_rows=1).tolist() == [0, 0, 0, 0, 0, 1, 0, 0]


def test_floors_of_each_task_type():
    assert baselines.most_frequent(["b", "a", "b", "a"]) == "a"  # a tie goes to the first in order
    task = TaskConfig(name="t", type="classification", format="tsv", train="t.tsv", cross_validation_folds=2)
    assert kinds.get("classification").chance(task, ["a", "b", "c"]) == {"accuracy": pytest.approx(1 / 3), "mcc": 0.0}
    assert kinds.get("regression").chance(task, []) == {"spearman": 0.0, "pearson": 0.0}
    assert kinds.get("word_similarity").chance(task, []) == {"spearman": 0.0, "pearson": 0.0}
    assert kinds.get("qa").chance(task, []) == {}
    swag = task.model_copy(update={"type": "multiple_choice", "choices": ["e0", "e1", "e2", "e3"]})
    assert kinds.get("multiple_choice").chance(swag, []) == {"accuracy": 0.25}
