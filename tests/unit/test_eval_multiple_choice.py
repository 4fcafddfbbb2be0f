"""The multiple-choice task kind (bertcore/eval/kinds/multiple_choice.py), added as one
module and one registry line: its files (SWAG-style JSON lines, COPA-style TSV) on data
written here, the recipe checks, one row per candidate in the model's input, and a tiny
BERT fine-tuned on it end to end. The evaluate stage runs it in tests/stages/test_evaluate_stage.py."""

from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import pytest
import torch
from pydantic import ValidationError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertcore.eval import finetune, kinds
from bertcore.eval.config import EvaluateConfig, TaskConfig
from bertcore.eval.encoder import load_tokenizer
from bertcore.eval.kinds.multiple_choice import ChoiceExample
from bertcore.eval.readers import TaskDataError
from bertcore.eval.tasks import check_task_files, read_split
from tiny_bert import save_tiny_bert

NOUNS = ["movie", "film", "story", "plot", "actor", "scene", "music", "ending"]
ADJECTIVES = ["long", "short", "funny", "dull", "loud", "quiet", "odd", "fine"]


def _ending(rng: random.Random, good: bool) -> str:
    words = ["the", rng.choice(NOUNS), "was", rng.choice(ADJECTIVES)]
    if good:
        words.insert(rng.randrange(len(words) + 1), "good")
    return " ".join(words)


