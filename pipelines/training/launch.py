"""What the training stages (pretrain, distill) share around bertcore's one training loop
(bertcore/train/trainer.py): the Ray Train launch of the workers with their progress lines,
the checkpoints a run may resume, and the stage's outputs (the final checkpoint's export,
pipelines/training/export.py) and statistics. Their inputs (the examples and the
vocabulary, each phase checked against the examples) are pipelines/training/inputs.py's. A
stage module says only what differs: its objective (`ObjectiveSpec`,
pipelines/training/export.py) and its model. (The checks of a training section's phases
against the examples are bertcore/train/config.py's, which the declarations call.)

Ray shape: a Ray Train TorchTrainer with `<section>.num_workers` workers (gloo on CPU with
DS_ACCELERATOR=cpu, NCCL on GPUs); each runs bertcore.train.trainer.Trainer, which owns the
DeepSpeed engine, the data and the checkpoints. Then one Ray task consolidates the final
checkpoint into `model/`.

Data moves only where it is needed: the driver checks the examples' stamps (the runner),
never their bytes; each worker reads its share of one global order a window of shards at a
time (bertcore/train/loader.py). When run.root is remote (s3://...), the shards come
through one bounded cache folder per machine (bertcore/train/shard_cache.py: one download
per machine, hashed as it arrives, evicted as the window moves, removed when training
ends); a local root is read in place, each shard hashed once per machine. DeepSpeed writes
each checkpoint to a local mirror, and each rank uploads its own files before rank 0
writes the checkpoint's completion marker.

Light at import: torch, Ray and DeepSpeed are imported by the functions that use them.
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bertcore.errors import BertpipeError
from bertcore.train.config import TrainingConfig
from bertcore.train.metrics_log import METRICS, VALIDATION
from bertcore.train.shard_cache import CacheSpec, DamagedShard
from pipelines.stage import Upstream
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.storage import Storage
from pipelines.training.export import ObjectiveSpec, export_model, model_shards
from pipelines.training.inputs import Inputs, cache_folder, damaged_examples

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

# -- workers --------------------------------------------------------------------------------------


@dataclass
class WorkerJob:
    """Everything a training worker needs (pickled to each Ray Train worker)."""

    cfg: Any
    """The training section (a TrainingConfig)."""
    spec: ObjectiveSpec
    seed: int
    resume_key: str
    storage: Storage
    stage_uri: str
    inputs: Inputs
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_stage(cls, r: Any, cfg: Any, spec: ObjectiveSpec, resume_key: str, inputs: Inputs) -> WorkerJob:
        """The job of the training stage run `r` (a StageRun: its seed, storage and folder)."""
        return cls(
            cfg=cfg,
            spec=spec,
            seed=r.seed,
            resume_key=resume_key,
            storage=r.storage,
            stage_uri=r.dir.uri,
            inputs=inputs,
            env=worker_env(cfg),
        )

    def cache(self) -> CacheSpec:
        """The shard cache of the machine this runs on."""
        folder = cache_folder(self.cfg.SECTION, self.stage_uri, self.inputs.examples_fingerprint)
        return CacheSpec(self.storage, folder, self.cfg.data_cache_bytes)

    def phase_data(self) -> list:
        from bertcore.train.phase_data import PhaseData

        vocab = self.inputs.vocab
        masking = self.inputs.examples.masking
        cache = self.cache()
        out = []
        for phase in self.cfg.phases:
            examples_phase = self.inputs.examples.phase(phase.name)
            out.append(
                PhaseData(
                    name=phase.name,
                    shards=self.inputs.train_shards[phase.name],
                    validation_shards=self.inputs.validation_shards[phase.name] if self.cfg.validation_batches else [],
                    masking=masking,
                    mask_config=self.inputs.examples.mask_config(examples_phase, vocab)
                    if masking == "dynamic"
                    else None,
                    pad_id=vocab.special.pad,
                    length_bins=list(self.inputs.examples.length_bins),
                    token_types=vocab.special.layout == "bert",  # RoBERTa has one token type
                    vocab_size=vocab.vocab_size,
                    cache=cache,
                    window_shards=self.cfg.shuffle_window_shards,
                )
            )
        return out


def _quiet_deepspeed_comm() -> None:
    """Set up DeepSpeed's communication backend on the process group Ray Train made, now,
    without its CPU shared-memory op (bertcore/train/op_builds.py: built on first use, never
    used in training) and without the line each rank prints about the ops it loads;
    `deepspeed.initialize` then reuses it. Ray Train turns print() in a worker into a log
    record, so only muting print itself, for this call, reaches it."""
    import builtins

    import torch

    from bertcore.train.op_builds import import_deepspeed, skip_shm_op

    deepspeed = import_deepspeed()

    skip_shm_op()
    saved = builtins.print
    builtins.print = lambda *args, **kwargs: None
    try:
        deepspeed.init_distributed(
            dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False, verbose=False
        )
    finally:
        builtins.print = saved


def _train_worker(config: dict) -> None:
    """Body of one Ray Train worker: torch.distributed is set up by TorchTrainer."""
    import ray.train
    import ray.train.torch
    import torch

    from bertcore.train.phase_data import WorkerContext
    from bertcore.train.trainer import Trainer
    from pipelines.ray_runtime import quiet_known_warnings
    from pipelines.stage_files import stage_files
    from pipelines.training.reporting import StepReporter

    job: WorkerJob = config["job"]
    quiet_known_warnings()
    _quiet_deepspeed_comm()
    context = ray.train.get_context()
    device = str(ray.train.torch.get_device()) if job.cfg.use_gpu else "cpu"
    ctx = WorkerContext(
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        local_rank=context.get_local_rank(),
        device=device,
    )
    if job.cfg.torch_threads:
        torch.set_num_threads(job.cfg.torch_threads)
    who = f"rank-{ctx.rank}"
    queue = config.get("progress")
    reporter = (
        StepReporter(queue, job.cfg.total_steps, job.cfg.SECTION) if (ctx.rank == 0 and queue is not None) else None
    )
    trainer = Trainer(
        job.cfg,
        job.spec.objective(job.storage),
        job.phase_data(),
        stage_files(job.storage, job.stage_uri, who),
        seed=job.seed,
        resume_key=job.resume_key,
        ctx=ctx,
        on_log=reporter,
        device_name=torch.cuda.get_device_name(torch.device(device)) if job.cfg.use_gpu else None,
    )
    trainer.run()


def fit(job: WorkerJob) -> list[dict]:
    """Run the workers to the end of training (or the time budget); a user error raised in
    a worker surfaces as itself. A worker or node lost on the way restarts the workers from
    the latest checkpoint, up to `max_failures` times, with fewer of them when the cluster
    has fewer after `rejoin_timeout_s` (pipelines/training/elastic.py). Returns the restarts, one
    {step, lost, workers} each: the checkpoint's step, what was lost, the workers after."""
    import dataclasses

    from bertcore.train.checkpoint import checkpoint_tag, latest_checkpoint
    from pipelines.stage_files import stage_files
    from pipelines.training.elastic import (
        WorkersLost,
        choose_world_size,
        lost_workers,
        node_ids,
        resized,
        wait_for_dead,
    )

    cfg, world, restarts = job.cfg, job.cfg.num_workers, []
    while True:
        try:
            _fit_once(dataclasses.replace(job, cfg=resized(cfg, world)))
            return restarts
        except Exception as exc:
            what = lost_workers(exc)
            if what is None:
                raise
            log.debug("%s: the workers failed", cfg.SECTION, exc_info=exc)  # the stage's log file has Ray's account
            marker = latest_checkpoint(stage_files(job.storage, job.stage_uri, "driver"))
            start = f"checkpoint {checkpoint_tag(marker['step'])}" if marker else "step 0 (no checkpoint yet)"
            if len(restarts) >= cfg.max_failures:
                raise WorkersLost(
                    f"{cfg.SECTION}: lost {what}; gave up after {cfg.max_failures} restart(s) "
                    f"({cfg.SECTION}.max_failures); "
                    f"{'the latest ' + start + ' is kept' if marker else 'no checkpoint was written yet'}: "
                    f"when the cluster is whole again, `bertpipe run --only {cfg.SECTION}` resumes from it"
                ) from None
            log.warning(
                "%s: lost %s; restarting the workers from %s (restart %d of %d)",
                cfg.SECTION,
                what,
                start,
                len(restarts) + 1,
                cfg.max_failures,
            )
            wait_for_dead(node_ids(exc))
            world = choose_world_size(cfg, what)
            restarts.append({"step": marker["step"] if marker else 0, "lost": what, "workers": world})
            if world != cfg.num_workers:
                log.warning(
                    (
                        "%s: the cluster holds %d of %d workers after %.0f s; going on with %d, gradient "
                        "accumulation %d (the same global batch)"
                    ),
                    cfg.SECTION,
                    world,
                    cfg.num_workers,
                    cfg.rejoin_timeout_s,
                    world,
                    resized(cfg, world).gradient_accumulation_steps,
                )


