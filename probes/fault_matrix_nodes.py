"""Fault matrix, lost nodes: the rows the suite's own fault tests leave out.

- distill: two Ray Train workers (no dropout) (ZeRO-2 on CPU), one SIGKILLed after checkpoint 10 (as a
  lost node does to its workers), then another after checkpoint 20 with a CPU taken away:
  the stage restarts in the same run, then goes on with one worker and gradient
  accumulation 2. Compared with the uninterrupted two-worker distillation.
- a data stage, node lost for good: corpus, vocab and examples driven on the two-node
  cluster of tests/stages/test_ray_cluster.py; while examples builds its shards the worker node
  (its `ray start` process, raylet, agents and workers) is frozen and SIGKILLed and never
  comes back. Ray's task retries and lineage reconstruction finish the stage on the head.
  Compared with the same stages on embedded Ray.
- pretrain, node lost for good (world size 2 -> 1): one Ray Train worker on each node of
  the two-node cluster; after checkpoint 10 the worker node is killed and never comes back.
  After the rejoin wait the stage goes on with the head's worker alone, gradient
  accumulation 2. Compared with an uninterrupted two-worker run on embedded Ray.

Not part of the suite (pytest collects test_*.py only); run it on purpose, nothing else
running (about 5 minutes on 2 cores):

    .venv/bin/pytest -q -s probes/fault_matrix_nodes.py

Each case prints one MATRIX line: what was lost, what the run did, whether the outputs
equal the undisturbed run's.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil
import pytest
import safetensors.torch

from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, checkpoint_tag
from bertcore.train.metrics_log import MetricsLog
from pipelines.runner import run_stage
from test_distill_stage import READS, _fresh_root, inputs, section  # noqa: F401 - inputs is a fixture
from test_operator import freeze_node, kill_node
from test_pretrain_stage import STORAGE, metrics, train
from test_ray_cluster import DRIVER, two_node_cluster  # noqa: F401 - a fixture
from test_train import SEED, tiny_pretrain
from test_training_faults import _copy_inputs, _kill_workers_when, news_root  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow


def matrix(line: str) -> None:
    print(f"\nMATRIX {line}", flush=True)


def _largest_difference(a: Path, b: Path) -> float:
    got, want = safetensors.torch.load_file(str(a)), safetensors.torch.load_file(str(b))
    assert got.keys() == want.keys()
    return max(float((got[k] - want[k]).abs().max()) for k in want)


def test_distill_survives_lost_workers_and_a_smaller_cluster(
    ray_cluster,
    inputs,  # noqa: F811 - the fixture imported above
    tmp_path,
    caplog,
):
    _, teacher = inputs
    # no dropout (the student takes the teacher's): then a different world size changes only
    # the order floats are summed in, and the comparison is exact up to that
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(
        json.dumps({**config, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    )
    cfg = section(
        teacher,
        num_workers=2,
        zero_stage=2,
        phases=[{"name": "seq64", "steps": 40, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10,
        validation_batches=2,
        eval_every=None,
        rejoin_timeout_s=3,
    )
    reference_root, faulty_root = _fresh_root(inputs, tmp_path / "reference"), _fresh_root(inputs, tmp_path / "faulty")
    reference, _ = run_stage("distill", cfg, root=str(reference_root), storage=STORAGE, seed=SEED, reads=READS)

    fault = _kill_workers_when(ray_cluster, faulty_root / "distill" / CHECKPOINTS, [(10, 0), (20, 1)])
    began = time.monotonic()
    with caplog.at_level(logging.WARNING):
        try:
            result, computed = run_stage("distill", cfg, root=str(faulty_root), storage=STORAGE, seed=SEED, reads=READS)
        finally:
            fault["thread"].join(timeout=30)
            for blocker in fault["blockers"]:
                ray_cluster.kill(blocker)
    took = time.monotonic() - began
    assert fault["error"] is None and len(fault["killed"]) == 2, fault
    lines = [r.getMessage() for r in caplog.records]
    restarts = [line for line in lines if "restarting the workers from checkpoint" in line]
    assert len(restarts) == 2 and any("going on with 1, gradient accumulation 2" in line for line in lines), lines

    def records(root):
        return MetricsLog(str(root / "distill" / "metrics.jsonl")).records()

    after, before = records(faulty_root), records(reference_root)
    second = fault["at"][1]
    assert [r["step"] for r in after] == list(range(1, 41))
    assert [r["tokens"] for r in after] == [r["tokens"] for r in before]
    same_prefix = [(r["data_hash"], r["loss"]) for r in after[:second]] == [
        (r["data_hash"], r["loss"]) for r in before[:second]
    ]
    assert same_prefix
    worst_loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(after[second:], before[second:], strict=True))
    assert worst_loss < 2e-4
    worst = _largest_difference(
        faulty_root / "distill" / "model" / "model.safetensors",
        reference_root / "distill" / "model" / "model.safetensors",
    )
    assert worst < 1e-3
    assert result.stats["tokens_seen"] == reference.stats["tokens_seen"] and result.stats["world_size"] == 1
    held_out = [
        MetricsLog(str(r / "distill" / "validation.jsonl")).records()[-1] for r in (faulty_root, reference_root)
    ]
    assert held_out[0]["sequences"] == held_out[1]["sequences"] and held_out[0]["loss"] == pytest.approx(
        held_out[1]["loss"], abs=1e-4
    )
    matrix(
        f"distill: worker SIGKILLed after checkpoint {fault['at'][0]}, then another with a CPU gone after {second}: "
        f"recovered by itself in the same run ({len(restarts)} restarts, then 1 worker x gradient accumulation 2; "
        f"{took:.0f} s); same tokens ({result.stats['tokens_seen']}), steps 1-{second} bit for bit, later losses "
        f"within {worst_loss:.1e}, student weights within {worst:.1e}; held-out loss {held_out[0]['loss']:.4f} "
        f"against {held_out[1]['loss']:.4f} on the same {held_out[0]['sequences']} sequences"
    )


def _losses(records: list[dict]) -> dict:
    return {k: round(v, 4) for k, v in (records[-1] if records else {}).items() if "loss" in k and isinstance(v, float)}


def _cluster_config(cfg, root: Path, address: str):
    return cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"root": str(root)}),
            "ray": cfg.ray.model_copy(update={"address": address}),
        }
    )


def _kill_node_when(node, cmdline_part: str, timeout: float = 600) -> dict:
    """In the background: once a process under `node` (a `ray start --block` process) runs a
    task whose title holds `cmdline_part`, freeze the node and SIGKILL all of it."""
    out: dict = {"lost": None, "error": None, "at": None}

    def run() -> None:
        try:
            deadline = time.monotonic() + timeout
            root = psutil.Process(node.pid)
            while time.monotonic() < deadline:
                for process in root.children(recursive=True):
                    try:
                        if cmdline_part in " ".join(process.cmdline()):
                            out["at"] = time.monotonic()
                            out["lost"] = kill_node(node, freeze_node(node))
                            return
                    except psutil.NoSuchProcess:
                        continue
                time.sleep(0.05)
            raise AssertionError(f"no {cmdline_part} task ran on the worker node")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out["error"] = exc

    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def test_a_data_stage_outlives_a_node_lost_for_good(
    two_node_cluster,  # noqa: F811 - the fixture imported above
    demo_pipeline,
    tmp_path,
):
    cluster = two_node_cluster
    reference_cfg, reference = demo_pipeline
    config_file = tmp_path / "config.json"
    config_file.write_text(_cluster_config(reference_cfg, tmp_path / "run", cluster.address).model_dump_json())
    worker_node = cluster.procs[1]
    fault = _kill_node_when(worker_node, "build_shard")
    began = time.monotonic()
    try:
        out = cluster.run_driver(DRIVER, str(config_file), "corpus,vocab,examples", "2", cwd=tmp_path)
    finally:
        took = time.monotonic() - began
        fault["thread"].join(timeout=60)
        cluster.join_node()  # the next case starts from two nodes again
    assert fault["error"] is None and fault["lost"], fault
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and results, out.stderr[-4000:]
    result = json.loads(results[-1].removeprefix("RESULT "))
    equal = {
        name: result["stages"][name]["shards"] == {s.path: s.sha256 for s in reference[name].shards}
        for name in result["stages"]
    }
    assert all(equal.values()), equal
    matrix(
        f"examples on two nodes: worker node ({len(fault['lost'])} processes: raylet, agents, workers) SIGKILLed "
        "while build_shard ran there, never restarted: recovered by itself (Ray task retries on the head; driver "
        f"exit 0 after {took:.0f} s); corpus/vocab/examples shards equal embedded Ray's byte for byte"
    )


PRETRAIN = r"""
import json, sys, time
import ray
from bertcore.config import RayConfig, StorageConfig
from bertcore.train.config import PretrainConfig
from pipelines.ray_runtime import ensure_ray
from pipelines.runner import run_stage
from pipelines.storage import Storage

