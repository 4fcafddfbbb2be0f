"""The evaluation report: training-log parsing, strict JSON, PNG plots, markdown tables
and the flat score rows, from metrics dictionaries written here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertcore.eval import plots, report
from bertcore.eval.scores import json_dumps, score_rows
from bertcore.train.metrics_log import read_training_log

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summary(median: float, low: float, high: float, n: int = 3) -> dict:
    return {"median": median, "min": low, "max": high, "std": 0.01, "n": n, "n_nan": 0}


def _metrics() -> dict:
    """A metrics dictionary shaped like the evaluate stage's eval/metrics.json."""
    return {
        "seed": 7,
        "baseline": True,
        "model": {
            "uri": "pretrain/model",
            "parameters": 1_012_130,
            "config": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "vocab_size": 4000},
        },
        "pretraining_log": {
            "uri": "pretrain/metrics.jsonl",
            "records": 150,
            "unreadable_lines": 1,
            "log_every": 50,
            "final": {"first_step": 101, "step": 150, "loss": 7.61, "mlm_accuracy": 0.058, "nsp_accuracy": 0.55},
            "validations": 3,
            "validation": {"step": 150, "sequences": 640, "loss": 7.48, "mlm_accuracy": 0.061, "nsp_accuracy": 0.54},
            "loss_jumps": [{"step": 95, "loss": 13.8, "running_mean": 7.62, "factor": 1.81}],
        },
        "intrinsic": {
            "seq128": {
                "pretrained": {
                    "sequences": 637,
                    "masked_tokens": 11156,
                    "mlm_loss": 6.902,
                    "mlm_perplexity": 993.8,
                    "mlm_accuracy": 0.0447,
                    "nsp_loss": 0.6977,
                    "nsp_accuracy": 0.5243,
                    "baselines": {
                        "unigram": {"token": "the", "mlm_accuracy": 0.0471, "mlm_loss": 7.013},
                        "nsp_balance": {"is_next": 0.4757, "random": 0.5243, "majority_accuracy": 0.5243},
                    },
                },
                "random_init": {
                    "sequences": 637,
                    "masked_tokens": 11156,
                    "mlm_loss": 8.323,
                    "mlm_perplexity": 4119.3,
                    "mlm_accuracy": 0.0003,
                    "nsp_loss": 0.6956,
                    "nsp_accuracy": 0.4757,
                },
            }
        },
        "tasks": {
            "sst": {
                "type": "classification",
                "primary_metric": "accuracy",
                "seeds": 3,
                "folds": 5,
                "freeze_encoder": False,
                "pretrained": {
                    "validation": {"accuracy": _summary(0.8771, 0.85, 0.90), "mcc": _summary(0.61, 0.55, 0.70)}
                },
                "random_init": {"validation": {"accuracy": _summary(0.60, 0.55, 0.62), "mcc": _summary(0.1, 0.0, 0.2)}},
                "gain": {"accuracy": 0.2771, "mcc": 0.51},
                "baselines": {
                    "chance": {"accuracy": 0.5, "mcc": 0.0},
                    "validation": {"majority": {"accuracy": 0.52, "mcc": 0.0}},
                },
                "verdict": {"text": "gain 27.7 points, above the seed spread of 7.0"},
                "pooling": "mean",
                "skipped": {"train": 2},
                "skipped_problems": ["data/sst.tsv, line 4: 1 columns where 2 were expected"],
            },
            "stsb": {
                "type": "regression",
                "primary_metric": "spearman",
                "seeds": 1,
                "folds": None,
                "pretrained": {
                    "validation": {"spearman": _summary(float("nan"), float("nan"), float("nan"), 1)},
                    "test": {"spearman": _summary(0.3, 0.3, 0.3, 1)},
                },
                "random_init": {"validation": {"spearman": _summary(0.1, 0.1, 0.1, 1)}},
                "gain": {"spearman": float("nan")},
                "skipped": {"train": 0},
                "skipped_problems": [],
            },
        },
        "embeddings": {
            "sentences": 500,
            "sts_pairs": 0,
            "pretrained": {"cls": {"anisotropy": 0.99996}, "mean": {"anisotropy": 0.95}},
            "random_init": {"cls": {"anisotropy": 0.9999}, "mean": {"anisotropy": 0.96}},
        },
        "fill_mask": [
            {
                "text": "the cat sat on the [MASK] .",
                "answer": "mat",
                "predictions": [["floor", 0.2], ["mat", 0.1], ["the", 0.05], [",", 0.04], [".", 0.03]],
                "answer_rank": 2,
            }
        ],
        "verdicts": [
            "seq128 validation MLM accuracy 4.5% vs 4.7% for always guessing 'the': still at the unigram plateau",
            "sst (accuracy): gain 27.7 points, above the seed spread of 7.0",
        ],
        "skipped_rows": {"total": 2, "files": {"data/sst.tsv": 2}},
        "notes": ["intrinsic: phase seq512 (512 tokens) is longer than the model's 128 positions; left out"],
    }


