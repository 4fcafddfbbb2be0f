"""Pretraining: the `pretrain:` config section and the DeepSpeed training loop of one worker.

The model (bertcore.model) is single-device code; this module wraps it with DeepSpeed
(ZeRO 0-3, fp32/bf16/fp16, AdamW or a client LAMB), feeds it ExamplesLoader batches phase
by phase (BERT: seq128, then seq512), and checkpoints so that a killed run, started
again, finishes with the same steps on the same data:

    checkpoints/step-0000100/
        mp_rank_00_model_states.pt, *zero_pp_rank_R_*.pt   DeepSpeed (model, optimizer, schedule)
        trainer-rank-0000R.pt      per rank: loader position, torch RNG, counters
        _complete.json             written last by rank 0: the checkpoint is usable

Ray is not imported here: the caller (pipelines/pretrain.py) starts the workers, sets up
torch.distributed, and hands over a `StageFiles` that knows where the stage directory
lives (a local folder, or a local mirror of an object-store prefix).

Learning rate: one schedule over the steps of all phases, linear warmup to
`learning_rate` then linear decay to zero at the last step (`lr_multiplier`).

MFU (model FLOPs utilisation), as logged per step and reported in the manifest:

    MFU = F_step / (t_step * P * W)
    F_step = sum over the step's micro-batches (all ranks) of
             encoder_flops_per_token(model, T_b, m_b) * n_b

n_b is the batch's non-pad token count (padding is waste, not work), T_b its padded
length (what the attention kernels run on), m_b the share of its tokens that are MLM
targets; encoder_flops_per_token (bertcore/model.py) is 6 * weights + 12 * L * H * T plus
the gathered MLM head. t_step is rank 0's wall time for the step, W the number of workers,
P the declared peak FLOP/s of one device: `pretrain.peak_flops_per_device`, or when unset
the dense tensor-core peak of a known GPU (PEAK_FLOPS: A100 312e12, H100/H200 989e12 for
bf16/fp16; 19.5e12 / 67e12 for fp32, which PyTorch runs without TF32 by default). A CPU
has no default, so MFU is null there unless the key is set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from pydantic import Field, field_validator, model_validator

from bertcore.data import ExamplesLoader
from bertcore.errors import BertpipeError, ConfigError
from bertcore.masking import MaskConfig
from bertcore.model import BertForPreTraining, ModelConfig, SizeName, encoder_flops_per_token
from bertcore.rng import keyed_seed
from bertcore.section import Section

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
COMPLETE = "_complete.json"
_TAG = re.compile(r"step-(\d{7,})")
MAX_CONSECUTIVE_SKIPS = 20
"""With on_nonfinite: skip, this many skipped micro-batches in a row stop the run anyway."""

PEAK_FLOPS: dict[tuple[str, str], float] = {
    # (device name fragment, precision) -> dense peak FLOP/s of one device (NVIDIA datasheets)
    ("A100", "bf16"): 312e12,
    ("A100", "fp16"): 312e12,
    ("A100", "fp32"): 19.5e12,
    ("H100", "bf16"): 989e12,
    ("H100", "fp16"): 989e12,
    ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12,
    ("H200", "fp16"): 989e12,
    ("H200", "fp32"): 67e12,
}


class TrainingDiverged(BertpipeError):
    """The loss became NaN/inf or spiked, and pretrain.on_nonfinite says stop."""


# -- configuration -------------------------------------------------------------------------


class PretrainPhase(Section):
    """One sequence-length phase of pretraining; reads examples/<name>/train/."""

    name: str
    """Phase name; must be one of the examples stage's phases (examples.phases[*].name), e.g. seq128."""
    steps: int = Field(ge=1)
    """Optimizer steps spent in this phase."""
    batch_size: int = Field(ge=1)
    """Global batch: sequences per optimizer step over all workers and accumulation steps."""
    max_seq_length: int = Field(ge=3)
    """Longest sequence of the phase; at least the examples phase's max_seq_length, at most the model's max_position_embeddings."""


def _default_phases() -> list[PretrainPhase]:
    # Devlin et al. 2019: 1M steps of 256 sequences, 90% of them at 128 tokens.
    return [
        PretrainPhase(name="seq128", steps=900_000, batch_size=256, max_seq_length=128),
        PretrainPhase(name="seq512", steps=100_000, batch_size=256, max_seq_length=512),
    ]


# Fields that change neither the trajectory nor the data order: a checkpoint written with
# other values of these resumes (the rest must match, see `resume_key`).
_RESUME_NEUTRAL = {
    "time_budget_s",
    "checkpoint_every",
    "keep_checkpoints",
    "resume",
    "log_every",
    "torch_threads",
    "peak_flops_per_device",
    "loader_processes",
    "max_failures",
    "validation_batches",
}