def swag_rows(seed: int, n: int, count: int = 4) -> list[dict]:
    """SWAG's layout: a context (sent1), the start of every ending (sent2), `count` endings,
    the right one's index; the right ending is the one that says "good"."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        right = rng.randrange(count)
        row = {"sent1": f"we saw the {rng.choice(NOUNS)} .", "sent2": "then", "label": right}
        row |= {f"ending{k}": _ending(rng, k == right) for k in range(count)}
        rows.append(row)
    return rows


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def swag_task(train: str, validation: str | None = None, **fields) -> TaskConfig:
    settings = {
        "name": "swag",
        "type": "multiple_choice",
        "format": "jsonl",
        "train": train,
        "text_a": "sent1",
        "text_b": "sent2",
    }
    settings |= {"choices": ["ending0", "ending1", "ending2", "ending3"], "seeds": [1]}
    if validation is None:
        settings["cross_validation_folds"] = 2
    else:
        settings["validation"] = validation
    return TaskConfig(**settings | fields)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    rng = random.Random(0)
    lines = [f"we saw the {n} . then {_ending(rng, rng.random() < 0.5)}" for n in NOUNS for _ in range(12)]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_choice"), lines, vocab_size=200, max_positions=64)


# --- the files ---------------------------------------------------------------------------------


def test_swag_rows_are_read_with_the_start_of_each_ending(tmp_path):
    task = swag_task(
        write_jsonl(tmp_path / "train.jsonl", swag_rows(1, 5)), cross_validation_folds=None, validation="v"
    )
    examples = read_split(task, "train").examples
    first = swag_rows(1, 5)[0]
    assert examples[0] == ChoiceExample(
        first["sent1"], tuple(f"then {first[f'ending{k}']}" for k in range(4)), first["label"]
    )
    assert len(examples) == 5 and all("good" in e.candidates[e.label] for e in examples)


def test_copa_tsv_by_column_index_without_a_header(tmp_path):
    path = tmp_path / "copa.tsv"
    path.write_text(
        "the man broke his toe .\the dropped a hammer .\the got a hole in his sock .\t0\n", encoding="utf-8"
    )
    task = TaskConfig(
        name="copa",
        type="multiple_choice",
        format="tsv",
        header=False,
        text_a=0,
        choices=[1, 2],
        label_column=3,
        train=str(path),
        cross_validation_folds=2,
    )
    (example,) = read_split(task, "train").examples
    assert example == ChoiceExample(
        "the man broke his toe .", ("he dropped a hammer .", "he got a hole in his sock ."), 0
    )


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"label": 4}, "label 4 is not the index of one of the 4 candidates (0 to 3)"),
        ({"label": "first"}, "label 'first' is not the index of a candidate"),
        ({"ending2": None}, "a text column is not a string"),
    ],
)
def test_a_bad_row_names_its_line_or_is_skipped_and_counted(tmp_path, change, reason):
    rows = swag_rows(2, 4)
    rows[2] |= change
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(TaskDataError, match=re.escape(f"train.jsonl, line 3: {reason}")):
        read_split(swag_task(path), "train")
    read = read_split(swag_task(path, on_error="skip"), "train")
    assert read.skipped == 1 and len(read.examples) == 3 and "line 3" in read.problems[0]


def test_an_empty_file_says_what_it_should_hold(tmp_path):
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(
        TaskDataError,
        match=r"no examples for task 'swag' \(train file\); expected one JSON object per line with keys "
        r"'sent1' and 'sent2' and 'ending0' and 'ending1' and 'ending2' and 'ending3' and 'label'",
    ):
        check_task_files(swag_task(str(tmp_path / "empty.jsonl")))


# --- the recipe --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"choices": None}, "needs `choices`"),
        ({"choices": ["ending0"]}, "needs `choices`"),
        ({"choices": ["ending0", "ending0"]}, "choices names a column twice"),
        ({"labels": ["0", "1"]}, "labels must be unset for a multiple_choice task"),
        ({"format": "conll"}, "format 'conll' cannot hold a multiple_choice task; use one of tsv, csv, jsonl"),
        (
            {"long_inputs": "windows"},
            "long_inputs windows is for classification and regression; a multiple_choice task truncates",
        ),
    ],
)
def test_recipe_checks_name_the_setting(fields, message):
    with pytest.raises(ValidationError, match=message):
        swag_task("t.jsonl", **fields)


def test_choices_stay_out_of_the_fingerprint_of_a_task_without_them():
    """A setting added later: runs made before it keep their evaluate fingerprint."""
    plain = {"name": "p", "type": "classification", "format": "fasttext", "train": "t.txt", "cross_validation_folds": 2}
    section = EvaluateConfig(
        tasks=[
            plain,
            {
                "name": "swag",
                "type": "multiple_choice",
                "format": "jsonl",
                "train": "t.jsonl",
                "cross_validation_folds": 2,
                "choices": ["a", "b"],
            },
        ]
    )
    tasks = EvaluateConfig.fingerprint_json(section.model_dump(mode="json"))["tasks"]
    assert "choices" not in tasks[0] and tasks[1]["choices"] == ["a", "b"]


# --- the model ---------------------------------------------------------------------------------


def test_each_candidate_is_one_row_after_its_context(tiny_model, tmp_path):
    tokenizer = load_tokenizer(tiny_model)
    task = swag_task("t.jsonl", max_seq_length=32)
    examples = [
        ChoiceExample("we saw the film .", ("a", "b", "c", "d"), 3),
        ChoiceExample("we saw the plot .", ("e", "f", "g", "h"), 0),
    ]
    features, _ = task.kind.features(examples, tokenizer, task, [])
    batch = task.kind.batch(features, tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 8 and batch["labels"].tolist() == [3, 0]  # (B x N, T); (B,)
    expected = tokenizer("we saw the plot .", "g", return_token_type_ids=True)
    assert batch["input_ids"][6, : len(expected["input_ids"])].tolist() == expected["input_ids"]
    assert batch["token_type_ids"][6, : len(expected["input_ids"])].tolist() == expected["token_type_ids"]
    # the head's one score per row becomes one row of N scores per question, for the loss and for scoring
    logits = torch.arange(8, dtype=torch.float).unsqueeze(-1)
    split = task.kind.split_outputs(logits.numpy(), features)
    assert [o.tolist() for o in split] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loss = task.kind.loss(logits, batch["labels"])
    expected_loss = torch.nn.functional.cross_entropy(
        torch.tensor([[0.0, 1, 2, 3], [4, 5, 6, 7]]), torch.tensor([3, 0])
    )
    assert loss.item() == pytest.approx(expected_loss.item())
    assert task.kind.score(task, [], examples, split, None) == {
        "accuracy": 0.5
    }  # the last candidate scores highest: right, then wrong


def test_serving_reads_a_ranked_list_of_candidates_for_a_pair_head():
    kind = kinds.get("multiple_choice")
    head = kind.head(swag_task("t.jsonl"), [])
    assert (head.shape, head.pair, head.labels) == ("choice", True, [])
    ranked = kind.decode(np.array([0.1, 2.0, -1.0]), [])
    assert [r["choice"] for r in ranked] == [1, 0, 2] and sum(r["score"] for r in ranked) == pytest.approx(1.0)


def test_fine_tuning_learns_which_candidate_is_right(tiny_model, tmp_path):
    """The right ending is the one with "good" in it, at a random position: a model whose
    rows, scores and labels were misaligned would stay near chance (1 in 4)."""
    task = swag_task(
        write_jsonl(tmp_path / "train.jsonl", swag_rows(3, 48)),
        write_jsonl(tmp_path / "dev.jsonl", swag_rows(4, 24)),
        epochs=6,
        learning_rate=2e-3,
        batch_size=8,
        max_seq_length=32,
    )
    result = finetune.run_task(task, tiny_model, tiny_model, seed=1, random_init=False)
    assert result["validation"]["accuracy"] >= 0.9, result["validation"]
    majority = result["baselines"]["validation"]["majority"]["accuracy"]
    assert majority < 0.5 and result["labels"] == [] and result["train_examples"] == 48