def test_training_log_skips_broken_lines_and_sorts_by_step():
    lines = [
        json.dumps({"step": 2, "loss": 7.0, "mlm_accuracy": 0.1}),
        json.dumps({"step": 1, "loss": 9.0, "mlm_accuracy": None}),
        "",
        json.dumps({"loss": 3.0}),  # no step
        '{"step": 3, "loss": 6.',  # cut short by a kill
        json.dumps([1, 2]),
    ]
    records, bad = read_training_log(lines)
    assert [r["step"] for r in records] == [1, 2]
    assert bad == 3


def test_metrics_json_is_strict_json_without_nan():
    text = json_dumps({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 0.5}})

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    assert json.loads(text, parse_constant=refuse) == {"a": None, "b": [1.0, None], "c": {"d": 0.5}}


def test_pretraining_plot_is_a_png_and_marks_phases(tmp_path):
    records = [
        {"step": s, "loss": 10 - s / 100, "mlm_accuracy": s / 1000, "phase": "seq128" if s < 500 else "seq512"}
        for s in range(1, 1001)
    ]
    records[3]["mlm_accuracy"] = None  # a step without masked tokens
    validations = [{"step": s, "loss": 9.0 - s / 200, "mlm_accuracy": s / 900} for s in (250, 500, 750, 1000)]
    path = tmp_path / "curves.png"
    assert plots.plot_pretraining(records, validations, 50, 0.047, str(path))
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_long_training_logs_are_binned_before_plotting(tmp_path):
    records = [{"step": s, "loss": 5.0 + math.sin(s)} for s in range(1, 50_001)]
    path = tmp_path / "long.png"
    assert plots.plot_pretraining(records, [], 1, None, str(path))  # only the loss: the accuracy panel says so
    steps = np.array([r["step"] for r in records], dtype=float)
    binned_steps, binned = plots._binned(steps, np.array([r["loss"] for r in records]), 100)
    assert len(binned_steps) == len(binned) == 100
    assert binned_steps[0] < binned_steps[-1] and abs(binned.mean() - 5.0) < 0.01


def test_no_plot_without_losses_or_tasks(tmp_path):
    assert not plots.plot_pretraining([], [], 10, None, str(tmp_path / "a.png"))
    assert not plots.plot_pretraining([{"step": 1, "mlm_accuracy": 0.1}], [], 10, None, str(tmp_path / "b.png"))
    assert not plots.plot_tasks({}, str(tmp_path / "c.png"))
    assert not list(tmp_path.iterdir())


def test_task_plot_handles_a_metric_that_is_nan(tmp_path):
    path = tmp_path / "tasks.png"
    assert plots.plot_tasks(_metrics()["tasks"], str(path))
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_markdown_tables_show_scores_gain_and_problems():
    md = report.render_markdown(_metrics(), {"pretraining": "plots/pretraining.png", "tasks": "plots/tasks.png"})
    lines = md.splitlines()
    sst = next(line for line in lines if line.startswith("| sst | classification"))
    # median [min, max] in percent, random-init median, gain in points, majority class, chance, seeds, how it was scored
    assert (
        "87.7% [85.0%, 90.0%]" in sst
        and "60.0% [55.0%, 62.0%]" in sst
        and "| 27.7 | 52.0% | 50.0% | 3 |" in sst
        and "5-fold CV, mean pooling" in sst
    )
    assert "- sst: gain 27.7 points, above the seed spread of 7.0" in lines
    # The verdicts come first, the floors sit beside the scores, the fill-mask guesses are shown.
    assert md.index("## Verdict") < md.index("## Validation masked LM") < md.index("## Tasks")
    assert (
        "- seq128 validation MLM accuracy 4.5% vs 4.7% for always guessing 'the': still at the unigram plateau" in lines
    )
    floor = next(line for line in lines if line.startswith("| seq128 | unigram / majority label (always 'the')"))
    assert "| 7.013 |" in floor and "| 4.7% |" in floor and floor.endswith("| 52.4% |")
    assert "| the cat sat on the [MASK] . | mat | floor (20%), mat (10%), the (5%), , (4%), . (3%) | 2 |" in lines
    stsb = next(line for line in lines if line.startswith("| stsb | regression"))
    assert "| Spearman x100 |" in stsb and "| – |" in stsb  # an undefined correlation is shown as missing, not as nan
    assert any(line.startswith("| stsb | test | Spearman x100 | 30.0 |") for line in lines)
    pretrained_mlm = next(line for line in lines if line.startswith("| seq128 | pretrained"))
    assert "| 637 | 11,156 | 6.902 | 993.8 | 4.5% |" in pretrained_mlm
    assert "![pretraining curves](plots/pretraining.png)" in md and "![task scores](plots/tasks.png)" in md
    assert "| pretrained | cls | 1.0000 |" in md  # cosine near 1 keeps its digits
    assert "data/sst.tsv, line 4" in md and "2 malformed row(s)" in md
    assert "seq512 (512 tokens) is longer" in md
    assert "1 unreadable line(s)" in md
    # the pretraining figures: what they average, the final interval, the validation, the jumps; paths relative to
    # run.root
    assert "Model `pretrain/model` (paths are relative to run.root)" in md
    assert "Final training figures (mean of steps 101-150): loss 7.610, MLM accuracy 5.8%, NSP accuracy 55.0%." in lines
    assert (
        "Validation at step 150 (640 held-out sequences; 3 validations in all): loss 7.480, MLM accuracy "
        "6.1%, NSP accuracy 54.0%."
    ) in lines
    assert any(
        line.startswith("Loss jumps seen during training (training went on): step 95: 13.80 (1.8x the running mean)")
        for line in lines
    )


