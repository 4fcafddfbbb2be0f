"""Pretrain stage: examples + vocab -> DeepSpeed checkpoints, `model/` (Hugging Face
layout) and `metrics.jsonl` under `<run.root>/pretrain/`.

Ray shape: a Ray Train TorchTrainer with `pretrain.num_workers` workers (gloo on CPU with
DS_ACCELERATOR=cpu, NCCL on GPUs); each runs bertcore.trainer.Trainer, which owns the
DeepSpeed engine, the data and the checkpoints. Then one Ray task consolidates the final
checkpoint into `model/`. The driver only checks inputs, decides about resuming, and
writes the manifest.

When run.root is remote (s3://...), workers copy the examples shards they read to a local
temporary folder (the loader memory-maps files), DeepSpeed writes each checkpoint to a
local mirror, and each rank uploads its own files before rank 0 writes the checkpoint's
completion marker. (About 500 lines: the stage's checks, input staging, the Ray Train
launch and the export share the phase plan; the trainer itself is bertcore/trainer.py.)
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import json
import logging
import os
import posixpath
import shutil
import signal
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray

from bertcore import metrics_log
from bertcore.checkpoint import (
    CHECKPOINTS,
    checkpoint_tag,
    clear_checkpoints,
    complete_checkpoints,
    latest_checkpoint,
)
from bertcore.errors import BertpipeError, ConfigError
from bertcore.examples_config import ExamplesConfig
from bertcore.export import MODEL_DIR, consolidate_checkpoint, export_checkpoint
from bertcore.figures import percent
from bertcore.hf_files import MLM_SUFFIX
from bertcore.masking import VocabTables
from bertcore.metrics_log import METRICS, VALIDATION
from bertcore.model import ModelConfig
from bertcore.pretrain_config import PretrainConfig
from bertcore.pretrained import CONFIG_FILE, model_config, read_weights
from bertcore.tokenizer import TOKENIZER_FILES, VOCAB_FILE, read_vocab
from bertcore.tracking import TRACKING_ENV
from bertcore.trainer import PhaseData, Trainer, WorkerContext
from pipelines.external import ExternalFolder
from pipelines.pretrain_progress import StepReporter, relay_progress
from pipelines.ray_runtime import quiet_known_warnings, unwrap
from pipelines.shards import local_copy, local_folder
from pipelines.stage import (
    Output,
    ShardInfo,
    StageDir,
    StageRun,
    Upstream,
    UpstreamMissing,
)
from pipelines.stage_files import stage_files
from pipelines.stages.pretrain import check_positions
from pipelines.storage import Storage, join

log = logging.getLogger(__name__)


# -- continued pretraining --------------------------------------------------------------------


def _init_model_config(cfg: PretrainConfig, init: ExternalFolder, inputs: Inputs, storage: Storage) -> ModelConfig:
    """The model of a continued run: init_from's shape, checked against the vocabulary and
    the phases' sequence lengths."""
    base = model_config(os.path.dirname(local_copy(storage, join(init.uri, CONFIG_FILE), init.cache_key)))
    if base.vocab_size != inputs.vocab.vocab_size:
        raise ConfigError(
            f"pretrain.init_from: the model at {init.uri} has {base.vocab_size} word embeddings but the vocab stage's vocabulary "
            f"has {inputs.vocab.vocab_size} entries; adopt the model's vocabulary (vocab.source: pretrained, vocab.pretrained unset)"
        )
    try:
        check_positions(cfg, [p.max_seq_length for p in cfg.phases], base.max_position_embeddings, "shorten the phase")
    except ValueError as exc:
        raise ConfigError(f"{exc} (pretrain.init_from: {init.uri})") from None
    return cfg.build_model_config(inputs.vocab.vocab_size, inputs.vocab.special.pad, base=base)


@dataclass
class Inputs:
    """What the examples and vocab stages produced, as the pretrain stage needs it."""

    examples_fingerprint: str
    vocab_fingerprint: str
    examples: ExamplesConfig
    vocab: VocabTables
    train_shards: dict[str, list[str]]
    """Phase name -> URIs of examples/<phase>/train/ shards."""
    validation_shards: dict[str, list[str]]


