"""What the student keeps of the teacher's gain over random init, the speed measured beside
it, and how the report and the verdicts show the three models (bertcore/eval/distillation.py,
bertcore/eval/speed.py, the subject of bertcore/eval/summary.py), on numbers written here
and on tiny models transformers writes from random weights."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertcore.eval import distillation, report, summary
from bertcore.eval.config import TaskConfig
from bertcore.eval.scores import score_rows


def _summary(values: list[float]) -> dict:
    return {
        "median": float(np.median(values)),
        "min": min(values),
        "max": max(values),
        "std": 0.0,
        "n": len(values),
        "n_nan": 0,
    }


def _runs(scores: list[float]) -> list[dict]:
    return [
        {
            "seed": i,
            "validation": {"accuracy": s},
            "labels": ["neg", "pos"],
            "train_examples": 100,
            "skipped": {},
            "skipped_problems": [],
        }
        for i, s in enumerate(scores, start=1)
    ]


def _metrics(teacher: float, student: list[float], random_init: list[float], start: list[float] | None = None) -> dict:
    """A distillation's metrics with one task (polarity, 3 seeds) and STS; with `start`,
    the student's start is scored too (a distill stage of before it was kept has none)."""
    task = TaskConfig(
        name="polarity", type="classification", format="fasttext", train="t.txt", cross_validation_folds=5
    )
    runs = {"teacher": _runs([teacher] * 3), "student": _runs(student), "random_init": _runs(random_init)}
    if start is not None:
        runs["student_start"] = _runs(start)
    entry = summary.task_entry(task, runs, "student")
    speed = {
        name: {"sequences_per_s": rate, "batch_size": 32, "seq_length": 128, "threads": 1, "passes": 5}
        for name, rate in (("teacher", 40.0), ("student", 92.0), ("random_init", 91.0))
    }
    shape = {"num_hidden_layers": 3, "hidden_size": 384, "num_attention_heads": 12, "vocab_size": 30522}
    models = {
        name: {"uri": f"/models/{name}", "parameters": 1000, "config": shape}
        for name in distillation.MODELS
        if name in runs
    }
    sts = {
        "sts_pairs": 10,
        "teacher": {"mean": {"sts_spearman": 0.8}},
        "student": {"mean": {"sts_spearman": 0.7}},
        "random_init": {"mean": {"sts_spearman": 0.2}},
    }
    if start is not None:
        sts["student_start"] = {"mean": {"sts_spearman": 0.6}}
    metrics = {
        "subject": "student",
        "models": models,
        "model": models["student"],
        "tasks": {"polarity": entry},
        "speed": speed,
        "embeddings": sts,
    }
    metrics["verdicts"] = summary.verdicts(metrics) + distillation.lines(metrics)
    metrics["distillation"] = distillation.comparisons(metrics)
    return metrics


def test_the_student_keeps_a_share_of_the_teachers_gain_at_a_measured_speed():
    metrics = _metrics(0.80, [0.74, 0.75, 0.76], [0.50, 0.52, 0.51])
    task = metrics["tasks"]["polarity"]
    assert task["subject"] == "student" and {"teacher", "student", "random_init"} <= set(task)
    # the student is the one judged against random init
    assert task["verdict"]["text"] == "gain 24.0 points, above the seed spread of 2.0"
    polarity, sts = metrics["distillation"]["polarity"], metrics["distillation"]["STS (mean pooling)"]
    assert polarity["kept"] == pytest.approx((0.75 - 0.51) / (0.80 - 0.51)) and sts["kept"] == pytest.approx(0.5 / 0.6)
    assert metrics["verdicts"][-2] == (
        "polarity (accuracy): the student keeps 83% of the teacher's gain over random init (24.0 of 29.0 points; "
        "teacher 80.0%, student 75.0%, random init 51.0%), at 2.3x its speed"
    )
    assert metrics["verdicts"][-1].startswith("STS (mean pooling) (STS Spearman x100): the student keeps 83%")


def test_a_teacher_without_a_gain_leaves_nothing_to_keep_and_says_so():
    metrics = _metrics(0.50, [0.55, 0.56, 0.57], [0.50, 0.51, 0.52])
    assert metrics["distillation"]["polarity"]["kept"] is None
    assert (
        "the teacher gains nothing over random init, so there is nothing to keep (teacher 50.0%, student "
        "56.0%, random init 51.0%)"
    ) in metrics["verdicts"][-2]
    assert distillation.compare("spearman", None, 0.3, 0.0)["teacher_gain"] is None


