"""`bertpipe diagnose` as a user runs it (in this process, typer's runner; no Ray, no
Prefect): the files it writes beside the evaluate stage with their manifest, the evaluate
report's link to them (the report's manifest entry kept true), and the one-line refusals of
bad input: a task the recipe lacks, a folder that is no model, a missing column, a target
inside a stage directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertcore.config import StorageConfig
from pipelines.stage_dir import Manifest, ShardInfo, StageDir
from pipelines.storage import Storage, sha256_file
from test_diagnosis import WORDS, corpus, rows, write_tsv
from tiny_bert import save_tiny_bert

ROOT = Path(__file__).resolve().parents[2]


def _shard(folder: Path, relative: str) -> ShardInfo:
    path = folder / relative
    return ShardInfo(relative, rows=0, bytes=path.stat().st_size, sha256=sha256_file(str(path)))


@pytest.fixture(scope="module")
def run_root(tmp_path_factory):
    """A run root with a complete pretrain stage (a tiny BERT as its model/) and a complete
    evaluate stage whose report the diagnosis is to be linked from; and the recipe."""
    root = tmp_path_factory.mktemp("run")
    pretrain, evaluate = root / "pretrain", root / "eval"
    save_tiny_bert(pretrain / "model", corpus(), vocab_size=200, words=WORDS)
    shards = [_shard(pretrain, f"model/{name}") for name in sorted(os.listdir(pretrain / "model"))]
    manifest = Manifest("pretrain", "1", "p" * 20, {}, {}, shards, {}, {})
    (pretrain / "_manifest.json").write_text(json.dumps(manifest.to_json()))
    evaluate.mkdir()
    (evaluate / "report.md").write_text("# Evaluation report\n\nscores\n\n## Notes\n\n- a note\n", encoding="utf-8")
    config = {"tasks": [{"name": "planted"}, {"name": "broken"}]}
    manifest = Manifest(
        "evaluate", "3", "e" * 20, {}, config, [_shard(evaluate, "report.md")], {}, {}, report="report.md"
    )
    (evaluate / "_manifest.json").write_text(json.dumps(manifest.to_json()))
    files = root / "files"
    files.mkdir()
    task = {"type": "classification", "format": "tsv", "epochs": 4, "batch_size": 8, "learning_rate": 2e-3}
    task |= {"max_seq_length": 16, "seeds": [1]}
    recipe = {
        "extends": str(ROOT / "configs" / "demo.yaml"),
        "run": {"root": str(root)},
        "evaluate": {
            "tasks": [
                {
                    **task,
                    "name": "planted",
                    "train": write_tsv(files / "train.tsv", rows(1, 40)),
                    "validation": write_tsv(files / "dev.tsv", rows(2, 12)),
                },
                {
                    **task,
                    "name": "broken",
                    "text_a": "review",
                    "train": str(files / "train.tsv"),
                    "validation": str(files / "dev.tsv"),
                },
            ]
        },
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(recipe))), encoding="utf-8")  # no shared nodes: no aliases
    return root, path


def bertpipe(*args: str):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, list(args))


def test_the_diagnosis_is_written_beside_the_evaluate_stage_and_linked_from_its_report(run_root):
    root, recipe = run_root
    result = bertpipe(
        "diagnose", "-c", str(recipe), "--task", "planted", "--folds", "2", "--learning-rates", "1e-3", "--threads", "1"
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    findings = [line for line in lines if line.split(" ", 1)[0] in ("problem", "warning", "note", "ok", "n/a")]
    assert len(findings) == 13 and any(line.startswith("ok      rows:") for line in findings)
    assert f"diagnosis: {root}/diagnose/planted/diagnosis.md (5 fine-tunes in" in result.output
    assert "linked from the evaluate report (eval/report.md)" in result.output
    folder = root / "diagnose" / "planted"
    manifest = Manifest.from_json(json.loads((folder / "_manifest.json").read_text()))
    assert manifest.stage == "diagnose" and manifest.report == "diagnosis.md"
    assert {"diagnosis.md", "diagnosis.json", "suspect_labels.tsv", "lr_sweep.png"} <= {s.path for s in manifest.shards}
    assert manifest.inputs["model"]["stage"] == "pretrain"
    report = (root / "eval" / "report.md").read_text(encoding="utf-8")
    assert (
        "## Diagnoses" in report
        and "- planted: [../diagnose/planted/diagnosis.md](../diagnose/planted/diagnosis.md)" in report
    )
    assert report.index("## Diagnoses") < report.index("## Notes")
    evaluate = StageDir(Storage(StorageConfig()), str(root), "eval")
    assert evaluate.state(None) == "complete"  # the report's new bytes are the ones its manifest records


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("--task", "nope"),
            "--task nope: the recipe has no evaluate task of that name (evaluate.tasks: planted, broken)",
        ),
        (("--task", "planted", "--model", "{root}/files"), "--model: {root}/files holds no Hugging Face model"),
        (("--task", "broken"), "column 'review' is missing"),
        (("--task", "planted", "--out", "{root}/pretrain"), "diagnose never writes there"),
    ],
)
def test_bad_input_is_refused_in_one_line(run_root, args, message):
    root, recipe = run_root
    result = bertpipe("diagnose", "-c", str(recipe), *(a.format(root=root) for a in args))
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("bertpipe: error: ") and message.format(root=root) in last, last