def read_inputs(cfg: PretrainConfig, examples: Upstream, vocab: Upstream, storage: Storage) -> tuple[PretrainConfig, Inputs]:
    """The section with each phase's max_seq_length resolved from the examples phase, and
    the inputs; a phase with fewer sequences than one micro-batch is a ConfigError."""
    examples_cfg = ExamplesConfig.model_validate(examples.manifest.config)
    phases = []
    train, validation = {}, {}
    for i, phase in enumerate(cfg.phases):
        phases.append(phase.model_copy(update={"max_seq_length": phase.max_seq_length or examples_cfg.phase(phase.name).max_seq_length}))
        train_shards = examples.manifest.shards_under(f"{phase.name}/train/")
        train[phase.name] = [examples.path(s.path) for s in train_shards]
        validation[phase.name] = [examples.path(s.path) for s in examples.manifest.shards_under(f"{phase.name}/validation/")]
        if not train_shards:
            raise UpstreamMissing(f"{examples.path(phase.name + '/train')}: the examples manifest lists no shards; rerun the examples stage")
        rows = sum(s.rows for s in train_shards)
        if rows < cfg.micro_batch_size(phase):
            raise ConfigError(
                f"pretrain.phases[{i}].batch_size ({phase.batch_size}) needs {cfg.micro_batch_size(phase)} sequences per worker "
                f"and micro-batch, but phase {phase.name} has {rows} training sequences; lower it or make more examples"
            )
    tokens = read_vocab(local_copy(storage, vocab.path(VOCAB_FILE), f"pretrain-{vocab.fingerprint}"))
    inputs = Inputs(examples.fingerprint, vocab.fingerprint, examples_cfg, VocabTables.from_tokens(tokens), train, validation)
    return cfg.model_copy(update={"phases": phases}), inputs


# -- workers --------------------------------------------------------------------------------


@dataclass
class WorkerJob:
    """Everything a training worker needs (pickled to each Ray Train worker)."""

    cfg: PretrainConfig
    model_config: dict
    seed: int
    resume_key: str
    storage: Storage
    stage_uri: str
    inputs: Inputs
    env: dict[str, str] = field(default_factory=dict)
    init: ExternalFolder | None = None

    def phase_data(self) -> list[PhaseData]:
        vocab = self.inputs.vocab
        masking = self.inputs.examples.masking
        cache_key = f"pretrain-{self.inputs.examples_fingerprint}"  # new examples, new copies
        out = []
        for phase in self.cfg.phases:
            examples_phase = self.inputs.examples.phase(phase.name)
            out.append(
                PhaseData(
                    name=phase.name,
                    paths=[local_copy(self.storage, uri, cache_key) for uri in self.inputs.train_shards[phase.name]],
                    validation_paths=[local_copy(self.storage, uri, cache_key) for uri in self.inputs.validation_shards[phase.name]]
                    if self.cfg.validation_batches
                    else [],
                    masking=masking,
                    mask_config=self.inputs.examples.mask_config(examples_phase, vocab) if masking == "dynamic" else None,
                    pad_id=vocab.special.pad,
                    length_bins=list(self.inputs.examples.length_bins),
                )
            )
        return out


def _quiet_deepspeed_comm() -> None:
    """Set up DeepSpeed's communication backend on the process group Ray Train made, now,
    without its CPU shared-memory op (bertcore/op_builds.py: built on first use, never
    used in training) and without the line each rank prints about the ops it loads;
    `deepspeed.initialize` then reuses it. Ray Train turns print() in a worker into a log
    record, so only muting print itself, for this call, reaches it."""
    import builtins

    import deepspeed
    import torch

    from bertcore.op_builds import skip_shm_op

    skip_shm_op()
    saved = builtins.print
    builtins.print = lambda *args, **kwargs: None
    try:
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend(), auto_mpi_discovery=False, verbose=False)
    finally:
        builtins.print = saved


def _train_worker(config: dict) -> None:
    """Body of one Ray Train worker: torch.distributed is set up by TorchTrainer."""
    job: WorkerJob = config["job"]
    import ray.train.torch
    import torch

    quiet_known_warnings()
    _quiet_deepspeed_comm()
    context = ray.train.get_context()
    device = str(ray.train.torch.get_device()) if job.cfg.use_gpu else "cpu"
    ctx = WorkerContext(rank=context.get_world_rank(), world_size=context.get_world_size(), device=device)
    if job.cfg.torch_threads:
        torch.set_num_threads(job.cfg.torch_threads)
    who = f"rank-{ctx.rank}"
    queue = config.get("progress")
    trainer = Trainer(
        job.cfg,
        ModelConfig.model_validate(job.model_config),
        job.phase_data(),
        stage_files(job.storage, job.stage_uri, who),
        seed=job.seed,
        resume_key=job.resume_key,
        ctx=ctx,
        on_log=StepReporter(queue, job.cfg.total_steps) if (ctx.rank == 0 and queue is not None) else None,
        device_name=torch.cuda.get_device_name(torch.device(device)) if job.cfg.use_gpu else None,
        init_state_dict=read_weights(job.init.local(job.storage)) if job.init is not None else None,
    )
    trainer.run()


