"""Faults a training stage survives by itself, on a real local Ray (2 CPUs) with Ray Train
workers running DeepSpeed ZeRO-2 on CPU: a training worker killed mid-run is restarted from
the latest checkpoint in the same run, with fewer workers when the cluster holds fewer after
the rejoin wait (the same global batch by gradient accumulation: the same tokens, the same
losses as an uninterrupted run); `--force` trains from step 0 instead of resuming."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from test_pretrain_stage import STORAGE, metrics, train  # noqa: E402
from test_train import SEED, tiny_pretrain  # noqa: E402

from bertcore.checkpoint import CHECKPOINTS, COMPLETE, checkpoint_tag  # noqa: E402
from bertcore.errors import BertpipeError  # noqa: E402
from pipelines.elastic import resized, world_sizes  # noqa: E402
from pipelines.runner import run_stage  # noqa: E402


@pytest.fixture(scope="module")
def news_root(tmp_path_factory, gensim_data):
    from test_train import make_run_root

    root = tmp_path_factory.mktemp("faults")
    make_run_root(root, gensim_data, max_documents=120, dupe_factor=1)
    return root


def _copy_inputs(source, target) -> None:
    for part in ("examples", "vocab"):
        shutil.copytree(source / part, target / part)


def _training_worker_pids(ray) -> list[int]:
    from ray.util.state import list_actors

    actors = list_actors(filters=[("state", "=", "ALIVE")], detail=True, raise_on_missing_output=False)
    return sorted(a.pid for a in actors if "RayTrainWorker" in (a.class_name or ""))


def _kill_a_worker_when(ray, ready, blocker_cpus: int = 0) -> dict:
    """In the background: once `ready()`, SIGKILL one training worker (as a lost node does
    to its workers) and, with `blocker_cpus`, take that many CPUs so the cluster holds fewer
    workers for the restart."""
    out: dict = {}

    def run() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not ready():
            time.sleep(0.05)
        pids = _training_worker_pids(ray)
        out["pids"] = pids
        if blocker_cpus:

            @ray.remote(num_cpus=blocker_cpus)
            class Blocker:
                def ready(self) -> bool:
                    return True

            out["blocker"] = Blocker.remote()  # pending until the killed worker's CPU is free
        os.kill(pids[-1], signal.SIGKILL)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def test_world_sizes_keep_the_global_batch():
    cfg = tiny_pretrain(num_workers=4, gradient_accumulation_steps=1, phases=[{"name": "seq64", "steps": 8, "batch_size": 16}])
    assert world_sizes(cfg) == [4, 2, 1]  # 3 workers cannot split 4 micro-batches per step
    two = resized(cfg, 2)
    assert (two.num_workers, two.gradient_accumulation_steps) == (2, 2)
    assert two.micro_batch_size(two.phases[0]) == cfg.micro_batch_size(cfg.phases[0])
    assert world_sizes(cfg.model_copy(update={"min_workers": 2})) == [4, 2]


@pytest.mark.slow
def test_a_lost_worker_restarts_on_fewer_workers_with_the_same_tokens_and_losses(ray_cluster, news_root, tmp_path, caplog):
    """Two ZeRO-2 workers; at step ~14 one is SIGKILLed and a CPU is taken away, so after a
    3 s rejoin wait the stage goes on with one worker and gradient accumulation 2, from the
    step-10 checkpoint, in the same call. It ends at the same step with the same tokens, and
    every step's loss equals the uninterrupted two-worker run's (no dropout: the same
    micro-batches give the same mean gradient, up to summation order)."""
    cfg = tiny_pretrain(
        num_workers=2,
        zero_stage=2,
        phases=[{"name": "seq64", "steps": 30, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10,
        validation_batches=2,
        eval_every=None,
        rejoin_timeout_s=3,
    )
    reference_root, faulty_root = tmp_path / "reference", tmp_path / "faulty"
    _copy_inputs(news_root, reference_root)
    _copy_inputs(news_root, faulty_root)
    reference = train(cfg, str(reference_root))
    first_marker = faulty_root / "pretrain" / CHECKPOINTS / checkpoint_tag(10) / COMPLETE
    fault = _kill_a_worker_when(ray_cluster, lambda: first_marker.exists() and len(metrics(faulty_root)) >= 14, blocker_cpus=1)
    with caplog.at_level(logging.WARNING):
        try:
            result = train(cfg, str(faulty_root))
        finally:
            fault["thread"].join(timeout=30)
            if "blocker" in fault:
                ray_cluster.kill(fault["blocker"])
    lines = [r.getMessage() for r in caplog.records]
    assert any("lost worker rank" in line and "restarting the workers from checkpoint step-0000010 (restart 1 of 3)" in line
               for line in lines), lines
    assert any("going on with 1, gradient accumulation 2" in line for line in lines), lines
    assert result.stats["steps"] == 30 and result.stats["world_size"] == 1
    assert result.stats["resizes"] == [{"step": 10, "from_workers": 2, "to_workers": 1, "gradient_accumulation_steps": 2}]
    assert result.stats["tokens_seen"] == reference.stats["tokens_seen"]
    after, before = metrics(faulty_root), metrics(reference_root)
    assert [r["step"] for r in after] == list(range(1, 31))
    assert [r["tokens"] for r in after] == [r["tokens"] for r in before]
    assert [r["loss"] for r in after] == pytest.approx([r["loss"] for r in before], abs=2e-4)
    # the exported models are the same model, up to the order floats were summed in
    from safetensors.torch import load_file

    got, want = (load_file(str(r / "pretrain" / "model" / "model.safetensors")) for r in (faulty_root, reference_root))
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 1e-3, worst


@pytest.mark.slow
def test_force_trains_from_step_zero_and_a_plain_rerun_resumes(ray_cluster, news_root, tmp_path, caplog):
    cfg = tiny_pretrain(phases=[{"name": "seq64", "steps": 12, "batch_size": 8, "max_seq_length": 64}], checkpoint_every=6,
                        validation_batches=0)
    root = tmp_path / "run"
    _copy_inputs(news_root, root)
    first = train(cfg, str(root))
    _, computed = run_stage("pretrain", cfg, root=str(root), storage=STORAGE, seed=SEED)
    assert not computed  # a plain rerun of a complete stage is cached
    with caplog.at_level(logging.INFO, logger="pipelines.training"):
        forced, computed = run_stage("pretrain", cfg, root=str(root), storage=STORAGE, seed=SEED, force=True)
    assert computed
    lines = [r.getMessage() for r in caplog.records]
    assert any("--force: deleting the checkpoints" in line for line in lines), lines
    assert not any("resum" in line for line in lines), lines  # was: "resuming from step 12", nothing trained
    assert [r["step"] for r in metrics(root)] == list(range(1, 13))
    assert forced.stats["tokens_seen"] == first.stats["tokens_seen"]


def test_too_few_workers_after_the_wait_fail_in_one_line(ray_cluster):
    from pipelines.elastic import choose_world_size

    cfg = tiny_pretrain(num_workers=2, min_workers=2, rejoin_timeout_s=0.5,
                        phases=[{"name": "seq64", "steps": 8, "batch_size": 16, "max_seq_length": 64}])

    @ray_cluster.remote(num_cpus=2)
    class Hog:
        def ready(self) -> bool:
            return True

    hog = Hog.remote()
    ray_cluster.get(hog.ready.remote())
    try:
        with pytest.raises(BertpipeError) as failed:
            choose_world_size(cfg, "worker rank 1 on node 3f2a9c1e (127.0.0.1)")
    finally:
        ray_cluster.kill(hog)
    message = str(failed.value)
    assert "\n" not in message
    assert "lost worker rank 1 on node 3f2a9c1e" in message and "pretrain.min_workers=2" in message and "rerun" in message
