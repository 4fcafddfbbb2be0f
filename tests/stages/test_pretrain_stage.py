"""The pretrain stage on a real local Ray (2 CPUs) with Ray Train workers running DeepSpeed
on CPU (gloo, DS_ACCELERATOR=cpu): it learns, ZeRO-2 on two workers follows plain data
parallelism on one, a run killed with SIGKILL resumes to the same steps on the same data,
and the model it exports is what transformers loads."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil
import pytest
import torch
import transformers

from bertcore.config import StorageConfig
from bertcore.errors import ConfigError
from bertcore.examples.config import ExamplesConfig
from bertcore.model.bert import BertForPreTraining, ModelConfig
from bertcore.train import metrics_log
from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, LocalStageFiles, checkpoint_tag
from bertcore.train.config import PretrainConfig
from bertcore.train.export import HF_FILES, consolidate_checkpoint
from bertcore.train.metrics_log import MetricsLog
from bertcore.train.objectives import Pretraining
from bertcore.train.trainer import Trainer
from pipelines.registry import REGISTRY, PipelineConfig
from pipelines.runner import Pipeline, run_stage, upstream
from pipelines.stage import UpstreamMissing
from pipelines.stage_dir import StageDir
from pipelines.stage_files import StorageStageFiles
from pipelines.stages.pretrain import work as pretrain
from pipelines.storage import Storage, join
from processes import LOOPBACK, job_actors, listening_sockets, training_workers
from test_train import SEED, Crash, crash_at, make_run_root, phase_data, tiny_pretrain

STORAGE = Storage(StorageConfig())


def _alive_train_actors(ray) -> list[str]:
    """Class names of Ray Train's controller actors of this driver's job still alive (the
    state API is eventually consistent: an actor that just ended is given 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        names = sorted(a.class_name for a in job_actors(ray) if a.class_name in ("TrainController", "DatasetManager"))
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


def metrics(root: Path) -> list[dict]:
    return MetricsLog(str(root / "pretrain" / "metrics.jsonl")).records()


@pytest.fixture(scope="module")
def small_root(tmp_path_factory, gensim_data):
    """40 news articles, one pass: about 200 sequences of at most 64 tokens."""
    root = tmp_path_factory.mktemp("small")
    make_run_root(root, gensim_data, max_documents=40, dupe_factor=1)
    return root


@pytest.fixture(scope="module")
def news_root(tmp_path_factory, gensim_data):
    """All 300 articles, two passes: about 3,600 sequences."""
    root = tmp_path_factory.mktemp("news")
    return root, make_run_root(root, gensim_data)


def pipeline_config(root: Path, cfg: PretrainConfig) -> PipelineConfig:
    """A run config with this pretrain section (and the examples phases of make_run_root)."""
    return PipelineConfig(
        run={"root": str(root), "seed": SEED},
        corpus={"inputs": ["unused.txt"]},
        examples=ExamplesConfig.model_validate(
            json.loads((root / "examples" / "_manifest.json").read_text())["config"]
        ),
        pretrain=cfg,
    )


def train(cfg: PretrainConfig, root, storage: Storage = STORAGE, seed: int = SEED):
    """The pretrain stage on this section alone; returns its manifest."""
    return run_stage("pretrain", cfg, root=str(root), storage=storage, seed=seed)[0]


@pytest.mark.slow
def test_tiny_model_learns_and_the_stage_writes_model_metrics_and_checkpoints(ray_cluster, small_root, tmp_path):
    cfg = tiny_pretrain(
        num_workers=2,
        zero_stage=1,
        learning_rate=3e-3,
        warmup_steps=10,
        phases=[{"name": "seq64", "steps": 60, "batch_size": 32, "max_seq_length": 64}],
        checkpoint_every=40,
        keep_checkpoints=1,
        peak_flops_per_device=1e11,
        eval_every=20,
    )
    sigint = signal.getsignal(signal.SIGINT)
    manifest, computed = Pipeline(pipeline_config(small_root, cfg), STORAGE).run("pretrain")
    assert computed and (small_root / "pretrain" / "_manifest.json").exists()
    # Ray Train's fit() on the main thread installs a SIGINT handler holding its controller;
    # the stage puts the driver's back, so Ctrl-C is the driver's again and the controller ends
    assert signal.getsignal(signal.SIGINT) is sigint
    assert _alive_train_actors(ray_cluster) == []
    records = metrics(small_root)
    assert [r["step"] for r in records] == list(range(1, 61))
    first = sum(r["mlm_loss"] for r in records[:5]) / 5
    last = sum(r["mlm_loss"] for r in records[-10:]) / 10
    assert last <= 0.7 * first, (first, last)  # at least 30% lower within 60 steps
    assert all(r["sequences"] == 32 for r in records)
    assert records[-1]["lr"] == pytest.approx(3e-3 / 50)

    stage = small_root / "pretrain"
    assert sorted(n for n in os.listdir(stage / CHECKPOINTS) if n.startswith("step-")) == [
        checkpoint_tag(60)
    ]  # keep_checkpoints=1
    marker = json.loads((stage / CHECKPOINTS / checkpoint_tag(60) / COMPLETE).read_text())
    assert marker["step"] == 60 and marker["world_size"] == 2 and marker["zero_stage"] == 1
    stats = manifest.stats
    assert stats["steps"] == 60 and stats["stopped_by"] is None
    assert stats["tokens_seen"] == sum(r["tokens"] for r in records)
    assert 0 < stats["mfu"] < 1 and stats["tokens_per_s"] > 0
    assert stats["validation"]["sequences"] > 0 and 0 <= stats["validation"]["mlm_accuracy"] <= 1
    curve = stats["validation_curve"]
    assert [v["step"] for v in curve] == [20, 40, 60] and curve[-1] == stats["validation"]
    # (about 200 training sequences: the held-out loss may rise again as the model overfits them)
    expected = [f"{folder}/{n}" for folder in ("model", "model-mlm") for n in HF_FILES]
    assert sorted(s.path for s in manifest.shards) == sorted([*expected, "metrics.jsonl", "validation.jsonl"])
    # the upstream fingerprints and the seed: what went into the fingerprint besides the section
    assert manifest.inputs.keys() == {"examples", "vocab", "seed"} and manifest.config["zero_stage"] == 1

    # model/ is the final checkpoint in the Hugging Face layout
    model_dir = stage / "model"
    state = consolidate_checkpoint(
        str(stage / CHECKPOINTS / checkpoint_tag(60)), ModelConfig.model_validate(marker["model_config"])
    )
    ours = BertForPreTraining(ModelConfig.model_validate(marker["model_config"])).eval()
    ours.load_state_dict(state)
    theirs = transformers.BertForPreTraining.from_pretrained(str(model_dir)).eval()
    ids = torch.randint(5, ours.cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (theirs(input_ids=ids).prediction_logits - ours.full_logits(ids).prediction_logits).abs().max() < 1e-4
    fill = transformers.pipeline("fill-mask", model=str(model_dir), device="cpu")
    assert len(fill("the fire [MASK] the homes.", top_k=3)) == 3
    # model-mlm/ is the same encoder and MLM head as a BertForMaskedLM: it loads without unexpected keys
    masked, info = transformers.AutoModelForMaskedLM.from_pretrained(str(stage / "model-mlm"), output_loading_info=True)
    assert type(masked).__name__ == "BertForMaskedLM" and not info["unexpected_keys"] and not info["missing_keys"]
    with torch.no_grad():
        assert (masked.eval()(input_ids=ids).logits - ours.full_logits(ids).prediction_logits).abs().max() < 1e-4

    # the same config again: the stage is complete and skipped
    again, computed = Pipeline(pipeline_config(small_root, cfg), STORAGE).run("pretrain")
    assert not computed and again.fingerprint == manifest.fingerprint
    # a flipped byte in the exported weights: damaged, and re-exported from the final checkpoint
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    assert StageDir(STORAGE, str(small_root), "pretrain").state(manifest.fingerprint) == "damaged"
    repaired, computed = Pipeline(pipeline_config(small_root, cfg), STORAGE).run("pretrain")
    assert computed and [(s.path, s.sha256) for s in repaired.shards] == [(s.path, s.sha256) for s in manifest.shards]
    assert len(metrics(small_root)) == 60  # exported again, not trained again
    # `bertpipe export`: any complete checkpoint to any folder; a missing one is a clear error
    stage, inputs = (
        StageDir(STORAGE, str(small_root), "pretrain"),
        upstream(REGISTRY["pretrain"], str(small_root), STORAGE),
    )
    exported = pretrain.export_model(stage, inputs, step=60, out=str(tmp_path / "exported"))
    assert {(f["folder"].replace("exported", "model"), f["name"]): f["sha256"] for f in exported} == {
        tuple(s.path.split("/")): s.sha256 for s in manifest.shards if s.path.startswith("model")
    }
    with pytest.raises(ConfigError, match=r"no complete checkpoint step-0000040"):
        pretrain.export_model(stage, inputs, step=40)


@pytest.fixture(scope="module")
def zero2_run(ray_cluster, news_root):
    """Two ZeRO-2 workers, 20 steps, while every listening socket of the embedded Ray's
    processes is polled: (the run's losses, {process name: addresses it listened on})."""
    news_root, _ = news_root
    with listening_sockets() as seen:
        train(tiny_pretrain(num_workers=2, zero_stage=2, **ZERO2_BASE), str(news_root), STORAGE, SEED)
    return [r["loss"] for r in metrics(news_root)], seen


ZERO2_BASE = dict(
    phases=[{"name": "seq64", "steps": 20, "batch_size": 16, "max_seq_length": 64}],
    resume="never",
    validation_batches=0,
)


@pytest.mark.slow
def test_zero2_on_two_workers_follows_stage0_on_one_with_the_same_global_batch(zero2_run, news_root):
    news_root, _ = news_root
    zero2, _ = zero2_run
    # Both see the same micro-batches of 8: two workers at once, or one worker accumulating two.
    train(
        tiny_pretrain(num_workers=1, zero_stage=0, gradient_accumulation_steps=2, **ZERO2_BASE),
        str(news_root),
        STORAGE,
        SEED,
    )
    plain = [r["loss"] for r in metrics(news_root)]
    assert len(zero2) == len(plain) == 20
    assert zero2[-1] < zero2[0] - 0.3  # it trains
    assert max(abs(a - b) for a, b in zip(zero2, plain)) < 2e-3, list(zip(zero2, plain))


@pytest.mark.slow
def test_no_socket_listens_beyond_loopback_while_two_workers_train(zero2_run):
    """An adversarial probe saw `LISTEN *:<port>` owned by a RayTrainWorker: torch.distributed's
    store, which has no authentication. Every listening socket of the embedded Ray's
    processes, polled while two Ray Train workers train with DeepSpeed, is a loopback one,
    the store's included."""
    _, seen = zero2_run
    assert any("RayTrainWorker" in name for name in seen), f"no training worker was seen listening: {sorted(seen)}"
    exposed = {name: sorted(ips - LOOPBACK) for name, ips in seen.items() if ips - LOOPBACK}
    assert exposed == {}, exposed


def test_a_user_error_inside_the_workers_surfaces_as_one_clear_error(ray_cluster, news_root, tmp_path):
    """A damaged shard whose stamp still matches passes the driver's check; only the worker
    that reads (and hashes) it can tell, and its error reaches the caller as itself: the
    runner's DamagedShards naming the shard, which `bertpipe run` recomputes."""
    from pipelines.stage_dir import DamagedShards

    news_root, _ = news_root
    root = tmp_path / "run"
    for part in ("examples", "vocab"):
        shutil.copytree(news_root / part, root / part)
    shard = root / "examples" / "seq64" / "train" / "part-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    # a disk that corrupts silently: the stamp the manifest records still matches
    manifest = json.loads((root / "examples" / "_manifest.json").read_text())
    for recorded in manifest["shards"]:
        recorded["stamp"] = str((root / "examples" / recorded["path"]).stat().st_mtime_ns)
    (root / "examples" / "_manifest.json").write_text(json.dumps(manifest))
    cfg = tiny_pretrain(resume="never", warmup_steps=1, phases=[{"name": "seq64", "steps": 4, "batch_size": 8}])
    with pytest.raises(DamagedShards, match=r"part-00000\.arrow: its sha256 differs from the manifest's") as caught:
        train(cfg, str(root), STORAGE, SEED)
    assert caught.value.stage == "examples" and caught.value.paths == ["seq64/train/part-00000.arrow"]


KILLED_RUN = textwrap.dedent(
    """
    import sys
    from bertcore.config import RayConfig, StorageConfig
    from pipelines.ray_runtime import ensure_ray
    from pipelines.registry import REGISTRY
    from pipelines.runner import run_stage
    from pipelines.storage import Storage

    # address, root, section JSON, seed[, stage (default pretrain)[, the stages it reads, comma-separated]]
    address, root, stage = sys.argv[1], sys.argv[2], sys.argv[5] if len(sys.argv) > 5 else "pretrain"
    cfg = REGISTRY[stage].section.model_validate_json(sys.argv[3])
    reads = tuple(sys.argv[6].split(",")) if len(sys.argv) > 6 else None
    ensure_ray(RayConfig(address=address))  # joins the test's embedded (loopback-only) Ray
    run_stage(stage, cfg, root=root, storage=Storage(StorageConfig()), seed=int(sys.argv[4]), reads=reads)
    """
)
"""A stage run in a process of its own, to be killed: python -c KILLED_RUN <arguments above>."""


def start_killed_run(ray_module, root, cfg, stage: str = "pretrain", reads: tuple[str, ...] = ()) -> subprocess.Popen:
    """KILLED_RUN started on the test's Ray: `stage` with the section `cfg` under `root`."""
    stage_args = [stage, ",".join(reads)] if reads else [stage]
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_RUN,
            ray_module.get_runtime_context().gcs_address,
            str(root),
            cfg.model_dump_json(),
            str(SEED),
            *stage_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for_idle_workers(ray_module, cpus: float, timeout: float = 60.0) -> None:
    """The killed driver's Ray Train workers are gone once their CPUs are free again."""
    deadline = time.monotonic() + timeout
    while ray_module.available_resources().get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, "the killed run's workers did not go away"
        time.sleep(0.5)


def sigkill_when(process: subprocess.Popen, ready, timeout: float = 240.0) -> None:
    """SIGKILL `process` as soon as `ready()` holds (a checkpoint is complete and a few
    steps past it are logged), failing if it ends first or nothing is ready in time; the
    process is gone when this returns. The run's Ray Train workers (in this session's Ray,
    which the driver joined) are frozen first and killed with it: left running until Ray
    noticed the driver's death, a loaded machine let them finish the run before the kill
    landed."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        workers = training_workers()
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.suspend()
        process.send_signal(signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_steps_on_the_same_data(ray_cluster, news_root, tmp_path):
    news_root, _ = news_root
    cfg = tiny_pretrain(
        phases=[{"name": "seq64", "steps": 30, "batch_size": 16, "max_seq_length": 64}],
        model_overrides={"max_position_embeddings": 128},  # dropout on: the RNG is part of the state
        checkpoint_every=10,
        validation_batches=0,
    )
    reference_root, killed_root = tmp_path / "reference", tmp_path / "killed"
    for target in (reference_root, killed_root):
        for part in ("examples", "vocab"):
            shutil.copytree(news_root / part, target / part)
    train(cfg, str(reference_root), STORAGE, SEED)
    reference = metrics(reference_root)

    process = start_killed_run(ray_cluster, killed_root, cfg)
    first_marker = killed_root / "pretrain" / CHECKPOINTS / checkpoint_tag(10) / COMPLETE
    sigkill_when(process, lambda: first_marker.exists() and len(metrics(killed_root)) >= 14)
    _wait_for_idle_workers(ray_cluster, cpus=2)
    before = metrics(killed_root)
    assert 14 <= len(before) < 30, "the kill did not land in the middle of the run"
    assert not (killed_root / "pretrain" / CHECKPOINTS / checkpoint_tag(30) / COMPLETE).exists()
    resumed_from = max(
        int(name.split("-")[1])
        for name in os.listdir(killed_root / "pretrain" / CHECKPOINTS)
        if (killed_root / "pretrain" / CHECKPOINTS / name / COMPLETE).exists()
    )

    result = train(cfg, str(killed_root), STORAGE, SEED)
    after = metrics(killed_root)
    assert result.stats["steps"] == 30

    def trajectory(records):
        return [(r["step"], r["phase"], r["data_hash"], r["tokens"]) for r in records]

    assert trajectory(after) == trajectory(reference)
    assert [r["loss"] for r in after] == pytest.approx([r["loss"] for r in reference], abs=1e-5)
    # steps up to the checkpoint were not trained again: their records (timings included) are the killed run's
    assert after[:resumed_from] == before[:resumed_from]
    assert result.stats["tokens_seen"] == sum(r["tokens"] for r in reference)
    # the same weights at the end: the resumed reader gave the same batches in the same order
    from safetensors.torch import load_file

    weights = [load_file(str(r / "pretrain" / "model" / "model.safetensors")) for r in (reference_root, killed_root)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-5) for k in weights[0])


# -- a remote run.root (moto S3) ----------------------------------------------------------------


@pytest.fixture
def s3_root(s3_bucket, news_root):
    """(Storage, s3://bucket/run) holding the vocab and examples stage outputs."""
    endpoint, bucket = s3_bucket
    news_root, _ = news_root
    storage = Storage(StorageConfig(endpoint_url=endpoint))
    root = f"s3://{bucket}/run"
    for part in ("examples", "vocab"):
        for path in sorted((news_root / part).rglob("*")):
            if path.is_file():
                storage.write_bytes(join(root, part, str(path.relative_to(news_root / part))), path.read_bytes())
    return storage, root


def test_remote_checkpoints_are_uploaded_and_resume_on_another_machine(world_of_one, s3_root, news_root, tmp_path):
    storage, root = s3_root
    news_root, info = news_root
    cfg = tiny_pretrain(
        phases=[{"name": "seq64", "steps": 12, "batch_size": 8, "max_seq_length": 64}],
        checkpoint_every=5,
        keep_checkpoints=2,
        validation_batches=0,
    )

    def trainer(files, on_step=None) -> Trainer:
        # the shards are read locally here; this test is about the checkpoints' way to the bucket
        return Trainer(
            cfg,
            Pretraining(cfg.build_model_config(len(info["tokens"]))),
            phase_data(news_root, info),
            files,
            seed=SEED,
            resume_key="k",
            on_step=on_step,
        )

    trainer(LocalStageFiles(str(tmp_path / "local"))).run()
    reference = MetricsLog(str(tmp_path / "local" / "metrics.jsonl")).records()

    stage_uri = join(root, "pretrain")
    with pytest.raises(Crash):
        trainer(StorageStageFiles(storage, stage_uri, str(tmp_path / "machine-a")), crash_at(8)).run()
    tags = storage.listdir(join(stage_uri, CHECKPOINTS))
    assert tags == [checkpoint_tag(5)]
    assert {
        "_complete.json",
        "mp_rank_00_model_states.pt",
        "trainer-rank-00000.json",
        "trainer-rank-00000.safetensors",
    } <= set(storage.listdir(join(stage_uri, CHECKPOINTS, tags[0])))
    assert not os.path.exists(tmp_path / "machine-a" / CHECKPOINTS / tags[0])  # the local copy is dropped once uploaded

    marker = trainer(StorageStageFiles(storage, stage_uri, str(tmp_path / "machine-b"))).run()
    assert marker["step"] == 12
    assert storage.listdir(join(stage_uri, CHECKPOINTS)) == [checkpoint_tag(10), checkpoint_tag(12)]
    # TensorBoard's event files of both machines went up with the checkpoints
    assert len([n for n in storage.listdir(join(stage_uri, "tensorboard")) if n.startswith("events.out.tfevents")]) == 2
    remote = [json.loads(line) for line in storage.read_text(join(stage_uri, "metrics.jsonl")).splitlines()]
    assert [(r["step"], r["data_hash"], round(r["loss"], 5)) for r in remote] == [
        (r["step"], r["data_hash"], round(r["loss"], 5)) for r in reference
    ]


def test_stage_on_a_remote_root_writes_checkpoints_and_model_to_the_bucket(ray_cluster, s3_root, tmp_path):
    storage, root = s3_root
    # no max_seq_length: the phase takes the examples phase's (64)
    cfg = tiny_pretrain(phases=[{"name": "seq64", "steps": 6, "batch_size": 8}], checkpoint_every=5)
    result = train(cfg, root, storage, SEED)
    stage_uri = join(root, "pretrain")
    assert result.stats["steps"] == 6 and result.stats["validation"]["sequences"] > 0
    assert [n for n in storage.listdir(join(stage_uri, CHECKPOINTS)) if n.startswith("step-")] == [
        checkpoint_tag(5),
        checkpoint_tag(6),
    ]
    records = [json.loads(line) for line in storage.read_text(join(stage_uri, "metrics.jsonl")).splitlines()]
    assert len(records) == 6 and all(r["padded_tokens"] <= 64 * r["sequences"] for r in records)
    local = tmp_path / "model"
    local.mkdir()
    for name in HF_FILES:
        (local / name).write_bytes(storage.open(join(stage_uri, "model", name)).read())
    model = transformers.BertForPreTraining.from_pretrained(str(local))
    assert model.config.vocab_size == result.stats["model_config"]["vocab_size"]

    # what the run summary and `bertpipe inspect pretrain` show, read from the bucket
    from flows.inspect import Options, inspect

    final = result.stats["final"]
    assert (
        result.headline["steps"] == 6
        and result.headline["final loss"] == f"{final['loss']:.3f} (mean of steps {final['first_step']}-6)"
    )
    data, lines = inspect(storage, root, "pretrain", Options())
    every = result.stats[
        "log_every"
    ]  # a checkpoint shows the mean of its logging interval up to it, as the console did
    assert [(c["step"], c["loss"]) for c in data["checkpoints"]] == [
        (s, metrics_log.at_step(records, s, every)["loss"]) for s in (5, 6)
    ]
    sizes = {
        tag: sum(
            storage.size(join(stage_uri, CHECKPOINTS, tag, n))
            for n in storage.listdir(join(stage_uri, CHECKPOINTS, tag))
        )
        for tag in (checkpoint_tag(5), checkpoint_tag(6))
    }
    assert {c["tag"]: c["bytes"] for c in data["checkpoints"]} == sizes
    assert {f["file"] for f in data["model"]["files"]} == set(HF_FILES)
    assert any(line.strip().startswith(checkpoint_tag(6)) for line in lines)


def test_inputs_are_checked_before_any_worker_starts(small_root, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"pretrain\.phases\[0\]\.name: the examples stage has no phase 'seq128' \(it made \['seq64'\]\)",
    ):
        train(
            tiny_pretrain(phases=[{"name": "seq128", "steps": 10, "batch_size": 8, "max_seq_length": 128}]),
            str(small_root),
            STORAGE,
            SEED,
        )
    with pytest.raises(
        ConfigError, match=r"pretrain\.phases\[0\]\.max_seq_length \(32\) is shorter than the examples of phase seq64"
    ):
        train(
            tiny_pretrain(phases=[{"name": "seq64", "steps": 10, "batch_size": 8, "max_seq_length": 32}]),
            str(small_root),
            STORAGE,
            SEED,
        )
    with pytest.raises(
        ConfigError, match=r"pretrain\.phases\[0\]\.batch_size \(100000\) needs 100000 sequences per worker"
    ):
        train(
            tiny_pretrain(phases=[{"name": "seq64", "steps": 10, "batch_size": 100_000, "max_seq_length": 64}]),
            str(small_root),
            STORAGE,
            SEED,
        )
    with pytest.raises(
        UpstreamMissing, match=r"the examples stage has no output under .*: run `bertpipe run --only examples`"
    ):
        train(tiny_pretrain(), str(tmp_path), STORAGE, SEED)
