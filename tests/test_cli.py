"""The `bertpipe` command as a user runs it (a subprocess with its own Ray and Prefect)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BERTPIPE = [sys.executable, "-m", "flows.cli"]


def bertpipe(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*BERTPIPE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_demo_data_prints_existing_paths():
    out = bertpipe("demo-data")
    assert out.returncode == 0, out.stderr
    paths = [line.split(": ", 1)[1] for line in out.stdout.splitlines()]
    assert len(paths) == 5 and all(Path(p).exists() for p in paths)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "corpus.min_sentencs=2"], "corpus.min_sentencs: unknown key"),
        (["--set", "corpus.min_sentences=many"], "corpus.min_sentences"),
        (["--only", "trainer"], "unknown stage 'trainer'"),
        (["--set", "corpus.inputs=['/no/such/file.txt']", "--only", "corpus"], "corpus.inputs[0]: no file matches /no/such/file.txt"),
    ],
)
def test_user_errors_are_one_line(args, message, tmp_path):
    out = bertpipe("run", "--config", "configs/demo.yaml", "--set", f"run.root={tmp_path}", *args)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("bertpipe: error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_demo_flow_end_to_end(tmp_path):
    """All five stages through the CLI with the demo recipe, shortened: a report at the end,
    a model transformers loads, then a second run that is cached throughout."""
    overrides = [
        f"run.root={tmp_path}",
        "vocab.vocab_size=3000",
        "examples.dupe_factor=1",
        "examples.phases=[{name: seq128, max_seq_length: 128, max_predictions_per_seq: 20}]",
        "pretrain.phases=[{name: seq128, steps: 40, batch_size: 16, max_seq_length: 128}]",
        "pretrain.checkpoint_every=20",
        "evaluate.tasks=[{name: polarity, type: classification, format: fasttext, "
        "train: '{demo_data}/pang_lee_polarity.cor', encoding: cp1252, cross_validation_folds: 3, "
        "seeds: [1], epochs: 1, batch_size: 16, max_seq_length: 32}]",
        "evaluate.embeddings.sentences=100",
    ]
    sets = [arg for item in overrides for arg in ("--set", item)]
    out = bertpipe("run", "--config", "configs/demo.yaml", *sets, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    stages = ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    lines = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in [[s] for s in stages]]
    assert [(l[0], l[1]) for l in lines] == [(s, "computed") for s in stages]
    report = tmp_path / "eval" / "report.md"
    assert f"report: {report}" in out.stdout
    text = report.read_text(encoding="utf-8")
    assert "polarity" in text and "random" in text.lower()
    assert (tmp_path / "eval" / "metrics.json").exists()

    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(tmp_path / "pretrain" / "model"))
    assert len(fill("The city is on the [MASK] of the river.")) == 5

    status = bertpipe("status", "--config", "configs/demo.yaml", *sets, "--json")
    assert status.returncode == 0, status.stderr
    assert {r["stage"]: r["state"] for r in json.loads(status.stdout)} == dict.fromkeys(stages, "complete")

    again = bertpipe("run", "--config", "configs/demo.yaml", *sets, timeout=600)
    assert again.returncode == 0
    assert "computed" not in again.stdout and again.stdout.count("cached") == 5
