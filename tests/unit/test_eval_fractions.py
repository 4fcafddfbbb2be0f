"""Few labels (`train_fractions`): nested seeded subsets of a task's training examples,
the plan-time check that every fraction keeps each label, fine-tuning on a fraction, and
the learning curve in metrics.json, the report and its plot."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bertcore.eval import report
from bertcore.eval.config import TaskConfig
from bertcore.eval.fractions import check_fractions, fraction_subset, nested_order, subset_size
from bertcore.eval.learning_curve import learning_curve
from bertcore.eval.plots import plot_learning_curves
from bertcore.eval.readers import TaskDataError, TextExample
from bertcore.eval.scores import json_dumps
from bertcore.eval.summary import task_entry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _task(type_: str = "classification", **fields) -> TaskConfig:
    return TaskConfig(name="t", type=type_, format="tsv", train="t.tsv", validation="d.tsv", **fields)


def _examples(labels: list) -> list[TextExample]:
    return [TextExample(f"text {i}", None, label) for i, label in enumerate(labels)]


# -- nested subsets -------------------------------------------------------------------------------

fractions = st.lists(st.floats(0.001, 1.0), min_size=2, max_size=4, unique=True).map(sorted)


@settings(max_examples=150, deadline=None)
@given(
    labels=st.lists(st.sampled_from("abcde"), min_size=1, max_size=300),
    shares=fractions,
    seed=st.integers(0, 2**31),
    fit=st.sampled_from(["full", "fold0", "fold3"]),
)
def test_smaller_fractions_lie_inside_larger_ones_and_keep_every_label(labels, shares, seed, fit):
    task, examples = _task(), _examples(labels)
    subsets = [fraction_subset(examples, f, task, seed, fit) for f in shares]
    names = [[e.text_a for e in subset] for subset in subsets]
    for f, subset, texts in zip(shares, subsets, names):
        assert len(subset) == subset_size(f, len(examples))
        assert texts == [e.text_a for e in examples if e.text_a in set(texts)]  # in file order, no repeats
        if len(subset) >= len(set(labels)):
            assert {e.label for e in subset} == set(labels)  # stratified: no label lost
    for smaller, larger in zip(names, names[1:]):
        assert set(smaller) <= set(larger)
    assert fraction_subset(examples, 1.0, task, seed, fit) == examples  # the whole file, as it is
    assert [
        fraction_subset(examples, f, task, seed, fit) for f in shares
    ] == subsets  # a keyed draw: the same every time


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 300), seed=st.integers(0, 2**31), weight=st.floats(0.05, 0.95))
def test_two_labels_keep_their_proportions_to_within_one_example_in_every_prefix(n, seed, weight):
    rng = random.Random(seed)
    labels = ["pos", "neg"] + ["pos" if rng.random() < weight else "neg" for _ in range(n - 2)]
    order = nested_order(labels, n, np.random.default_rng(seed))
    assert sorted(order) == list(range(n))
    share = labels.count("pos") / n
    taken = 0
    for k, i in enumerate(order, start=1):
        taken += labels[i] == "pos"
        assert abs(taken - share * k) < 1


def test_the_subset_is_keyed_by_run_seed_task_and_fit_only():
    examples = _examples(["a", "b"] * 100)
    task = _task()
    base = fraction_subset(examples, 0.1, task, 7, "full")
    random.seed(123)
    np.random.seed(123)  # no global RNG is read
    assert fraction_subset(examples, 0.1, task, 7, "full") == base
    assert (
        fraction_subset(examples, 0.1, task.model_copy(update={"seeds": [9], "epochs": 7}), 7, "full") == base
    )  # not the fine-tuning seed
    for other in (
        fraction_subset(examples, 0.1, task, 8, "full"),
        fraction_subset(examples, 0.1, task.model_copy(update={"name": "u"}), 7, "full"),
        fraction_subset(examples, 0.1, task, 7, "fold1"),
    ):
        assert other != base
    regression = fraction_subset(
        [TextExample(f"x{i}", None, float(i)) for i in range(50)], 0.2, _task("regression"), 7, "full"
    )
    assert len(regression) == 10 and len({e.text_a for e in regression}) == 10


# -- configuration and the plan-time check --------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"train_fractions": [0.5, 0.1]}, "increasing order"),
        ({"train_fractions": [0.0, 1.0]}, r"lie in \(0, 1\]"),
        ({"train_fractions": [1.5]}, r"lie in \(0, 1\]"),
        ({"train_fractions": [0.1, 0.1]}, "duplicates"),
    ],
)
def test_fractions_are_checked_when_the_recipe_is_read(fields, message):
    with pytest.raises(ValidationError, match=message):
        _task(**fields)
    with pytest.raises(ValidationError, match="trains nothing"):
        TaskConfig(
            name="s", type="word_similarity", format="word_pairs", validation="p.txt", train_fractions=[0.5, 1.0]
        )
    assert _task().train_fractions == [1.0]


def test_a_fraction_that_leaves_fewer_examples_than_labels_is_one_line_naming_the_key(tmp_path):
    rows = [(f"sentence {i}", label) for i, label in enumerate(["a", "b", "c"] * 20)]  # 60 examples, 3 labels
    (tmp_path / "t.tsv").write_text("sentence\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
    task = TaskConfig(
        name="three",
        type="classification",
        format="tsv",
        train=str(tmp_path / "t.tsv"),
        validation=str(tmp_path / "t.tsv"),
        train_fractions=[0.03, 1.0],
    )
    with pytest.raises(TaskDataError) as caught:
        check_fractions(task, "evaluate.tasks[1].train_fractions")
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "evaluate.tasks[1].train_fractions: 0.03 of task 'three''s 60 training examples keeps 2, fewer than its 3 "
        "labels; use fractions of at least 0.05 (3 examples)"
    )
    check_fractions(task.model_copy(update={"train_fractions": [0.05, 1.0]}), "k")  # 3 examples: one of each label
    # Cross-validated: a fold trains on 4/5 of the file; early stopping needs one more to hold out.
    folds = task.model_copy(
        update={
            "validation": None,
            "cross_validation_folds": 5,
            "train_fractions": [0.0625, 1.0],
            "early_stopping_patience": 1,
        }
    )
    with pytest.raises(
        TaskDataError,
        match=(
            r"0.0625 of task 'three''s 48 training examples of a fold keeps 3, fewer than its 3 labels plus 1 "
            r"held out"
        ),
    ):
        check_fractions(folds, "k")


# -- the learning curve in metrics.json and the report --------------------------------------------


def _run(seed: int, accuracy: float, fraction: float, fit: int) -> dict:
    return {
        "seed": seed,
        "labels": ["neg", "pos"],
        "train_examples": 200,
        "fraction": fraction,
        "fit_examples": [fit] * 5,
        "validation": {"accuracy": accuracy},
        "baselines": {"validation": {"majority": {"accuracy": 0.5}}},
        "skipped": {"train": 0},
        "skipped_problems": [],
    }


def _curve_metrics() -> dict:
    task = TaskConfig(
        name="polarity",
        type="classification",
        format="fasttext",
        train="p.cor",
        cross_validation_folds=5,
        seeds=[1, 2, 3],
        train_fractions=[0.05, 0.2, 1.0],
    )
    scores = {  # (pretrained, random init) accuracies per seed
        0.05: ([0.60, 0.70, 0.65], [0.50, 0.52, 0.48]),
        0.2: ([0.75, 0.80, 0.78], [0.60, 0.70, 0.65]),
        1.0: ([0.85, 0.86, 0.84], [0.83, 0.85, 0.80]),
    }
    entries = {}
    for f, (mine, theirs) in scores.items():
        fit = round(f * 160)
        runs = {
            "pretrained": [_run(s, a, f, fit) for s, a in zip(task.seeds, mine)],
            "random_init": [_run(s, a, f, fit) for s, a in zip(task.seeds, theirs)],
        }
        entries[f] = task_entry(task, runs)
    entry = entries[1.0] | {"learning_curve": learning_curve(entries)}
    return {
        "subject": "pretrained",
        "tasks": {"polarity": entry},
        "verdicts": [],
        "skipped_rows": {"total": 0, "files": {}},
    }


def test_the_curve_holds_one_point_per_fraction_and_model_with_the_seed_spread(tmp_path):
    metrics = _curve_metrics()
    curve = metrics["tasks"]["polarity"]["learning_curve"]
    assert curve["metric"] == "accuracy" and curve["fractions"] == [0.05, 0.2, 1.0]
    assert [p["fraction"] for p in curve["points"]] == [0.05, 0.2, 1.0]
    first = curve["points"][0]
    assert first["fit_examples"] == [8] * 5 and first["majority"] == 0.5
    assert first["pretrained"]["median"] == 0.65 and (first["pretrained"]["min"], first["pretrained"]["max"]) == (
        0.60,
        0.70,
    )
    assert first["pretrained"]["values"] == [0.60, 0.70, 0.65] and first["random_init"]["values"] == [0.50, 0.52, 0.48]
    assert first["gain"] == pytest.approx(0.15) and first["verdict"]["measurable"]  # 15 points against a spread of 10
    assert not curve["points"][2]["verdict"][
        "measurable"
    ]  # 2 points within a spread of 5: with all the labels, no measurable gain
    assert "no measurable gain" in curve["points"][2]["verdict"]["text"]
    text = json_dumps(metrics)  # strict JSON
    assert '"learning_curve"' in text

    assert plot_learning_curves(metrics["tasks"], str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").read_bytes()[:8] == PNG_MAGIC
    assert not plot_learning_curves({"x": {"type": "classification"}}, str(tmp_path / "none.png"))

    md = report.render_markdown(metrics, {"label_fractions": "plots/label_fractions.png"})
    assert "## Few labels: scores over the share of training examples" in md
    assert "![scores over the share of training examples](plots/label_fractions.png)" in md
    assert (
        "| polarity | 5% | 8 | 65.0% [60.0%, 70.0%] | 50.0% [48.0%, 52.0%] | 15.0 | 50.0% | gain 15.0 "
        "points, above the seed spread of 10.0; random init scores at the majority-class level (50.0%) |"
    ) in md
    assert (
        "| polarity | 100% | 160 | 85.0% [84.0%, 86.0%] | 83.0% [80.0%, 85.0%] | 2.0 | 50.0% | no measurable gain" in md
    )