def _fit_once(job: WorkerJob) -> None:
    """One Ray Train run of the workers at the section's world size."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    from pipelines.ray_runtime import drop_train_leftovers, unwrap
    from pipelines.training.backend import torch_config
    from pipelines.training.reporting import relay_progress

    cfg = job.cfg
    queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
    storage_path = tempfile.mkdtemp(
        prefix="bertpipe-ray-train-"
    )  # Ray Train's run records: nothing of ours; removed after
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": job, "progress": queue},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
        torch_config=torch_config(cfg.use_gpu),  # the store on 127.0.0.1 when Ray runs on this machine only
        run_config=RunConfig(
            name=f"{cfg.SECTION}-{job.resume_key[:8]}-{uuid.uuid4().hex[:6]}",
            storage_path=storage_path,
            failure_config=FailureConfig(
                max_failures=0
            ),  # restarts are fit()'s: another world size needs a new trainer
            worker_runtime_env={"env_vars": job.env} if job.env else None,
        ),
    )
    # fit() stays on this thread, where it handles Ctrl-C, unless `bertpipe run` handles it
    # (flows/commands/running.py: fit() would replace that handler with its own); the
    # progress lines are logged from another thread, in this thread's context (Prefect's
    # flow-run log needs it)
    stop = threading.Event()
    relay = threading.Thread(target=contextvars.copy_context().run, args=(relay_progress, queue, stop), daemon=True)
    relay.start()
    try:
        if getattr(signal.getsignal(signal.SIGINT), "bertpipe_stops_the_run", False):
            _on_another_thread(trainer.fit)
        else:
            _keeping_sigint(trainer.fit)
    except Exception as exc:  # Ray Train wraps worker errors; surface a user error as itself
        failures = getattr(exc, "worker_failures", None) or {}
        for rank in sorted(failures):
            error = unwrap(failures[rank])
            if isinstance(error, DamagedShard):
                raise damaged_examples(error, job.inputs.examples_uri) from None
            if isinstance(error, BertpipeError):
                raise error from None
        if failures and (full := _full_disk(job.stage_uri)):
            # torch's checkpoint writer reports a full disk as "unexpected pos": say what it is
            log.warning("%s: the workers failed on a full disk: %s", cfg.SECTION, " ".join(str(exc).split())[:200])
            raise OSError(
                errno.ENOSPC, f"No space left on device ({shutil.disk_usage(full).free:,} bytes free)", full
            ) from None
        raise
    finally:
        stop.set()
        relay.join(timeout=30)
        queue.shutdown()
        shutil.rmtree(storage_path, ignore_errors=True)
        try:
            drop_train_leftovers()  # the detached AutoscalingCoordinator a fit leaves alive
        except Exception as exc:  # noqa: BLE001 - tidying only: never the error a run ends with
            log.debug("%s: could not drop Ray Train's leftover actors (%s)", cfg.SECTION, exc)


def _keeping_sigint(call) -> None:
    """`call()` with this process's SIGINT handler put back afterwards. On the main thread
    Ray Train's fit() installs a handler that aborts its controller and never removes it:
    Ctrl-C would then go to a finished run's controller, and the handler's reference keeps
    that controller actor (and the DatasetManager it started) alive in this driver until the
    next fit() replaces it."""
    on_main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if on_main else None
    try:
        call()
    finally:
        if on_main and before is not None:
            signal.signal(signal.SIGINT, before)


def _on_another_thread(call) -> None:
    """`call()` on a thread of its own, this one waiting (and free to run signal handlers)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the waiting thread
            failure.append(exc)

    worker = threading.Thread(target=contextvars.copy_context().run, args=(target,), name="bertpipe-fit", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(timeout=0.5)
    if failure:
        raise failure[0]


def _full_disk(stage_uri: str, margin: int = 16 << 20) -> str | None:
    """The local stage folder when its file system has less than `margin` bytes free."""
    if "://" in stage_uri and not stage_uri.startswith("file://"):
        return None
    folder = stage_uri.removeprefix("file://")
    try:
        return folder if shutil.disk_usage(folder).free < margin else None
    except OSError:
        return None


def worker_env(cfg: TrainingConfig) -> dict[str, str]:
    """Environment of the training workers: DeepSpeed's CPU accelerator without GPUs, and
    the trackers' variables as the driver has them (MLFLOW_TRACKING_URI, WANDB_MODE, ...)."""
    from bertcore.train.tracking import TRACKING_ENV

    env = {} if cfg.use_gpu else {"DS_ACCELERATOR": "cpu"}
    return {**env, **{name: os.environ[name] for name in TRACKING_ENV if name in os.environ}}


def prepare_checkpoints(cfg: TrainingConfig, files, resume_key: str, stage: StageDir, *, force: bool = False) -> None:
    """Delete checkpoints that must not be resumed: all of them with resume=never or
    `--force` (which trains from step 0), or those of another trajectory (other
    trajectory-shaping settings, inputs or seed): like any stage whose fingerprint changed,
    this one is then recomputed from the start."""
    from bertcore.train.checkpoint import CHECKPOINTS, checkpoint_tag, clear_checkpoints, latest_checkpoint

    if cfg.resume == "never" or force:
        if force and latest_checkpoint(files) is not None:
            log.info(
                "%s: --force: deleting the checkpoints under %s; training starts at step 0",
                cfg.SECTION,
                stage.path(CHECKPOINTS),
            )
        clear_checkpoints(files)
        return
    marker = latest_checkpoint(files)
    if marker is not None and marker.get("resume_key") != resume_key:
        log.warning(
            "%s: %s holds checkpoints of another config or other inputs (latest %s); starting over",
            cfg.SECTION,
            stage.path(CHECKPOINTS),
            checkpoint_tag(marker["step"]),
        )
        clear_checkpoints(files)


# -- the stage's outputs ---------------------------------------------------------------------------


def train_and_export(
    cfg: TrainingConfig, job: WorkerJob, stage: StageDir, vocab: Upstream
) -> tuple[dict, list[ShardInfo], dict]:
    """Train (resuming per the section's resume setting), export the final checkpoint to
    model/; returns the final marker, the stage's shards (model/, metrics.jsonl,
    validation.jsonl) and its statistics. With resume=auto a finished checkpoint is
    re-exported rather than retrained."""
    from bertcore.train.checkpoint import CHECKPOINTS, latest_checkpoint
    from pipelines.stage_files import stage_files

    files = stage_files(stage.storage, stage.uri, "driver")
    restarts = fit(job)
    marker = latest_checkpoint(files)
    if marker is None or (marker["step"] < cfg.total_steps and marker.get("stopped_by") is None):
        raise RuntimeError(f"{cfg.SECTION}: training ended without a final checkpoint under {stage.path(CHECKPOINTS)}")
    shards = model_shards(export_model(stage, job.spec, vocab, step=marker["step"]))
    metrics_shard, records = log_shard(stage.storage, stage, METRICS)
    shards.append(metrics_shard)
    validations: list[dict] = []
    if stage.storage.exists(stage.path(VALIDATION)):
        validation_shard, validations = log_shard(stage.storage, stage, VALIDATION)
        shards.append(validation_shard)
    from pipelines.training.stats import training_stats

    return marker, shards, training_stats(cfg, marker, records, validations, restarts)


def log_shard(storage: Storage, stage: StageDir, name: str) -> tuple[ShardInfo, list[dict]]:
    """A JSON-lines log of the stage directory as a shard, and its records."""
    with storage.open(stage.path(name), "rb") as handle:
        data = handle.read()
    records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    digest, stamp = hashlib.sha256(data).hexdigest(), storage.stamp(stage.path(name)) or ""
    return ShardInfo(path=name, rows=len(records), bytes=len(data), sha256=digest, stamp=stamp), records