def test_markdown_without_log_baseline_or_tasks():
    metrics = _metrics()
    metrics.update(
        pretraining_log=None,
        tasks={},
        embeddings=None,
        skipped_rows={"total": 0, "files": {}},
        notes=[],
        baseline=False,
    )
    for by_model in metrics["intrinsic"].values():
        by_model.pop("random_init")
    md = report.render_markdown(metrics, {})
    assert "No pretraining log" in md
    assert "random init" not in md and "## Tasks" not in md and "Skipped input rows" not in md
    assert "| seq128 | pretrained |" in md


def test_objectives_without_nsp_leave_the_nsp_columns_out():
    metrics = _metrics()
    for by_model in metrics["intrinsic"].values():
        for scores in by_model.values():
            scores.pop("nsp_loss"), scores.pop("nsp_accuracy")
            scores.get("baselines", {}).pop("nsp_balance", None)
    md = report.render_markdown(metrics, {})
    section = md.split("## Validation masked LM")[1].split("##")[0]
    assert "NSP" not in section and "next sentence" not in section and "majority label" not in section
    header = next(line for line in md.splitlines() if line.startswith("| phase | model |"))
    assert header.endswith("| MLM acc. |")


def test_score_rows_share_keys_and_gain_is_the_difference():
    rows = score_rows(_metrics())
    keys = {tuple(sorted(r)) for r in rows}
    assert len(keys) == 1
    by = {(r["section"], r["name"], r["metric"]): r for r in rows}
    accuracy = by[("fine-tuning", "sst", "accuracy")]
    assert accuracy["pretrained"] == pytest.approx(0.8771) and accuracy["random_init"] == pytest.approx(0.60)
    assert accuracy["gain"] == pytest.approx(0.2771) and accuracy["seeds"] == 3
    assert (accuracy["pretrained_min"], accuracy["pretrained_max"]) == (0.85, 0.90)
    assert by[("fine-tuning", "stsb", "spearman")]["pretrained"] is None  # nan becomes null
    assert (accuracy["baseline"], accuracy["baseline_name"]) == (0.52, "majority class")
    assert (
        by[("pretraining", "seq128", "nsp_accuracy")]["baseline"],
        by[("pretraining", "seq128", "nsp_accuracy")]["baseline_name"],
    ) == (0.5243, "majority label")
    assert ("fine-tuning", "stsb (test)", "spearman") in by
    mlm = by[("pretraining", "seq128", "mlm_accuracy")]
    assert mlm["gain"] == pytest.approx(0.0447 - 0.0003)
    assert by[("embeddings", "mean", "anisotropy")]["random_init"] == 0.96
    json.dumps(rows, allow_nan=False)  # a table artifact takes plain JSON


def test_the_report_links_each_diagnosis_whenever_it_is_made():
    """`bertpipe diagnose` after the stage rewrites the section the stage renders when the
    diagnosis already exists: the same report either way, and linking again changes nothing."""
    metrics = _metrics()
    links = {"polarity": "../diagnose/polarity/diagnosis.md"}
    plain = report.render_markdown(metrics, {})
    assert "## Diagnoses" not in plain
    linked = report.with_diagnoses(plain, links)
    assert linked == report.render_markdown(metrics, {}, links)
    assert "- polarity: [../diagnose/polarity/diagnosis.md](../diagnose/polarity/diagnosis.md)" in linked
    assert report.with_diagnoses(linked, links) == linked
    more = report.with_diagnoses(linked, {**links, "sst2": "../diagnose/sst2/diagnosis.md"})
    assert more == report.render_markdown(metrics, {}, {**links, "sst2": "../diagnose/sst2/diagnosis.md"})
