"""The registry of task kinds (bertcore/eval/kinds/): what every kind declares, what serving
reads of a kind, and that no code outside the kinds folder compares a task type's name."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from bertcore.eval import kinds
from bertcore.eval.config import TaskConfig
from bertcore.eval.kinds.base import HeadSpec, TaskKind

ROOT = Path(__file__).resolve().parents[2]


def _names_compared(tree: ast.AST) -> list[int]:
    """Lines where a task type's name is compared with, matched against or used as a key."""
    names = set(kinds.KINDS)

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(named(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(tree):
        if (
            (isinstance(node, ast.Compare) and any(named(n) for n in (node.left, *node.comparators)))
            or (isinstance(node, ast.MatchValue) and named(node.value))
            or (isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys))
        ):
            lines.append(node.lineno)
    return lines


def test_no_code_outside_the_kinds_folder_compares_a_task_type_name():
    found = {}
    for package in ("bertcore", "pipelines", "flows"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("bertcore/eval/kinds/"):
                continue
            lines = _names_compared(ast.parse(path.read_text(encoding="utf-8")))
            if lines:
                found[relative] = len(lines)
    assert found == {}, "ask the task's kind (TaskConfig.kind, kinds.get) instead of comparing its name"


def test_the_check_finds_each_form_of_comparison():
    lines = ['a = t.type == "qa"', 'b = t in ("regression", "x")', 'c = {"classification": 1}', 'd = t == "qa_x"']
    code = "\n".join([*lines, "match t:", '    case "qa": pass'])
    assert _names_compared(ast.parse(code)) == [1, 2, 3, 6]


def test_every_kind_declares_what_the_rest_of_the_code_asks_of_it():
    assert list(kinds.KINDS) == [
        "classification",
        "regression",
        "token_classification",
        "qa",
        "word_similarity",
        "multiple_choice",
    ]
    for name, kind in kinds.KINDS.items():
        assert (
            isinstance(kind, TaskKind) and kind.name == name and kind.summary and kind.formats and kind.primary_metric
        )
        assert (kind.head_shape is None) == (not kind.trains)  # a kind that trains no head has no head shape
    assert [n for n, k in kinds.KINDS.items() if k.windowed] == ["classification", "regression"]
    assert [n for n, k in kinds.KINDS.items() if k.stratified] == ["classification"]
    with pytest.raises(ValueError, match="unknown task type 'ner'; the task types are classification, regression, "):
        kinds.get("ner")


def _task(**fields) -> TaskConfig:
    return TaskConfig(**{"name": "t", "train": "t.tsv", "cross_validation_folds": 2, **fields})


def test_the_kind_decides_what_serving_knows_of_a_head():
    single = _task(type="classification", format="tsv")
    pair = _task(type="classification", format="tsv", text_b="sentence2")
    assert kinds.get("classification").head(single, ["neg", "pos"]) == HeadSpec("labels", False, ["neg", "pos"])
    assert kinds.get("classification").head(pair, ["neg", "pos"]).pair
    assert kinds.get("regression").head(_task(type="regression", format="tsv", text_b="b"), []) == HeadSpec(
        "score", True, []
    )
    ner = _task(type="token_classification", format="conll", text_b="ignored")
    assert kinds.get("token_classification").head(ner, ["O", "B-PER"]) == HeadSpec("tags", False, ["O", "B-PER"])
    assert kinds.get("qa").head(_task(type="qa", format="squad"), []) == HeadSpec("span", True, [])


def test_served_answers_decode_from_the_logits_as_the_kind_says():
    ranked = kinds.get("classification").decode(np.array([0.5, 2.0, 0.5]), ["a", "b", "c"])
    assert [r["label"] for r in ranked] == ["b", "a", "c"]  # ties keep label order
    assert sum(r["score"] for r in ranked) == pytest.approx(1.0)
    assert kinds.get("regression").decode(np.array([3.25]), []) == {"score": 3.25}
    assert kinds.get("token_classification").decode(np.array([[0.1, 2.0], [3.0, 0.0]]), ["O", "B-PER"]) == [
        "B-PER",
        "O",
    ]
    assert kinds.get("qa").decode(np.array([[0.0, 1.0], [5.0, 0.0], [1.0, 4.0]]), []) == {"start": 1, "end": 2}