def test_the_report_shows_the_three_models_their_speed_and_what_is_kept():
    metrics = _metrics(0.80, [0.74, 0.75, 0.76], [0.50, 0.52, 0.51])
    metrics.update(
        {"seed": 1, "intrinsic": {}, "fill_mask": [], "skipped_rows": {"total": 0, "files": {}}, "notes": []}
    )
    text = report.render_markdown(metrics, {})
    assert "## Distillation: teacher, student, random init" in text and "student start" not in text
    assert "| teacher | `/models/teacher` | 3 x 384 | 1,000 | 40.0 | 1.00x |" in text
    assert "| student | `/models/student` | 3 x 384 | 1,000 | 92.0 | 2.30x |" in text
    assert "| polarity | accuracy | 80.0% | 75.0% | 51.0% | 29.0 | 24.0 | 83% |" in text
    assert (
        "| task | type | metric | student | random init | gain (points) |" in text
    )  # the tasks table judges the student
    rows = score_rows(metrics)
    assert rows[0]["pretrained"] == pytest.approx(0.75)  # the flat rows carry the subject's scores


def test_each_verdict_says_how_much_of_the_students_gain_came_from_its_start_and_how_much_from_training():
    metrics = _metrics(0.80, [0.74, 0.75, 0.76], [0.50, 0.52, 0.51], start=[0.71, 0.73, 0.75])
    polarity, sts = metrics["distillation"]["polarity"], metrics["distillation"]["STS (mean pooling)"]
    assert (polarity["student_start"], polarity["start_gain"], polarity["training_gain"]) == pytest.approx(
        (0.73, 0.22, 0.02)
    )
    assert (polarity["start_spread"], polarity["training_spread"]) == pytest.approx(
        (0.04, 0.04)
    )  # the larger range of each part's two models
    # the start's 22 points are far above the seed spread; training's 2 are within it
    assert metrics["verdicts"][-2] == (
        "polarity (accuracy): the student keeps 83% of the teacher's gain over random init (24.0 of 29.0 points; "
        "teacher 80.0%, student 75.0%, student start 73.0%, random init 51.0%), at 2.3x its speed; of its "
        "24.0 points the start gave "
        "22.0 (92%), above the seed spread of 4.0, and training 2.0 (8%): no measurable gain (within the "
        "seed spread of 4.0)"
    )
    # STS scores once per model: the parts are shown, not judged
    assert (sts["start_gain"], sts["training_gain"]) == pytest.approx((0.4, 0.1))
    assert metrics["verdicts"][-1].endswith(
        "of its 50.0 points the start gave 40.0 (80%), and training 10.0 (20%) (one score per model: no seed "
        "spread to judge them by)"
    )

    training_pays = _metrics(0.80, [0.74, 0.75, 0.76], [0.50, 0.52, 0.51], start=[0.55, 0.56, 0.57])
    assert (
        "the start gave 5.0 (21%), above the seed spread of 2.0, and training 19.0 (79%), above the seed spread of 2.0"
        in training_pays["verdicts"][-2]
    )
    worse = _metrics(0.80, [0.60, 0.61, 0.62], [0.50, 0.52, 0.51], start=[0.70, 0.71, 0.72])
    assert "and training -10.0 (-100%), a loss beyond the seed spread of 2.0" in worse["verdicts"][-2]

    metrics.update(
        {"seed": 1, "intrinsic": {}, "fill_mask": [], "skipped_rows": {"total": 0, "files": {}}, "notes": []}
    )
    text = report.render_markdown(metrics, {})
    assert "## Distillation: teacher, student, student start, random init" in text
    assert (
        "| student start | `/models/student_start` | 3 x 384 | 1,000 | – | – |" in text
    )  # not timed: the student's shape
    assert (
        "| task | metric | teacher | student | student start | random init | teacher gain | student gain | "
        "from start | from training | student keeps |"
    ) in text
    assert "| polarity | accuracy | 80.0% | 75.0% | 73.0% | 51.0% | 29.0 | 24.0 | 22.0 | 2.0 | 83% |" in text
    assert "| student start | mean | – | 60.0 |" in text  # the embeddings table


def test_speed_is_measured_for_each_model_on_the_same_batch(tmp_path):
    import torch
    import transformers

    from bertcore.eval.speed import measure

    folders = {}
    for name, layers in (("teacher", 4), ("student", 1)):
        config = transformers.BertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=128
        )
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(str(tmp_path / name))
        folders[name] = (str(tmp_path / name), False)
    folders["random_init"] = (str(tmp_path / "student"), True)
    threads = torch.get_num_threads()
    result = measure(folders, batch_size=4, seq_length=32, passes=3, seed=1, threads=1)
    torch.set_num_threads(threads)
    assert set(result) == {"teacher", "student", "random_init"}
    assert all(
        r["sequences_per_s"] > 0 and r["passes"] == 3 and (r["batch_size"], r["seq_length"], r["threads"]) == (4, 32, 1)
        for r in result.values()
    )
    assert os.path.isdir(tmp_path / "student")