def _fit(job: WorkerJob) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue

    from pipelines.train_backend import torch_config

    cfg = job.cfg
    queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": job, "progress": queue},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
        torch_config=torch_config(cfg.use_gpu),  # the store on 127.0.0.1 when Ray runs on this machine only
        run_config=RunConfig(
            name=f"pretrain-{job.resume_key[:8]}-{uuid.uuid4().hex[:6]}",
            storage_path=os.path.join(tempfile.gettempdir(), "bertpipe-ray-train"),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            worker_runtime_env={"env_vars": job.env} if job.env else None,
        ),
    )
    # fit() stays on this thread, where it handles Ctrl-C, unless `bertpipe run` handles it
    # (flows/cli.py: fit() would replace that handler with its own); the progress lines are
    # logged from another thread, in this thread's context (Prefect's flow-run log needs it)
    stop = threading.Event()
    relay = threading.Thread(target=contextvars.copy_context().run, args=(relay_progress, queue, stop), daemon=True)
    relay.start()
    try:
        if getattr(signal.getsignal(signal.SIGINT), "bertpipe_stops_the_run", False):
            _on_another_thread(trainer.fit)
        else:
            trainer.fit()
    except Exception as exc:  # Ray Train wraps worker errors; surface a user error as itself
        failures = getattr(exc, "worker_failures", None) or {}
        for rank in sorted(failures):
            error = unwrap(failures[rank])
            if isinstance(error, BertpipeError):
                raise error from None
        if failures and (full := _full_disk(job.stage_uri)):
            # torch's checkpoint writer reports a full disk as "unexpected pos": say what it is
            log.warning("pretrain: the workers failed on a full disk: %s", " ".join(str(exc).split())[:200])
            raise OSError(errno.ENOSPC, f"No space left on device ({shutil.disk_usage(full).free:,} bytes free)", full) from None
        raise
    finally:
        stop.set()
        relay.join(timeout=30)
        queue.shutdown()


