"""The DeepSpeed training loop of one training worker: the one loop of every training
stage (pretrain, distill).

What a step optimises is an objective component (bertcore.train.objectives.Objective: MLM+NSP
pretraining, or distillation from a teacher); the model it builds is single-device code.
`Trainer` wraps it with DeepSpeed (ZeRO 0-3, fp32/bf16/fp16, AdamW or a client LAMB), feeds
it ExamplesLoader batches phase by phase (BERT: seq128, then seq512), and checkpoints
(bertcore.train.checkpoint) so that a killed run, started again, finishes with the same steps on
the same data.

Ray is not imported here: the caller (pipelines/training/launch.py) starts the workers, sets up
torch.distributed, and hands over a `StageFiles` that knows where the stage directory
lives (a local folder, or a local mirror of an object-store prefix).

Every <section>.eval_every steps it scores the objective on a fixed held-out sample
(validation.jsonl), and rank 0 reports to the trackers (bertcore.train.tracking). It is one
class whose set-up, steps, validation and checkpoints share the engine, the loader and the
counters; what a worker reads (its place, each phase's data and batches) is
bertcore/train/phase_data.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from bertcore.errors import ConfigError
from bertcore.rng import keyed_seed
from bertcore.train.checkpoint import (
    CHECKPOINTS,
    COMPLETE,
    PRE_DECAY,
    StageFiles,
    check_pickles,
    checkpoint_tag,
    latest_checkpoint,
    load_elastic_checkpoint,
    load_rank_state,
    prune,
    restore_rng,
    rng_state,
    save_rank_state,
)
from bertcore.train.config import TrainingConfig
from bertcore.train.loader import ExamplesLoader
from bertcore.train.loss_watch import LossWatch
from bertcore.train.metrics_log import METRICS, TENSORBOARD, TRACKED, VALIDATION, Interval, MetricsLog
from bertcore.train.mfu import peak_flops
from bertcore.train.objectives import Objective, StepSums, init_generator
from bertcore.train.optim import LearningRate, client_optimizer, deepspeed_config, gradient_norm, parameter_groups
from bertcore.train.phase_data import PhaseData, WorkerContext, endless_batches, phase_loader
from bertcore.train.tracking import Trackers, open_trackers

log = logging.getLogger(__name__)


class Trainer:
    """One worker's DeepSpeed engine, data and checkpoints. Every rank constructs it and
    calls `run`; collective calls happen in the same order on every rank."""

    def __init__(
        self,
        cfg: TrainingConfig,
        objective: Objective,
        phases: Sequence[PhaseData],
        files: StageFiles,
        *,
        seed: int,
        resume_key: str,
        ctx: WorkerContext | None = None,
        on_step: Callable[[dict], None] | None = None,
        on_log: Callable[[dict], None] | None = None,
        device_name: str | None = None,
    ):
        """`cfg`: the training section (pretrain, distill); `objective`: what a step
        optimises (bertcore.train.objectives). On rank 0, `on_step` receives each step's metrics
        record, and `on_log`, every log_every steps and at the last, the summary of the
        interval's steps (bertcore.train.metrics_log.summarize), and each validation's record
        (with event: validation): what the caller reports as progress."""
        self.key = cfg.SECTION
        if [p.name for p in phases] != [p.name for p in cfg.phases]:
            raise ValueError(
                f"phase data {[p.name for p in phases]} does not match {self.key}.phases {[p.name for p in cfg.phases]}"
            )
        self.cfg, self.objective, self.phases, self.files = cfg, objective, list(phases), files
        self.seed, self.resume_key = seed, resume_key
        self.ctx = ctx or WorkerContext()
        self.on_step, self.on_log = on_step, on_log
        self.interval = Interval(cfg.log_every, means=("loss", *objective.metrics, "grad_norm", "mfu"))
        self.peak = peak_flops(cfg, device_name)
        self.rank0 = self.ctx.rank == 0
        self.watch = LossWatch(cfg.loss_spike_factor, grace=max(cfg.warmup, 20))
        self.metrics = MetricsLog(files.local_path(METRICS))
        self.validation_log = MetricsLog(files.local_path(VALIDATION))
        self.trackers = Trackers.disabled()
        self.step = 0  # optimizer steps completed
        self.schedule = LearningRate(cfg)
        self.lr = cfg.learning_rate  # the rate of the latest update
        self.tokens_seen = 0
        self.train_time_s = 0.0  # summed over invocations
        self.resizes: list[dict] = []  # world-size changes on resume (a lost node), oldest first
        self.phase_index: int | None = None
        self.loader: ExamplesLoader | None = None
        self.validation_loader: ExamplesLoader | None = None
        """The last validation's: its window stays in the machine's cache for the next validation."""
        self.stream: Iterator[dict[str, torch.Tensor]] | None = None

    # -- set-up ------------------------------------------------------------------------
    def _engine(self):
        if not self.cfg.use_gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from bertcore.train.op_builds import import_deepspeed, ops_to_build, prepare_builds, skip_shm_op

        deepspeed = import_deepspeed()

        skip_shm_op()  # used only for inference; its first build took minutes and could hang later runs
        prepare_builds(
            ops_to_build(self.cfg.use_gpu, self.cfg.optimizer, self.cfg.torch_adam),
            announce=os.environ.get("LOCAL_RANK", "0") == "0",
        )
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        self.device = self.ctx.torch_device()
        torch.manual_seed(keyed_seed(self.seed, self.key, "torch", self.ctx.rank))  # dropout
        model = self.objective.build(init_generator(self.seed, self.key), self.device)
        groups = parameter_groups(model, self.cfg.weight_decay)
        optimizer = client_optimizer(self.cfg, groups)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=groups,
            optimizer=optimizer,
            config=deepspeed_config(self.cfg, self.cfg.micro_batch_size(self.cfg.phases[0])),
            dist_init_required=not torch.distributed.is_initialized(),
        )

    def _collective(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce a small tensor over the workers (on the device NCCL needs)."""
        if self.ctx.world_size == 1:
            return values
        reduce_op = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        on_device = values.to(self.device)
        torch.distributed.all_reduce(on_device, op=reduce_op)
        return on_device.cpu()

    def _barrier(self) -> None:
        if self.ctx.world_size > 1:
            torch.distributed.barrier()

    def _enter_phase(self, index: int, loader_state: dict | None = None) -> None:
        phase = self.cfg.phases[index]
        self.phase_index = index
        for previous in (self.loader, self.validation_loader):
            if previous is not None:
                previous.close()  # the machine's cache may let the previous phase's shards go
        self.validation_loader = None
        self.loader = phase_loader(self.cfg, self.phases[index], phase, self.seed, self.ctx)
        enter = getattr(self.objective, "enter_phase", None)
        if enter is not None:  # e.g. the rotary base of a context-extension phase
            enter(self.engine.module, phase.global_rope_theta)
        if loader_state is not None:
            self.loader.load_state_dict(loader_state)
        else:
            self.watch.reset()
        self.stream = endless_batches(self.loader, phase.name, self.key)

    # -- checkpoints -------------------------------------------------------------------
    def _resume(self) -> dict | None:
        marker = latest_checkpoint(self.files)
        if marker is None:
            return None
        if marker.get("resume_key") != self.resume_key:
            raise ConfigError(
                f"{self.key}: the latest checkpoint ({checkpoint_tag(marker['step'])}) was written with another "
                f"{self.key} config or other inputs; set {self.key}.resume=never to start over (it deletes them)"
            )
        tag = checkpoint_tag(marker["step"])
        self.files.download(f"{CHECKPOINTS}/{tag}")
        folder = self.files.local_path(f"{CHECKPOINTS}/{tag}")
        check_pickles(folder)  # DeepSpeed unpickles its files: nothing but its own classes may be in them
        written_by = int(marker.get("world_size") or self.ctx.world_size)
        if self.cfg.zero_stage in (1, 2):  # elastic layout: any world size, its own included
            load_dir = load_elastic_checkpoint(self.engine, self.files.local_path(CHECKPOINTS), tag)
        else:  # ZeRO-0, whose optimizer state is whole in every checkpoint; ZeRO-3 on its own world size
            load_dir, _ = self.engine.load_checkpoint(self.files.local_path(CHECKPOINTS), tag=tag)
        if load_dir is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag}")
        # on another world size (a lost node) rank r takes the counters, loss watch and RNG
        # of the writer's rank r mod W; the loader state converts (bertcore/train/loader.py)
        state, rng = load_rank_state(folder, self.ctx.rank % written_by)
        self.resizes = list(marker.get("resizes") or [])
        if written_by != self.ctx.world_size:
            resize = {"step": state["step"], "from_workers": written_by, "to_workers": self.ctx.world_size}
            self.resizes.append({**resize, "gradient_accumulation_steps": self.cfg.gradient_accumulation_steps})
            if self.rank0:
                log.warning(
                    "%s: resuming %s, written by %d workers, on %d (gradient accumulation %d: the same global batch)",
                    self.key,
                    tag,
                    written_by,
                    self.ctx.world_size,
                    self.cfg.gradient_accumulation_steps,
                )
        self.step, self.tokens_seen, self.train_time_s = state["step"], state["tokens_seen"], state["train_time_s"]
        self.watch.load_state_dict(state["watch"])
        restore_rng(rng, self.cfg.use_gpu)
        if self.step < self.cfg.total_steps:
            index = self.cfg.phase_at(self.step)
            same_phase = state["phase"] == self.cfg.phases[index].name
            self._enter_phase(index, state["loader"] if same_phase else None)
        self.files.drop_local(f"{CHECKPOINTS}/{tag}")
        log.info("%s: resumed from %s", self.key, tag)
        return marker

    def _save(self, stopped_by: str | None, extra: dict | None = None) -> dict:
        """Write checkpoint step-NNNNNNN: DeepSpeed's files and each rank's trainer state
        locally, upload, and (rank 0, after everyone) the completion marker last."""
        tag = checkpoint_tag(self.step)
        relative = f"{CHECKPOINTS}/{tag}"
        if self.rank0:  # a dead attempt may have left part of this tag
            self.files.remove(f"{relative}/{COMPLETE}")
            self.files.remove(relative)
        self.files.drop_local(relative)  # a mirror copy left by a dead attempt
        self._barrier()
        self.engine.save_checkpoint(self.files.local_path(CHECKPOINTS), tag=tag, save_latest=False)
        state = {
            "step": self.step,
            "phase": None if self.phase_index is None else self.cfg.phases[self.phase_index].name,
            "loader": None if self.loader is None else self.loader.state_dict(),
            "tokens_seen": self.tokens_seen,
            "train_time_s": self.train_time_s,
            "watch": self.watch.state_dict(),
        }
        save_rank_state(self.files.local_path(relative), self.ctx.rank, state, rng_state(self.cfg.use_gpu))
        for name in sorted(os.listdir(self.files.local_path(relative))):
            self.files.upload(f"{relative}/{name}")
        self._barrier()
        marker = {
            "step": self.step,
            "total_steps": self.cfg.total_steps,
            "phase": state["phase"],
            "tokens_seen": self.tokens_seen,
            "train_time_s": round(self.train_time_s, 3),
            "stopped_by": stopped_by,
            "resume_key": self.resume_key,
            "world_size": self.ctx.world_size,
            "resizes": self.resizes,
            "zero_stage": self.cfg.zero_stage,
            "precision": self.cfg.precision,
            **self.objective.describe(),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        if self.rank0:
            self.trackers.flush()
            for name in (METRICS, VALIDATION, TENSORBOARD):
                if os.path.exists(self.files.local_path(name)):
                    self.files.upload(name)
            self.files.write_text(f"{relative}/{COMPLETE}", json.dumps(marker, indent=2) + "\n")
            prune(self.files, self.cfg.keep_checkpoints)
        self.files.drop_local(relative)
        self._barrier()
        return marker

    # -- steps -------------------------------------------------------------------------
    def _train_step(self) -> tuple[dict, str]:
        """One optimizer step: gradient_accumulation_steps good micro-batches on every
        rank. Returns the step's metrics and a hash of the data it consumed."""
        sums = StepSums(self.objective.sums)
        digest = hashlib.blake2b(digest_size=8)
        manual_norm = self.cfg.zero_stage == 0 and self.cfg.precision == "fp32"
        grad_norm = None
        skipped = consecutive = 0
        done = 0
        gas = self.cfg.gradient_accumulation_steps
        self.lr = self.schedule.apply(self.engine.basic_optimizer, self.step, self.tokens_seen)
        waited = 0.0
        while done < gas:
            t0 = time.perf_counter()
            batch = next(self.stream)
            waited += time.perf_counter() - t0
            out = self.objective.forward(self.engine, batch, self.device)
            loss = float(out.loss.detach())
            flags = torch.tensor([0.0 if math.isfinite(loss) else 1.0, 1.0 if self.watch.is_spike(loss) else 0.0])
            nonfinite, spike = (bool(x) for x in self._collective(flags, "max"))
            if nonfinite or spike:
                skipped, consecutive = skipped + 1, consecutive + 1
                where = f"step {self.step + 1} (phase {self.cfg.phases[self.phase_index].name})"
                action = self.cfg.on_nonfinite
                self.watch.refuse(loss, nonfinite, key=self.key, where=where, action=action, run=consecutive)
                continue
            consecutive = 0
            self.engine.backward(out.loss)
            if manual_norm and done == gas - 1:
                grad_norm = gradient_norm(self.engine.module)
            self.engine.step()
            sums.add(out, batch)
            digest.update(batch["input_ids"].numpy().tobytes())
            done += 1
        if grad_norm is None:
            norm = self.engine.get_global_grad_norm()
            grad_norm = None if norm is None else float(norm)
        hashes = torch.zeros(self.ctx.world_size, dtype=torch.int64)
        hashes[self.ctx.rank] = int.from_bytes(digest.digest(), "little", signed=True)
        data_hash = hashlib.blake2b(self._collective(hashes).numpy().tobytes(), digest_size=8).hexdigest()
        totals = self._collective(torch.cat([sums.values, torch.tensor([float(skipped)], dtype=torch.float64)]))
        record = self._step_metrics(sums.totals(totals), int(totals[-1]), grad_norm)
        record["data_wait_s"] = waited  # this rank's (rank 0 logs it): reading and collating its micro-batches
        return record, data_hash

    def _step_metrics(self, t: dict[str, float], skipped: int, grad_norm: float | None) -> dict:
        return {
            "loss": t["loss"] / t["micro"],
            **self.objective.summarise(t, t["micro"]),
            "grad_norm": grad_norm,
            "tokens": int(t["tokens"]),
            "sequences": int(t["sequences"]),
            "padded_tokens": int(t["padded"]),
            "padding_share": 1.0 - t["tokens"] / t["padded"] if t["padded"] else 0.0,
            "flops": t["flops"],
            "skipped_batches": skipped,
        }

    @torch.no_grad()
    def _validate(self) -> dict | None:
        """The objective's loss and metrics on a fixed sample of the current phase's
        validation examples: the first validation_batches batches per worker of one keyed
        shuffle, summed over the ranks. Every rank calls it (ZeRO-3 gathers weights
        collectively)."""
        index = self.phase_index
        data = self.phases[index]
        if self.cfg.validation_batches == 0 or not data.validation_shards:
            return None
        started = time.perf_counter()
        loader = self.validation_loader = phase_loader(
            self.cfg, data, self.cfg.phases[index], self.seed, self.ctx, validation=True
        )
        sums = StepSums(self.objective.sums)
        self.engine.eval()
        for k, batch in enumerate(loader):
            if k >= self.cfg.validation_batches:
                break
            sums.add(self.objective.forward(self.engine, batch, self.device), batch)
        self.engine.train()
        t = sums.totals(self._collective(sums.values))
        if not t["micro"]:
            return None
        return {
            "step": self.step,
            "phase": self.cfg.phases[index].name,
            "sequences": int(t["sequences"]),
            "loss": t["loss"] / t["micro"],
            **self.objective.summarise(t, t["micro"]),
            "time_s": time.perf_counter() - started,
        }

    def _validate_if_due(self, final: bool) -> dict | None:
        """Validate at the end and every eval_every steps; rank 0 logs the result."""
        every = self.cfg.eval_every
        if not (final or (every is not None and self.step % every == 0)):
            return None
        record = self._validate()
        if record is not None and self.rank0:
            self.validation_log.append(record)
            self.trackers.log(self.step, {k: record[k] for k in ("loss", *self.objective.metrics)}, "validation")
            if self.on_log is not None:
                self.on_log({**record, "event": "validation"})
        return record

    def run(self) -> dict:
        """Train to the end of the last phase (or the time budget); returns the marker of
        the final checkpoint (step, tokens seen, stop reason, validation metrics)."""
        started = self._started = time.perf_counter()
        self._engine()
        marker = self._resume()
        if self.rank0:
            for name, log_file in ((METRICS, self.metrics), (VALIDATION, self.validation_log)):
                if self.files.exists(name):
                    self.files.download(name)
                log_file.truncate(self.step)
            self.interval.resumed(self.metrics.records(), self.step)
        total = self.cfg.total_steps
        if marker is not None and (self.step >= total or marker.get("stopped_by") == "token_budget"):
            return marker
        if self.loader is None:
            self._enter_phase(self.cfg.phase_at(self.step))
        if self.rank0:
            described = self.objective.describe()
            params = {self.key: self.cfg.model_dump(mode="json"), "model": described.pop("model_config"), **described}
            self.trackers = open_trackers(
                self.cfg.tracking,
                self.files,
                step=self.step,
                run_name=f"{self.key}-{self.resume_key[:8]}",
                params=params,
            )
        stopped_by = None
        try:
            while self.step < total:
                index = self.cfg.phase_at(self.step)
                if index != self.phase_index:
                    self._enter_phase(index)
                t0 = time.perf_counter()
                record, data_hash = self._train_step()
                self.step += 1
                elapsed = time.perf_counter() - t0
                self.train_time_s += elapsed
                tokens_before, self.tokens_seen = self.tokens_seen, self.tokens_seen + record["tokens"]
                if self.schedule.budget_spent(self.tokens_seen) and self.step < total:
                    stopped_by = "token_budget"
                if jump := self.watch.observe(record["loss"]):
                    record["loss_jump"] = jump
                if self.cfg.time_budget_s is not None:  # the same on every rank: all skip the all-reduce together
                    # any rank over budget stops all of them, so they save the same step
                    over_budget = time.perf_counter() - started >= self.cfg.time_budget_s
                    if (
                        self._collective(torch.tensor([1.0 if over_budget else 0.0]), "max")[0] > 0
                        and self.step < total
                    ):
                        stopped_by = "time_budget"
                final = stopped_by is not None or self.step == total
                if self.rank0:
                    self._log(record, data_hash, elapsed, final)
                validation = self._validate_if_due(final)
                pre_decay = self.schedule.ends_stable(tokens_before, self.tokens_seen)  # its checkpoint is kept
                if final or pre_decay or self.step % self.cfg.checkpoint_every == 0:
                    extra = {"validation": validation, "init": self.objective.init_report} if final else {}
                    marker = self._save(stopped_by, {**extra, **({"name": PRE_DECAY} if pre_decay else {})})
                if stopped_by:
                    if self.rank0 and stopped_by == "time_budget":  # once, not once per rank
                        stop = {
                            "event": "time_budget",
                            "step": self.step,
                            "total_steps": total,
                            "time_budget_s": self.cfg.time_budget_s,
                        }
                        if self.on_log is not None:
                            self.on_log(stop)
                        else:
                            log.info(
                                "%s: stopped at step %d of %d: the time budget of %ss is spent",
                                self.key,
                                self.step,
                                total,
                                self.cfg.time_budget_s,
                            )
                    break
        finally:
            self.trackers.close(failed=sys.exc_info()[0] is not None)
            if self.loader is not None:
                self.loader.close()
        self._remove_cache()
        return marker

    def _remove_cache(self) -> None:
        """After the final checkpoint, the first worker of each machine removes the machine's
        shard cache (a run that fails keeps it for the restart, which reads the same shards)."""
        if self.ctx.local_rank == 0:
            for spec in {data.cache.directory: data.cache for data in self.phases if data.cache}.values():
                spec.open(owner=f"rank-{self.ctx.rank}-end").remove()

    def _log(self, record: dict, data_hash: str, elapsed: float, final: bool) -> None:
        """Rank 0: the step's record to metrics.jsonl; at the end of a logging interval, its
        summary (bertcore.train.metrics_log: means over the interval) to the trackers and `on_log`."""
        world = self.ctx.world_size
        flops = record.pop("flops")
        out = {
            "step": self.step,
            "phase": self.cfg.phases[self.phase_index].name,
            **record,
            "lr": self.lr,  # the rate of this step's update
            "tokens_per_s": record["tokens"] / elapsed,
            "sequences_per_s": record["sequences"] / elapsed,
            "mfu": flops / (elapsed * self.peak * world) if self.peak else None,
            "step_time_s": elapsed,
            "tokens_seen": self.tokens_seen,
            "epoch": self.loader.epoch if self.loader else None,
            "data_hash": data_hash,
        }
        self.metrics.append(out)
        self.interval.add(out)
        if self.interval.ends(self.step, final):
            summary = self.interval.close()
            self.trackers.log(
                self.step, {k: summary.get(k) for k in ("loss", *self.objective.metrics, *TRACKED)}, "train"
            )
            if self.on_log is not None:
                budget = self.cfg.time_budget_s
                left = None if budget is None else max(0.0, budget - (time.perf_counter() - self._started))
                self.on_log({**summary, "budget_left_s": left})
        if self.on_step is not None:
            self.on_step(out)