address, root, section, seed = sys.argv[1:5]
ensure_ray(RayConfig(address=address))
deadline = time.monotonic() + 120
while sum(node["Alive"] for node in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.5)
manifest, computed = run_stage(
    "pretrain", PretrainConfig.model_validate_json(section), root=root, storage=Storage(StorageConfig()), seed=int(seed)
)
print("RESULT " + json.dumps(manifest.stats))
"""


def test_pretrain_goes_on_with_one_worker_when_a_node_is_lost_for_good(
    two_node_cluster,  # noqa: F811 - the fixture imported above
    ray_cluster,
    news_root,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    cluster = two_node_cluster
    cfg = tiny_pretrain(
        num_workers=2,
        zero_stage=2,
        phases=[{"name": "seq64", "steps": 30, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10,
        validation_batches=2,
        eval_every=None,
        rejoin_timeout_s=10,
    )
    reference_root, faulty_root = tmp_path / "reference", tmp_path / "faulty"
    _copy_inputs(news_root, reference_root)
    _copy_inputs(news_root, faulty_root)
    reference = train(cfg, reference_root)

    marker = faulty_root / "pretrain" / CHECKPOINTS / checkpoint_tag(10) / COMPLETE
    out: dict = {"lost": None}

    def lose_the_node() -> None:
        deadline = time.monotonic() + 600
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if marker.exists():
            node = cluster.procs[-1]  # the worker node (rejoined after the data-stage case, when that ran first)
            out["lost"] = kill_node(node, freeze_node(node))

    watcher = threading.Thread(target=lose_the_node, daemon=True)
    watcher.start()
    began = time.monotonic()
    run = cluster.run_driver(
        PRETRAIN, cluster.address, str(faulty_root), cfg.model_dump_json(), str(SEED), cwd=tmp_path
    )
    took = time.monotonic() - began
    watcher.join(timeout=60)
    results = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and results, run.stderr[-4000:]
    assert out["lost"] and "raylet" in out["lost"], out
    stats = json.loads(results[-1].removeprefix("RESULT "))
    resizes = stats["resizes"]
    assert stats["world_size"] == 1 and len(resizes) == 1 and resizes[0]["to_workers"] == 1, stats
    assert stats["tokens_seen"] == reference.stats["tokens_seen"]
    after, before = metrics(faulty_root), metrics(reference_root)
    assert [r["step"] for r in after] == list(range(1, 31)) and [r["tokens"] for r in after] == [
        r["tokens"] for r in before
    ]
    worst_loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(after, before, strict=True))
    worst = _largest_difference(
        faulty_root / "pretrain" / "model" / "model.safetensors",
        reference_root / "pretrain" / "model" / "model.safetensors",
    )
    val_after = MetricsLog(str(faulty_root / "pretrain" / "validation.jsonl")).records()
    val_before = MetricsLog(str(reference_root / "pretrain" / "validation.jsonl")).records()
    matrix(
        "pretrain on two nodes (1 worker each): worker node SIGKILLed after checkpoint 10, never restarted: "
        "recovered by itself "
        f"(after the {cfg.rejoin_timeout_s:.0f} s rejoin wait, from step {resizes[0]['step']} with 1 worker "
        "x gradient accumulation "
        f"{resizes[0]['gradient_accumulation_steps']}; driver exit 0 after {took:.0f} s); same tokens "
        f"({stats['tokens_seen']}), "
        f"every step's loss within {worst_loss:.1e} of the uninterrupted 2-worker run, weights within {worst:.1e}; "
        f"held-out ({val_after[-1]['sequences']} against {val_before[-1]['sequences']} sequences) "
        f"{_losses(val_after)} against {_losses(val_before)}"
    )
    assert worst_loss < 2e-4 and worst < 1e-3
    # the held-out sample is the same on one worker as on two
    assert val_after[-1]["sequences"] == val_before[-1]["sequences"]
    assert val_after[-1]["loss"] == pytest.approx(val_before[-1]["loss"], abs=1e-4)