class PretrainConfig(Section):
    """Pretraining with DeepSpeed on Ray Train workers (`pretrain:` in a run recipe)."""

    model_size: SizeName = "base"
    """Published BERT shape: tiny (2x128), mini (4x256), small (4x512), medium (8x512), base (12x768), large (24x1024)."""
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    """Any bertcore.model.ModelConfig field to change from the named size, e.g. {hidden_dropout_prob: 0.0}; vocab_size comes from the vocab stage."""
    num_workers: int = Field(2, ge=1)
    """Data-parallel workers (Ray Train), one per GPU or one CPU process each."""
    use_gpu: bool = False
    """One GPU per worker with NCCL; false runs on CPU with gloo (DS_ACCELERATOR=cpu)."""
    zero_stage: int = Field(0, ge=0, le=3)
    """DeepSpeed ZeRO stage: 0 plain data parallel, 1 optimizer states, 2 + gradients, 3 + parameters partitioned."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Training precision: fp32, bf16 (fp32 master weights), fp16 (GPU only, dynamic loss scaling)."""
    optimizer: Literal["adamw", "lamb"] = "adamw"
    """adamw (DeepSpeed's; see torch_adam) or lamb (You et al. 2020; a client optimizer, needs zero_stage 0)."""
    torch_adam: bool = True
    """adamw only: use torch.optim.AdamW; false uses DeepSpeed's compiled Adam (gcc compiles it the first time, minutes)."""
    learning_rate: float = Field(1e-4, gt=0.0)
    """Peak learning rate, reached at the end of warmup."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam/LAMB moment decay rates (beta1, beta2)."""
    eps: float = Field(1e-6, gt=0.0)
    """Adam/LAMB epsilon (BERT: 1e-6)."""
    weight_decay: float = Field(0.01, ge=0.0)
    """Decoupled weight decay; biases and LayerNorm parameters are exempt, as in BERT."""
    warmup_steps: int | None = Field(None, ge=0)
    """Linear warmup length in optimizer steps; give this or warmup_fraction (default: 1% of all steps, as BERT's 10k of 1M)."""
    warmup_fraction: float | None = Field(None, ge=0.0, lt=1.0)
    """Linear warmup as a share of all steps (all phases); give this or warmup_steps."""
    phases: list[PretrainPhase] = Field(default_factory=_default_phases, min_length=1)
    """Phases in order, each with its own steps and global batch (default: BERT's 900k x 256 at seq128, 100k x 256 at seq512)."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Micro-batches accumulated per optimizer step on each worker."""
    max_grad_norm: float = Field(1.0, gt=0.0)
    """Gradients are clipped to this global L2 norm before each update."""
    checkpoint_every: int = Field(1000, ge=1)
    """Write a checkpoint every this many optimizer steps (and always at the end)."""
    keep_checkpoints: int = Field(3, ge=1)
    """Complete checkpoints kept; older ones are deleted after a newer one is complete."""
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the latest complete checkpoint; never: delete the checkpoints and start over."""
    time_budget_s: float | None = Field(None, gt=0.0)
    """Wall-clock budget of one invocation: when spent, training stops after the current step, checkpoints and exports."""
    log_every: int = Field(10, ge=1)
    """Steps between console progress updates (metrics.jsonl gets every step)."""
    peak_flops_per_device: float | None = Field(None, gt=0.0)
    """Peak FLOP/s of one device for the MFU estimate; default: a table of known GPUs (none for CPUs, then MFU is null)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """When a micro-batch loss is NaN/inf or a spike: stop with an error naming the step, or skip the batch."""
    loss_spike_factor: float | None = Field(4.0, gt=1.0)
    """After warmup, a micro-batch loss above this multiple of the running mean loss is a spike (handled per on_nonfinite); null: no spike check."""
    torch_threads: int | None = Field(None, ge=1)
    """torch intra-op threads per worker (default: what Ray gives the worker)."""
    loader_processes: int = Field(0, ge=0)
    """DataLoader processes per worker that read and collate batches (0: in the training process)."""
    validation_batches: int = Field(20, ge=0)
    """Batches of the last phase's validation examples evaluated at the end (per worker); 0 skips."""
    max_failures: int = Field(0, ge=0)
    """Times Ray Train restarts the workers after a failure; each restart resumes from the latest checkpoint."""

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"each beta must be in [0, 1), got {list(betas)}")
        return betas

    @field_validator("phases")
    @classmethod
    def _unique_phase_names(cls, phases: list[PretrainPhase]) -> list[PretrainPhase]:
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        return phases

    @model_validator(mode="after")
    def _consistent(self) -> PretrainConfig:
        if self.precision == "fp16" and not self.use_gpu:
            raise ValueError(
                "pretrain.precision=fp16 needs a GPU (pretrain.use_gpu=true); DeepSpeed has no fp16 on CPU: use bf16 or fp32"
            )
        if self.optimizer == "lamb" and self.zero_stage != 0:
            raise ValueError(
                f"pretrain.optimizer=lamb needs pretrain.zero_stage=0 (got {self.zero_stage}): ZeRO flattens the "
                "parameters, so LAMB's per-layer trust ratios would be computed over partitions"
            )
        if self.warmup_steps is not None and self.warmup_fraction is not None:
            raise ValueError("pretrain.warmup_steps and pretrain.warmup_fraction are both set; keep one")
        if self.warmup_steps is not None and self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"pretrain.warmup_steps ({self.warmup_steps}) must be below the total steps of pretrain.phases ({self.total_steps})"
            )
        per_step = self.num_workers * self.gradient_accumulation_steps
        for i, phase in enumerate(self.phases):
            if phase.batch_size % per_step:
                raise ValueError(
                    f"pretrain.phases[{i}].batch_size ({phase.batch_size}) must be a multiple of pretrain.num_workers x "
                    f"pretrain.gradient_accumulation_steps ({self.num_workers} x {self.gradient_accumulation_steps} = {per_step})"
                )
        if "vocab_size" in self.model_overrides:
            raise ValueError("pretrain.model_overrides.vocab_size: the vocabulary size comes from the vocab stage")
        try:
            shape = ModelConfig.named(self.model_size, 30522, **self.model_overrides)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"pretrain.model_overrides: {_one_line(exc)}") from None
        for i, phase in enumerate(self.phases):
            if phase.max_seq_length > shape.max_position_embeddings:
                raise ValueError(
                    f"pretrain.phases[{i}].max_seq_length ({phase.max_seq_length}) exceeds the model's "
                    f"max_position_embeddings ({shape.max_position_embeddings}); raise "
                    "pretrain.model_overrides.max_position_embeddings or shorten the phase"
                )
        return self

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.phases)

    @property
    def warmup(self) -> int:
        """Warmup length in optimizer steps."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round((0.01 if self.warmup_fraction is None else self.warmup_fraction) * self.total_steps))

    def micro_batch_size(self, phase: PretrainPhase) -> int:
        """Sequences per forward pass on one worker."""
        return phase.batch_size // (self.num_workers * self.gradient_accumulation_steps)

    def build_model_config(self, vocab_size: int, pad_token_id: int = 0) -> ModelConfig:
        return ModelConfig.named(self.model_size, vocab_size, **{"pad_token_id": pad_token_id, **self.model_overrides})

    def phase_at(self, step: int) -> int:
        """Index of the phase that the 0-based optimizer step `step` belongs to."""
        end = 0
        for i, phase in enumerate(self.phases):
            end += phase.steps
            if step < end:
                return i
        raise ValueError(f"step {step} is past the last phase ({self.total_steps} steps)")

    def resume_key(self, inputs: dict[str, Any]) -> str:
        """Hash of what decides the trajectory: this section minus the fields that do not
        (budget, checkpoint cadence, logging, ...) plus the input fingerprints and seed.
        A checkpoint resumes only into a run with the same key."""
        section = self.model_dump(mode="json", exclude=_RESUME_NEUTRAL)
        payload = json.dumps({"pretrain": section, "inputs": inputs}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


# -- schedule, optimizer, DeepSpeed configuration ------------------------------------------


def lr_multiplier(step: int, warmup: int, total: int) -> float:
    """Learning-rate factor for the update with 0-based index `step`: (step+1)/warmup during
    warmup, then linear decay that reaches 1/(total-warmup) on the last update (never 0, so
    no update is wasted)."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2).

    Per parameter tensor w with gradient g (t counts updates):
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w
        r = ||w|| / ||u||   (1 when either norm is 0)
        w = w - lr * r * u
    The trust ratio r rescales each layer's Adam step to the size of its weights. Global
    gradient clipping is DeepSpeed's (gradient_clipping), as NVIDIA's LAMB pretraining does.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0.0 or eps <= 0.0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0.0:
            raise ValueError("Lamb needs lr > 0, eps > 0, 0 <= betas < 1, weight_decay >= 0")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                g = w.grad.float()
                state = self.state[w]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(w, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(w, dtype=torch.float32)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(w.float(), alpha=group["weight_decay"])
                w_norm, u_norm = w.float().norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                w.add_((update * trust).to(w.dtype), alpha=-group["lr"])
        return loss


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two optimizer groups: matrices (weights of Linear and Embedding) with weight decay,
    and vectors (biases, LayerNorm gain and shift) without, as BERT does. Tied parameters
    appear once. The order is the model's, so it is the same in every process."""
    params = dict(model.named_parameters())
    decay, plain = ([params[name] for name in names] for names in parameter_group_names(model))
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def parameter_group_names(model: torch.nn.Module) -> list[list[str]]:
    """Names of the parameters of `parameter_groups`, group by group: export maps a
    checkpoint's per-group optimizer tensors back to names with them."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else plain).append(name)
    return [decay, plain]


def deepspeed_config(cfg: PretrainConfig, micro_batch_size: int) -> dict:
    """The DeepSpeed JSON for this section. The optimizer is DeepSpeed's AdamW, or absent
    when LAMB is passed in as a client optimizer; the schedule is always a client LambdaLR."""
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * cfg.gradient_accumulation_steps * cfg.num_workers,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": {"stage": cfg.zero_stage},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if cfg.optimizer == "adamw":
        params: dict[str, Any] = {
            "lr": cfg.learning_rate,
            "betas": list(cfg.betas),
            "eps": cfg.eps,
            "weight_decay": cfg.weight_decay,
        }
        if cfg.torch_adam:
            params["torch_adam"] = True
        ds["optimizer"] = {"type": "AdamW", "params": params}
    return ds


def peak_flops(cfg: PretrainConfig, device_name: str | None) -> float | None:
    """Declared peak FLOP/s of one device: the config's, else the PEAK_FLOPS entry whose
    name fragment occurs in the device name, else None (MFU not reported)."""
    if cfg.peak_flops_per_device is not None:
        return cfg.peak_flops_per_device
    if not device_name:
        return None
    for (fragment, precision), value in PEAK_FLOPS.items():
        if fragment in device_name and precision == cfg.precision:
            return value
    return None


# -- loss watch ----------------------------------------------------------------------------


@dataclass
class LossWatch:
    """Flags micro-batch losses that are NaN/inf, or spikes: above `factor` times the
    running mean (an exponential moving average of step losses with weight `alpha`), once
    `grace` steps have fed it. `reset` restarts the mean (a new phase has another level).
    Pure state, checkpointed with the trainer, so a resumed run flags the same batches."""

    factor: float | None
    grace: int
    alpha: float = 0.02
    mean: float | None = None
    seen: int = 0

    def is_spike(self, loss: float) -> bool:
        if self.factor is None or self.mean is None or self.seen < self.grace:
            return False
        return loss > self.factor * self.mean

    def observe(self, step_loss: float) -> None:
        if not math.isfinite(step_loss):
            return
        self.mean = step_loss if self.mean is None else (1 - self.alpha) * self.mean + self.alpha * step_loss
        self.seen += 1

    def reset(self) -> None:
        self.mean, self.seen = None, 0

    def state_dict(self) -> dict:
        return {"mean": self.mean, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.seen = state["mean"], state["seen"]


# -- stage files ---------------------------------------------------------------------------


class StageFiles(Protocol):
    """The pretrain stage directory as the training loop sees it. Paths are relative to
    the stage directory ('checkpoints/step-0000100/_complete.json'). Files are written
    under `local_path` and become visible to others with `upload`; `download` brings a
    file or folder to `local_path`. For a local stage directory both are no-ops."""

    def local_path(self, relative: str) -> str: ...

    def upload(self, relative: str) -> None: ...

    def download(self, relative: str) -> None: ...

    def drop_local(self, relative: str) -> None: ...

    def exists(self, relative: str) -> bool: ...

    def listdir(self, relative: str) -> list[str]: ...

    def read_text(self, relative: str) -> str: ...

    def write_text(self, relative: str, text: str) -> None: ...

    def remove(self, relative: str) -> None: ...


class LocalStageFiles:
    """StageFiles of a directory every worker can read and write (local disk, or a shared
    filesystem on a cluster): the working copy is the stage directory itself."""

    def __init__(self, directory: str):
        self.directory = directory

    def local_path(self, relative: str) -> str:
        return os.path.join(self.directory, relative)

    def upload(self, relative: str) -> None:
        pass

    def download(self, relative: str) -> None:
        pass

    def drop_local(self, relative: str) -> None:
        pass

    def exists(self, relative: str) -> bool:
        return os.path.exists(self.local_path(relative))

    def listdir(self, relative: str) -> list[str]:
        path = self.local_path(relative)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def read_text(self, relative: str) -> str:
        with open(self.local_path(relative), encoding="utf-8") as handle:
            return handle.read()

    def write_text(self, relative: str, text: str) -> None:
        path = self.local_path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)

    def remove(self, relative: str) -> None:
        path = self.local_path(relative)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)


def checkpoint_tag(step: int) -> str:
    return f"step-{step:07d}"


def complete_checkpoints(files: StageFiles) -> list[dict]:
    """The markers of complete checkpoints (their `_complete.json`), oldest first."""
    found = []
    for name in files.listdir(CHECKPOINTS):
        if _TAG.fullmatch(name) and files.exists(f"{CHECKPOINTS}/{name}/{COMPLETE}"):
            found.append(json.loads(files.read_text(f"{CHECKPOINTS}/{name}/{COMPLETE}")))
    return sorted(found, key=lambda marker: marker["step"])


def latest_checkpoint(files: StageFiles) -> dict | None:
    markers = complete_checkpoints(files)
    return markers[-1] if markers else None


def clear_checkpoints(files: StageFiles) -> None:
    """Delete every checkpoint and the metrics log (a fresh start): markers first, so no
    half-deleted checkpoint ever looks complete."""
    for name in files.listdir(CHECKPOINTS):
        files.remove(f"{CHECKPOINTS}/{name}/{COMPLETE}")
    files.remove(CHECKPOINTS)
    files.remove(METRICS)


def _prune(files: StageFiles, keep: int) -> None:
    markers = complete_checkpoints(files)
    for marker in markers[:-keep]:
        tag = checkpoint_tag(marker["step"])
        files.remove(f"{CHECKPOINTS}/{tag}/{COMPLETE}")
        files.remove(f"{CHECKPOINTS}/{tag}")
    # leftovers of an attempt that died while writing, older than the newest complete one
    newest = markers[-1]["step"] if markers else None
    for name in files.listdir(CHECKPOINTS):
        match = _TAG.fullmatch(name)
        if match and newest is not None and int(match.group(1)) < newest and not files.exists(f"{CHECKPOINTS}/{name}/{COMPLETE}"):
            files.remove(f"{CHECKPOINTS}/{name}")


# -- metrics -------------------------------------------------------------------------------


class MetricsLog:
    """metrics.jsonl: one JSON object per optimizer step, appended by rank 0."""

    def __init__(self, path: str):
        self.path = path

    def truncate(self, step: int) -> None:
        """Keep the records of steps <= `step` (a resumed run rewrites the later ones)."""
        kept = []
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a kill
                        continue
                    if record.get("step", 0) <= step:
                        kept.append(line if line.endswith("\n") else line + "\n")
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def records(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


# -- the training loop ---------------------------------------------------------------------


@dataclass
class PhaseData:
    """What a phase's loader reads: local examples shards and how to batch them."""

    name: str
    paths: list[str]
    masking: Literal["static", "dynamic"] = "static"
    mask_config: MaskConfig | None = None
    """Needed for dynamic masking."""
    pad_id: int = 0
    length_bins: list[int] | None = None
    validation_paths: list[str] = field(default_factory=list)


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...

    def set_description(self, desc: str) -> Any: ...

    def close(self) -> Any: ...


@dataclass
class WorkerContext:
    """Where this worker sits: its rank among `world_size`, and its device."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    """e.g. cuda:0 (the launcher knows which GPU is this worker's)."""


def _device(ctx: WorkerContext) -> torch.device:
    device = torch.device(ctx.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _loader(cfg: PretrainConfig, data: PhaseData, phase: PretrainPhase, seed: int, ctx: WorkerContext, validation: bool = False) -> ExamplesLoader:
    return ExamplesLoader(
        data.validation_paths if validation else data.paths,
        cfg.micro_batch_size(phase),
        seed=keyed_seed(seed, "pretrain", phase.name, "validation" if validation else "train") >> 1,
        rank=ctx.rank,
        world_size=ctx.world_size,
        length_bins=data.length_bins,
        masking=data.masking,
        mask_config=data.mask_config,
        pad_id=data.pad_id,
        max_length=phase.max_seq_length,
        shuffle=not validation,
        # every step gets exactly the configured global batch; what a length bin leaves
        # over differs from epoch to epoch, as the order is reshuffled
        drop_last=not validation,
        num_workers=cfg.loader_processes,
    )


def _batches(loader: ExamplesLoader, phase: str) -> Iterator[dict[str, torch.Tensor]]:
    """Epoch after epoch, forever; the loader's state_dict stays exact between batches."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ConfigError(
                f"pretrain: the examples of phase {phase} ({len(loader.dataset)} sequences) fill no batch of "
                f"{loader.batch_size} per worker in any length bin; lower the phase's batch_size or make more examples"
            )


def _model_inputs(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "input_ids": batch["input_ids"].to(device),
        "token_type_ids": batch["token_type_ids"].to(device),
        "attention_mask": batch["attention_mask"].to(device),
        "labels": batch["labels"].to(device),
        "next_sentence_label": batch["next_sentence_label"].to(device),
    }


@dataclass
class _StepSums:
    """Per-rank sums over a step's micro-batches, all-reduced into the step's metrics."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(12, dtype=torch.float64))
    LOSS, MLM, NSP, MICRO, MLM_OK, MLM_N, NSP_OK, NSP_N, TOKENS, SEQS, FLOPS, PADDED = range(12)

    def add(self, out, batch: dict[str, torch.Tensor], model_cfg: ModelConfig) -> None:
        v = self.values
        tokens = int(batch["attention_mask"].sum())
        mlm_n = int(out.mlm_count)
        v[self.LOSS] += out.loss.item()
        v[self.MLM] += out.mlm_loss.item()
        v[self.NSP] += out.nsp_loss.item() if out.nsp_loss is not None else 0.0
        v[self.MICRO] += 1
        v[self.MLM_OK] += int(out.mlm_correct)
        v[self.MLM_N] += mlm_n
        v[self.NSP_OK] += int(out.nsp_correct) if out.nsp_correct is not None else 0
        v[self.NSP_N] += int(out.nsp_count) if out.nsp_count is not None else 0
        v[self.TOKENS] += tokens
        v[self.SEQS] += batch["input_ids"].shape[0]
        padded_len = batch["input_ids"].shape[1]
        v[self.PADDED] += batch["input_ids"].numel()
        v[self.FLOPS] += encoder_flops_per_token(model_cfg, padded_len, mlm_n / max(1, tokens)) * tokens


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


class Trainer:
    """One worker's DeepSpeed engine, data and checkpoints. Every rank constructs it and
    calls `run`; collective calls happen in the same order on every rank."""

    def __init__(
        self,
        cfg: PretrainConfig,
        model_cfg: ModelConfig,
        phases: Sequence[PhaseData],
        files: StageFiles,
        *,
        seed: int,
        resume_key: str,
        ctx: WorkerContext | None = None,
        progress: Callable[[int, int], Progress] | None = None,
        device_name: str | None = None,
        init_state_dict: dict[str, torch.Tensor] | None = None,
    ):
        """`init_state_dict`: start from these weights (bertcore.model names) instead of a
        fresh initialisation, e.g. to continue pretraining an exported model."""
        if [p.name for p in phases] != [p.name for p in cfg.phases]:
            raise ValueError(f"phase data {[p.name for p in phases]} does not match pretrain.phases {[p.name for p in cfg.phases]}")
        self.cfg, self.model_cfg, self.phases, self.files = cfg, model_cfg, list(phases), files
        self.seed, self.resume_key = seed, resume_key
        self.ctx = ctx or WorkerContext()
        self.progress_factory = progress
        self.init_state_dict = init_state_dict
        self.peak = peak_flops(cfg, device_name)
        self.rank0 = self.ctx.rank == 0
        self.watch = LossWatch(cfg.loss_spike_factor, grace=max(cfg.warmup, 20))
        self.metrics = MetricsLog(files.local_path(METRICS))
        self.step = 0  # optimizer steps completed
        self.tokens_seen = 0
        self.train_time_s = 0.0  # summed over invocations
        self.phase_index: int | None = None
        self.loader: ExamplesLoader | None = None
        self.stream: Iterator[dict[str, torch.Tensor]] | None = None

    # -- set-up ------------------------------------------------------------------------
    def _engine(self):
        if not self.cfg.use_gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        self.device = _device(self.ctx)
        torch.manual_seed(keyed_seed(self.seed, "pretrain", "torch", self.ctx.rank))  # dropout
        init = torch.Generator().manual_seed(keyed_seed(self.seed, "pretrain", "init"))
        model = BertForPreTraining(self.model_cfg, generator=init)
        if self.init_state_dict is not None:
            model.load_state_dict(self.init_state_dict)
        groups = parameter_groups(model, self.cfg.weight_decay)
        optimizer = None
        if self.cfg.optimizer == "lamb":
            optimizer = Lamb(groups, lr=self.cfg.learning_rate, betas=self.cfg.betas, eps=self.cfg.eps, weight_decay=self.cfg.weight_decay)
        warmup, total = self.cfg.warmup, self.cfg.total_steps

        def schedule(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, warmup, total))

        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=groups,
            optimizer=optimizer,
            lr_scheduler=schedule,
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
        self.loader = _loader(self.cfg, self.phases[index], phase, self.seed, self.ctx)
        if loader_state is not None:
            self.loader.load_state_dict(loader_state)
        else:
            self.watch.reset()
        self.stream = _batches(self.loader, phase.name)

    # -- checkpoints -------------------------------------------------------------------
    def _rank_state_name(self, rank: int) -> str:
        return f"trainer-rank-{rank:05d}.pt"

    def _resume(self) -> dict | None:
        marker = latest_checkpoint(self.files)
        if marker is None:
            return None
        if marker.get("resume_key") != self.resume_key:
            raise ConfigError(
                f"pretrain: the latest checkpoint ({checkpoint_tag(marker['step'])}) was written with another pretrain "
                "config or other inputs; set pretrain.resume=never to start over (its checkpoints are deleted)"
            )
        tag = checkpoint_tag(marker["step"])
        self.files.download(f"{CHECKPOINTS}/{tag}")
        load_dir, _ = self.engine.load_checkpoint(self.files.local_path(CHECKPOINTS), tag=tag)
        if load_dir is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag}")
        state = torch.load(self.files.local_path(f"{CHECKPOINTS}/{tag}/{self._rank_state_name(self.ctx.rank)}"), weights_only=False)
        self.step, self.tokens_seen, self.train_time_s = state["step"], state["tokens_seen"], state["train_time_s"]
        self.watch.load_state_dict(state["watch"])
        torch.set_rng_state(state["torch_rng"])
        if self.cfg.use_gpu and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"])
        if self.step < self.cfg.total_steps:
            index = self.cfg.phase_at(self.step)
            same_phase = state["phase"] == self.cfg.phases[index].name
            self._enter_phase(index, state["loader"] if same_phase else None)
        self.files.drop_local(f"{CHECKPOINTS}/{tag}")
        log.info("pretrain: resumed from %s", tag)
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
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if self.cfg.use_gpu else None,
        }
        os.makedirs(self.files.local_path(relative), exist_ok=True)
        torch.save(state, self.files.local_path(f"{relative}/{self._rank_state_name(self.ctx.rank)}"))
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
            "zero_stage": self.cfg.zero_stage,
            "precision": self.cfg.precision,
            "model_config": self.model_cfg.model_dump(mode="json"),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **(extra or {}),
        }
        if self.rank0:
            self.files.upload(METRICS)
            self.files.write_text(f"{relative}/{COMPLETE}", json.dumps(marker, indent=2) + "\n")
            _prune(self.files, self.cfg.keep_checkpoints)
        self.files.drop_local(relative)
        self._barrier()
        return marker

    # -- steps -------------------------------------------------------------------------
    def _grad_norm(self) -> float | None:
        """Global gradient L2 norm before clipping, after the backward of a step's last
        micro-batch. DeepSpeed keeps it except in plain fp32 data parallelism (stage 0)."""
        params = [p for p in self.engine.module.parameters() if p.grad is not None]
        if not params:
            return None
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params])))

    def _train_step(self) -> tuple[dict, str]:
        """One optimizer step: gradient_accumulation_steps good micro-batches on every
        rank. Returns the step's metrics and a hash of the data it consumed."""
        sums = _StepSums()
        digest = hashlib.blake2b(digest_size=8)
        manual_norm = self.cfg.zero_stage == 0 and self.cfg.precision == "fp32"
        grad_norm = None
        skipped = consecutive = 0
        done = 0
        gas = self.cfg.gradient_accumulation_steps
        while done < gas:
            batch = next(self.stream)
            inputs = _model_inputs(batch, self.device)
            out = self.engine(**inputs)
            loss = float(out.loss.detach())
            flags = torch.tensor([0.0 if math.isfinite(loss) else 1.0, 1.0 if self.watch.is_spike(loss) else 0.0])
            nonfinite, spike = (bool(x) for x in self._collective(flags, "max"))
            if nonfinite or spike:
                what = "is not finite" if nonfinite else f"spiked ({loss:.4g} vs a running mean of {self.watch.mean:.4g})"
                where = f"step {self.step + 1} (phase {self.cfg.phases[self.phase_index].name})"
                if self.cfg.on_nonfinite == "stop":
                    raise TrainingDiverged(
                        f"pretrain: the loss {what} at {where}; lower pretrain.learning_rate, raise pretrain.warmup_steps, "
                        "or set pretrain.on_nonfinite=skip; the latest complete checkpoint is kept"
                    )
                skipped += 1
                consecutive += 1
                log.warning("pretrain: skipped a micro-batch at %s: the loss %s", where, what)
                if consecutive >= MAX_CONSECUTIVE_SKIPS:
                    raise TrainingDiverged(f"pretrain: {consecutive} micro-batches in a row skipped at {where}; the run has diverged")
                continue
            consecutive = 0
            self.engine.backward(out.loss)
            if manual_norm and done == gas - 1:
                grad_norm = self._grad_norm()
            self.engine.step()
            sums.add(out, batch, self.model_cfg)
            digest.update(batch["input_ids"].numpy().tobytes())
            done += 1
        if grad_norm is None:
            norm = self.engine.get_global_grad_norm()
            grad_norm = None if norm is None else float(norm)
        hashes = torch.zeros(self.ctx.world_size, dtype=torch.int64)
        hashes[self.ctx.rank] = int.from_bytes(digest.digest(), "little", signed=True)
        data_hash = hashlib.blake2b(self._collective(hashes).numpy().tobytes(), digest_size=8).hexdigest()
        totals = self._collective(torch.cat([sums.values, torch.tensor([float(skipped)], dtype=torch.float64)]))
        return self._step_metrics(totals, grad_norm), data_hash

    def _step_metrics(self, t: torch.Tensor, grad_norm: float | None) -> dict:
        s = _StepSums
        micro = float(t[s.MICRO])
        return {
            "loss": float(t[s.LOSS]) / micro,
            "mlm_loss": float(t[s.MLM]) / micro,
            "nsp_loss": float(t[s.NSP]) / micro if t[s.NSP_N] else None,
            "mlm_accuracy": _ratio(float(t[s.MLM_OK]), float(t[s.MLM_N])),
            "nsp_accuracy": _ratio(float(t[s.NSP_OK]), float(t[s.NSP_N])),
            "grad_norm": grad_norm,
            "tokens": int(t[s.TOKENS]),
            "sequences": int(t[s.SEQS]),
            "padded_tokens": int(t[s.PADDED]),
            "flops": float(t[s.FLOPS]),
            "skipped_batches": int(t[-1]),
        }

    @torch.no_grad()
    def _validate(self) -> dict | None:
        """MLM/NSP loss and accuracy over up to validation_batches batches per worker of
        the last phase's validation examples (all ranks, summed)."""
        index = len(self.cfg.phases) - 1
        data = self.phases[index]
        if self.cfg.validation_batches == 0 or not data.validation_paths:
            return None
        loader = _loader(self.cfg, data, self.cfg.phases[index], self.seed, self.ctx, validation=True)
        sums = _StepSums()
        self.engine.eval()
        for k, batch in enumerate(loader):
            if k >= self.cfg.validation_batches:
                break
            sums.add(self.engine(**_model_inputs(batch, self.device)), batch, self.model_cfg)
        self.engine.train()
        t = self._collective(sums.values)
        s = _StepSums
        if not t[s.MICRO]:
            return None
        return {
            "phase": self.cfg.phases[index].name,
            "sequences": int(t[s.SEQS]),
            "loss": float(t[s.LOSS]) / float(t[s.MICRO]),
            "mlm_loss": float(t[s.MLM]) / float(t[s.MICRO]),
            "mlm_accuracy": _ratio(float(t[s.MLM_OK]), float(t[s.MLM_N])),
            "nsp_accuracy": _ratio(float(t[s.NSP_OK]), float(t[s.NSP_N])),
        }

    def run(self) -> dict:
        """Train to the end of the last phase (or the time budget); returns the marker of
        the final checkpoint (step, tokens seen, stop reason, validation metrics)."""
        started = time.perf_counter()
        self._engine()
        marker = self._resume()
        if self.rank0:
            if self.files.exists(METRICS):
                self.files.download(METRICS)
            self.metrics.truncate(self.step)
        total = self.cfg.total_steps
        if self.step >= total and marker is not None:
            return marker
        if self.loader is None:
            self._enter_phase(self.cfg.phase_at(self.step))
        bar = self.progress_factory(total, self.step) if (self.rank0 and self.progress_factory) else None
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
                self.tokens_seen += record["tokens"]
                self.watch.observe(record["loss"])
                if self.cfg.time_budget_s is not None:  # the same on every rank: all skip the all-reduce together
                    # any rank over budget stops all of them, so they save the same step
                    over_budget = time.perf_counter() - started >= self.cfg.time_budget_s
                    if self._collective(torch.tensor([1.0 if over_budget else 0.0]), "max")[0] > 0 and self.step < total:
                        stopped_by = "time_budget"
                if self.rank0:
                    self._log(record, data_hash, elapsed, bar)
                if stopped_by or self.step == total or self.step % self.cfg.checkpoint_every == 0:
                    extra = {"validation": self._validate()} if (stopped_by or self.step == total) else None
                    marker = self._save(stopped_by, extra)
                if stopped_by:
                    log.warning("pretrain: time budget of %ss spent at step %d of %d; stopping", self.cfg.time_budget_s, self.step, total)
                    break
        finally:
            if bar is not None:
                bar.close()
        return marker

    def _log(self, record: dict, data_hash: str, elapsed: float, bar: Progress | None) -> None:
        world = self.ctx.world_size
        flops = record.pop("flops")
        out = {
            "step": self.step,
            "phase": self.cfg.phases[self.phase_index].name,
            **record,
            # the rate of this step's update (the scheduler has already moved on)
            "lr": self.cfg.learning_rate * lr_multiplier(self.step - 1, self.cfg.warmup, self.cfg.total_steps),
            "tokens_per_s": record["tokens"] / elapsed,
            "sequences_per_s": record["sequences"] / elapsed,
            "mfu": flops / (elapsed * self.peak * world) if self.peak else None,
            "step_time_s": elapsed,
            "tokens_seen": self.tokens_seen,
            "epoch": self.loader.epoch if self.loader else None,
            "data_hash": data_hash,
        }
        self.metrics.append(out)
        if bar is not None:
            bar.update(1)
            if self.step % self.cfg.log_every == 0:
                bar.set_description(f"pretrain {out['phase']} loss {out['loss']:.3f} mlm_acc {out['mlm_accuracy'] or 0:.3f}")