def _on_another_thread(call) -> None:
    """`call()` on a thread of its own, this one waiting (and free to run signal handlers)."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # handed back to the waiting thread
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


# -- export ---------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=1)
def _export_task(stage: StageDir, vocab_uri: str, vocab_key: str, tag: str, model_config: dict, out_uri: str, nsp: bool) -> list[dict]:
    """Consolidate checkpoint `tag` and publish the Hugging Face folder at `out_uri` (a
    BertForMaskedLM when not `nsp`; with NSP a BertForPreTraining, and its BertForMaskedLM
    twin at `out_uri`-mlm, which AutoModelForMaskedLM loads without unexpected keys);
    returns [{uri, folder, name, bytes, sha256, stamp}] of the files written."""
    storage = stage.storage
    with tempfile.TemporaryDirectory(prefix="bertpipe-export-") as tmp:
        files = stage_files(storage, stage.uri, f"export-{uuid.uuid4().hex[:8]}")
        files.download(f"{CHECKPOINTS}/{tag}")
        model_cfg = ModelConfig.model_validate(model_config)
        state = consolidate_checkpoint(files.local_path(f"{CHECKPOINTS}/{tag}"), model_cfg)
        files.drop_local(f"{CHECKPOINTS}/{tag}")
        vocab_dir = local_folder(storage, vocab_uri, TOKENIZER_FILES, vocab_key)
        folders = [(out_uri.rstrip("/"), nsp)] + ([(out_uri.rstrip("/") + MLM_SUFFIX, False)] if nsp else [])
        written = []
        for uri, with_nsp in folders:
            out_local = os.path.join(tmp, posixpath.basename(uri))
            for name in export_checkpoint(state, model_cfg, vocab_dir, out_local, nsp=with_nsp):
                local = os.path.join(out_local, name)
                info = storage.write_file(join(uri, name), lambda path, local=local: shutil.copyfile(local, path))
                written.append({"uri": join(uri, name), "folder": posixpath.basename(uri), "name": name, "bytes": info.bytes, "sha256": info.sha256, "stamp": info.stamp})
        return written


def export_model(stage: StageDir, inputs: dict[str, Upstream], *, step: int | None = None, out: str | None = None) -> list[dict]:
    """Write the Hugging Face folder of checkpoint `step` (default: the latest complete
    one) to `out` (default: <root>/pretrain/model/), and with NSP its BertForMaskedLM twin
    beside it (`out`-mlm); returns the files written. `inputs`: the examples and vocab
    outputs it was trained on (an objective without NSP exports a BertForMaskedLM only).
    Needs Ray (ensure_ray) for the one task that does the work."""
    files = stage_files(stage.storage, stage.uri, "driver")
    markers = complete_checkpoints(files)
    if step is not None:
        markers = [m for m in markers if m["step"] == step]
    if not markers:
        what = f"checkpoint {checkpoint_tag(step)}" if step is not None else "checkpoint"
        raise ConfigError(f"{stage.path(CHECKPOINTS)}: no complete {what}; run the pretrain stage first")
    marker = markers[-1]
    vocab = inputs["vocab"]
    nsp = ExamplesConfig.model_validate(inputs["examples"].manifest.config).has_nsp
    ref = _export_task.remote(
        stage, vocab.dir.uri, f"pretrain-{vocab.fingerprint}", checkpoint_tag(marker["step"]), marker["model_config"], out or stage.path(MODEL_DIR), nsp
    )
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        error = unwrap(exc)
        if isinstance(error, BertpipeError):
            raise error from None
        raise


# -- the stage ------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Train (resuming per pretrain.resume), export the final checkpoint to model/, and
    list model/ and metrics.jsonl as the stage's shards. With pretrain.resume=auto a
    finished checkpoint is re-exported rather than retrained (resume=never retrains).
    Ray must be running (pipelines.ray_runtime.ensure_ray)."""
    cfg, inputs = read_inputs(r.section, r.inputs["examples"], r.inputs["vocab"], r.storage)
    init: ExternalFolder | None = r.external
    files = stage_files(r.storage, r.dir.uri, "driver")
    trajectory = {"examples": inputs.examples_fingerprint, "vocab": inputs.vocab_fingerprint, "seed": r.seed}
    resume_key = cfg.resume_key({**trajectory, **({"init": init.identity} if init else {})})
    if init is not None:
        model_cfg = _init_model_config(cfg, init, inputs, r.storage)
    else:
        model_cfg = cfg.build_model_config(inputs.vocab.vocab_size, inputs.vocab.special.pad)
    _prepare_checkpoints(cfg, files, resume_key, r.dir)
    job = WorkerJob(
        cfg=cfg,
        model_config=model_cfg.model_dump(mode="json"),
        seed=r.seed,
        resume_key=resume_key,
        storage=r.storage,
        stage_uri=r.dir.uri,
        inputs=inputs,
        env=_worker_env(cfg),
        init=init,
    )
    log.info("%s", _start_line(cfg, model_cfg, init, latest_checkpoint(files)))
    _fit(job)
    marker = latest_checkpoint(files)
    if marker is None or (marker["step"] < cfg.total_steps and marker.get("stopped_by") is None):
        raise RuntimeError(f"pretrain: training ended without a final checkpoint under {r.dir.path(CHECKPOINTS)}")
    exported = export_model(r.dir, r.inputs, step=marker["step"])
    shards = [ShardInfo(f"{f['folder']}/{f['name']}", rows=1, bytes=f["bytes"], sha256=f["sha256"], stamp=f["stamp"]) for f in exported]
    metrics_shard, records = _log_shard(r.storage, r.dir, METRICS)
    shards.append(metrics_shard)
    validations: list[dict] = []
    if r.storage.exists(r.dir.path(VALIDATION)):
        validation_shard, validations = _log_shard(r.storage, r.dir, VALIDATION)
        shards.append(validation_shard)
    stats = _stats(cfg, marker, records, validations)
    if init is not None:
        stats["init_from"] = {"uri": init.uri, **(marker.get("init") or {})}
    return Output(shards=shards, stats=stats, headline=_headline(stats))


def _start_line(cfg: PretrainConfig, model_cfg: ModelConfig, init: ExternalFolder | None, start: dict | None) -> str:
    """pretrain: tiny model (2 layers, hidden 128) from scratch on 2 CPU workers, ZeRO-2 fp32 adamw; seq128 600 steps x 32
    With init_from, the model is the folder's (its config.json gives the shape) and the run continues it."""
    shape = f"{model_cfg.num_hidden_layers} layers, hidden {model_cfg.hidden_size}"
    model = f"the model in {init.uri} ({shape}, from its config.json)" if init else f"{cfg.model_size} model ({shape})"
    if start:
        origin = f"resuming from step {start['step']}"
    else:
        origin = "continued" if init else "from scratch"
    hardware = f"{cfg.num_workers} {'GPU' if cfg.use_gpu else 'CPU'} workers, ZeRO-{cfg.zero_stage} {cfg.precision} {cfg.optimizer}"
    phases = ", ".join(f"{p.name} {p.steps} steps x {p.batch_size}" for p in cfg.phases)
    return f"pretrain: {model} {origin} on {hardware}; {phases}"


