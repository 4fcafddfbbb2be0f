"""The `bertpipe` command as a user runs it (a subprocess with its own Ray and Prefect)."""

from __future__ import annotations

import json
import os
import re
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


def test_version_names_the_package_and_what_it_runs_on():
    out = bertpipe("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("bertpipe ")
    assert all(re.search(rf"\b{name} \d", out.stdout) for name in ("python", "torch", "ray", "prefect")), out.stdout


def test_config_show_prints_the_resolved_recipe_with_credentials_masked(tmp_path):
    import yaml

    out = bertpipe(
        "config", "show", "--config", "configs/demo.yaml",
        "--set", f"run.root={tmp_path}", "--set", "storage.key=AKIASECRETKEYID", "--set", "storage.secret=very-secret",
        "--set", "storage.endpoint_url=https://minio:hunter2@objects.example:9000",
    )
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and "very-secret" not in out.stdout and "AKIASECRETKEYID" not in out.stdout
    shown = yaml.safe_load(out.stdout)
    assert shown["storage"]["key"] == shown["storage"]["secret"] == "****"
    assert shown["storage"]["endpoint_url"] == "https://minio:****@objects.example:9000"
    assert shown["run"]["root"] == str(tmp_path)
    # {demo_data} expanded, defaults filled in
    assert Path(shown["corpus"]["inputs"][0]["uri"]).exists()
    assert shown["examples"]["masked_lm_prob"] == 0.15


def test_json_log_format_is_one_object_per_line(tmp_path):
    """A real run of the corpus stage: logs on stderr and the summary on stdout, all JSON;
    the stage's start, progress and end lines carry their figures as fields."""
    out = bertpipe(
        "--log-format", "json", "run", "--config", "configs/demo.yaml", "--only", "corpus",
        "--set", f"run.root={tmp_path}", "--set", "corpus.inputs=[{uri: '{demo_data}/lee_background.cor', format: lines}]",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    (result,) = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    events = {r.get("event"): r for r in records}
    assert events["stage_start"]["stage"] == "corpus"
    assert events["progress"]["label"].startswith("corpus:") and events["progress"]["total"] >= 1
    assert events["stage_end"]["headline"]["documents"] > 0
    assert any(r.get("task_run_name") == "corpus" and "Finished in state" in r["message"] for r in records)
    assert result["event"] == "summary" and [s["state"] for s in result["stages"]] == ["computed"]
    assert result["stages"][0]["headline"] == events["stage_end"]["headline"]


def test_quiet_leaves_out_the_info_lines(tmp_path):
    out = bertpipe("-q", "run", "--config", "configs/demo.yaml", "--only", "vocab", "--set", f"run.root={tmp_path}")
    assert out.returncode == 2
    assert any(line.startswith("bertpipe: error: vocab: the corpus stage has no output") for line in out.stderr.splitlines()), out.stderr
    assert not [line for line in out.stderr.splitlines() if "Beginning flow run" in line or "Starting temporary server" in line]


NOISE = (
    "Failed to query Ray Train Controller",  # Ray Train's controller watchdog without a state API
    "Token authentication is enabled",  # Ray choosing token auth by default
    "core_worker.cc",  # the preemption watcher's constructor arguments
    "FutureWarning",  # DeepSpeed calling deprecated torch.distributed names
    "step/s]",  # a relayed progress bar
    "deepspeed_shm_comm_op built successfully",
)


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
    assert f'from_pretrained("{tmp_path / "pretrain" / "model"}")' in out.stdout
    console = out.stderr.splitlines() + out.stdout.splitlines()
    assert not [line for line in console if any(noise in line for noise in NOISE)], [l for l in console if any(n in l for n in NOISE)]
    assert all(len(line) <= 200 for line in console), max(console, key=len)
    for stage in stages:  # every stage shows progress while it runs
        assert any(line.split(" ", 1)[-1].startswith((f"{stage}: start", f"{stage} ")) for line in console), stage
        assert any(re.search(rf" {stage}(: \w+)? \d+/\d+ (units|jobs) ", line) or f"{stage}: step " in line for line in console), stage
    text = report.read_text(encoding="utf-8")
    assert "polarity" in text and "random" in text.lower()
    assert (tmp_path / "eval" / "metrics.json").exists()

    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(tmp_path / "pretrain" / "model"))
    assert len(fill("The city is on the [MASK] of the river.")) == 5

    status = bertpipe("status", "--config", "configs/demo.yaml", *sets, "--json")
    assert status.returncode == 0, status.stderr

    # what the last two stages produced, as `inspect` shows it
    checkpoints = json.loads(bertpipe("inspect", "pretrain", "--root", str(tmp_path), "--json").stdout)
    assert [c["step"] for c in checkpoints["checkpoints"]] == [20, 40]
    assert all(c["bytes"] > 0 and c["loss"] is not None for c in checkpoints["checkpoints"])
    assert {f["file"] for f in checkpoints["model"]["files"]} >= {"config.json", "model.safetensors", "vocab.txt"}
    scores = json.loads(bertpipe("inspect", "evaluate", "--root", str(tmp_path), "--json").stdout)
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text(encoding="utf-8"))
    polarity = next(r for r in scores["scores"] if r["name"] == "polarity" and r["metric"] == "accuracy" and r["section"] != "pretraining")
    assert polarity["pretrained"] == metrics["tasks"]["polarity"]["pretrained"]["validation"]["accuracy"]["median"]
    text = bertpipe("inspect", "evaluate", "--root", str(tmp_path)).stdout
    assert "polarity" in text and "random init" in text
    assert {r["stage"]: r["state"] for r in json.loads(status.stdout)} == dict.fromkeys(stages, "complete")

    again = bertpipe("run", "--config", "configs/demo.yaml", *sets, timeout=600)
    assert again.returncode == 0
    assert "computed" not in again.stdout and again.stdout.count("cached") == 5