def _log_shard(storage: Storage, stage: StageDir, name: str) -> tuple[ShardInfo, list[dict]]:
    """A JSON-lines log of the stage directory as a shard, and its records."""
    with storage.open(stage.path(name), "rb") as handle:
        data = handle.read()
    records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    digest, stamp = hashlib.sha256(data).hexdigest(), storage.stamp(stage.path(name)) or ""
    return ShardInfo(path=name, rows=len(records), bytes=len(data), sha256=digest, stamp=stamp), records


def _worker_env(cfg: PretrainConfig) -> dict[str, str]:
    """Environment of the training workers: DeepSpeed's CPU accelerator without GPUs, and
    the trackers' variables as the driver has them (MLFLOW_TRACKING_URI, WANDB_MODE, ...)."""
    env = {} if cfg.use_gpu else {"DS_ACCELERATOR": "cpu"}
    return {**env, **{name: os.environ[name] for name in TRACKING_ENV if name in os.environ}}


def _prepare_checkpoints(cfg: PretrainConfig, files, resume_key: str, stage: StageDir) -> None:
    """Delete checkpoints that must not be resumed: all of them with resume=never, or those
    of another trajectory (other trajectory-shaping settings, examples, vocabulary or seed):
    like any stage whose fingerprint changed, this one is then recomputed from the start."""
    if cfg.resume == "never":
        clear_checkpoints(files)
        return
    marker = latest_checkpoint(files)
    if marker is not None and marker.get("resume_key") != resume_key:
        log.warning(
            "pretrain: %s holds checkpoints of another config or other inputs (latest %s); starting over",
            stage.path(CHECKPOINTS),
            checkpoint_tag(marker["step"]),
        )
        clear_checkpoints(files)


CURVE_POINTS = 50
"""Validation records kept in the manifest statistics at most (validation.jsonl has all)."""


def _thin(records: list[dict], points: int) -> list[dict]:
    """At most `points` records, evenly spaced, the first and the last included."""
    if len(records) <= points:
        return records
    picks = sorted({round(i * (len(records) - 1) / (points - 1)) for i in range(points)})
    return [records[i] for i in picks]


def _stats(cfg: PretrainConfig, marker: dict, records: list[dict], validations: list[dict]) -> dict[str, Any]:
    """The manifest statistics. `final` holds the final training figures: the means over the
    last logging interval (bertcore.metrics_log), with the steps they cover; `validation`
    the last validation, on the held-out sample."""
    mfus = [r["mfu"] for r in records if r.get("mfu") is not None]
    final = metrics_log.final(records, cfg.log_every)
    return {
        "steps": marker["step"],
        "total_steps": marker["total_steps"],
        "stopped_by": marker.get("stopped_by"),
        "phase": marker.get("phase"),
        "tokens_seen": marker["tokens_seen"],
        "train_time_s": marker["train_time_s"],
        "tokens_per_s": marker["tokens_seen"] / marker["train_time_s"] if marker["train_time_s"] else None,
        "mfu": sum(mfus) / len(mfus) if mfus else None,
        "log_every": cfg.log_every,
        "final": {k: final.get(k) for k in ("first_step", "step", *metrics_log.VALIDATION_FIGURES)} if final else None,
        "loss_jumps": [{"step": r["step"], "loss": r["loss"], **r["loss_jump"]} for r in records if r.get("loss_jump")],
        "skipped_batches": sum(r.get("skipped_batches", 0) for r in records),
        "validation": marker.get("validation"),
        "validation_curve": _thin(validations, CURVE_POINTS),
        "checkpoint": checkpoint_tag(marker["step"]),
        "world_size": marker["world_size"],
        "zero_stage": marker["zero_stage"],
        "precision": marker["precision"],
        "model_config": marker["model_config"],
    }


def _headline(stats: dict) -> dict[str, Any]:
    """final loss 7.464 (mean of steps 551-600) · validation MLM accuracy 8.8% (639 sequences) · tokens/s 12.3k · steps 600"""
    headline: dict[str, Any] = {}
    final = stats.get("final") or {}
    if final.get("loss") is not None:
        headline["final loss"] = f"{final['loss']:.3f} ({metrics_log.steps_text(final)})"
    validation = stats.get("validation") or {}
    if validation.get("mlm_accuracy") is not None:  # the sample validated during training (evaluate scores all of it)
        headline["validation MLM accuracy"] = f"{percent(validation['mlm_accuracy'])} ({validation.get('sequences', 0):,} sequences)"
    if stats["tokens_per_s"]:
        headline["tokens/s"] = round(stats["tokens_per_s"])
    headline["steps"] = stats["steps"]
    return headline
