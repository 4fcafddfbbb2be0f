"""Optimisation: the learning-rate schedule, LAMB, BERT's two parameter groups, and the
DeepSpeed JSON built from a training section (`pretrain:`, `distill:`).

Which optimizer runs: AdamW is DeepSpeed's (`torch_adam`: torch.optim.AdamW; else its
fused Adam, FusedAdam on GPU). LAMB on GPU is DeepSpeed's FusedLamb (`"type": "Lamb"`:
NVIDIA's fused kernel, the trust ratio clamped to [min_coeff, max_coeff] = [0.01, 10]);
on CPU, where DeepSpeed has none, the client `Lamb` below. Either LAMB needs ZeRO stage 0:
ZeRO hands the optimizer flat partitions, which would make the trust ratio one per
partition instead of one per layer (train_config refuses the combination).

Learning rate (`LearningRate`): one schedule over all phases, set on the optimizer by the
loop before each update: BERT's linear warmup to `learning_rate` then linear decay to zero
at the last step, over steps (`lr_multiplier`); or warmup-stable-decay over the tokens seen
(`wsd_multiplier`: linear warmup, the peak, then a linear or 1 - sqrt decay), for any family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bertcore.train.config import ScheduleConfig, TrainingConfig


def lr_multiplier(step: int, warmup: int, total: int) -> float:
    """Learning-rate factor for the update with 0-based index `step`: (step+1)/warmup during
    warmup, then linear decay that reaches 1/(total-warmup) on the last update (never 0, so
    no update is wasted)."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def wsd_multiplier(tokens: float, schedule: ScheduleConfig) -> float:
    """Learning-rate factor of an update made after `tokens` tokens: (tokens + 1) /
    warmup_tokens while warming up, 1 in the stable phase, then from the decay's start
    f + (1 - f) x s(progress), progress = tokens into the decay / decay_tokens (at most 1),
    s(p) = 1 - p (linear) or 1 - sqrt(p), f = final_lr_ratio."""
    if tokens < schedule.warmup_tokens:
        return min(1.0, (tokens + 1) / schedule.warmup_tokens)
    start = schedule.decay_start
    if tokens < start or not schedule.decay_tokens:
        return 1.0
    progress = min(1.0, (tokens - start) / schedule.decay_tokens)
    shape = 1.0 - progress if schedule.decay == "linear" else 1.0 - progress**0.5
    return schedule.final_lr_ratio + (1.0 - schedule.final_lr_ratio) * shape


class LearningRate:
    """The rate of each update from a training section: `learning_rate` x the linear
    schedule's factor of the step, or the wsd schedule's of the tokens seen before it."""

    def __init__(self, cfg: TrainingConfig):
        self.cfg = cfg

    def factor(self, step: int, tokens: float) -> float:
        """The factor of the update with 0-based index `step`, made after `tokens` tokens."""
        if self.cfg.schedule.kind == "wsd":
            return wsd_multiplier(tokens, self.cfg.schedule)
        return lr_multiplier(step, self.cfg.warmup, self.cfg.total_steps)

    def rate(self, step: int, tokens: float) -> float:
        return self.cfg.learning_rate * self.factor(step, tokens)

    def budget_spent(self, tokens: float) -> bool:
        """Whether a wsd schedule's total_tokens are seen (the run then ends, as at its last step)."""
        schedule = self.cfg.schedule
        return schedule.kind == "wsd" and tokens >= schedule.total_tokens

    def ends_stable(self, before: float, after: float) -> bool:
        """Whether the step from `before` to `after` tokens is a wsd schedule's last stable
        one: the step whose checkpoint is the pre-decay one."""
        start = self.cfg.schedule.decay_start
        return start is not None and self.cfg.schedule.decay_tokens > 0 and before < start <= after

    def apply(self, optimizer: torch.optim.Optimizer, step: int, tokens: float) -> float:
        """Set every group's rate for the coming update; returns it."""
        lr = self.rate(step, tokens)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr


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

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ):
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


FUSED_LAMB_TRUST_RANGE = (0.01, 10.0)
"""DeepSpeed FusedLamb's min_coeff and max_coeff (its defaults, written out)."""


def client_optimizer(cfg: TrainingConfig, groups: list[dict]) -> torch.optim.Optimizer | None:
    """The optimizer handed to deepspeed.initialize, or None when the DeepSpeed JSON names
    one: the client LAMB on CPU."""
    if cfg.optimizer == "lamb" and not cfg.use_gpu:
        return Lamb(groups, lr=cfg.learning_rate, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return None


def deepspeed_config(cfg: TrainingConfig, micro_batch_size: int) -> dict:
    """The DeepSpeed JSON for this section. The optimizer is DeepSpeed's AdamW, its fused
    LAMB on GPU, or absent when LAMB runs as a client optimizer on CPU; no scheduler: the
    loop sets each update's rate (`LearningRate`)."""
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "train_batch_size": micro_batch_size * cfg.gradient_accumulation_steps * cfg.num_workers,
        "gradient_clipping": cfg.max_grad_norm,
        # ZeRO-1/2 optimizer partitions in DeepSpeed's elastic layout: a checkpoint resumes
        # on another number of workers (a run that lost a node goes on with fewer)
        "zero_optimization": {
            "stage": cfg.zero_stage,
            **({"elastic_checkpoint": True} if cfg.zero_stage in (1, 2) else {}),
        },
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if cfg.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif cfg.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    params: dict[str, Any] = {
        "lr": cfg.learning_rate,
        "betas": list(cfg.betas),
        "eps": cfg.eps,
        "weight_decay": cfg.weight_decay,
    }
    if cfg.optimizer == "adamw":
        if cfg.torch_adam:
            params["torch_adam"] = True
        ds["optimizer"] = {"type": "AdamW", "params": params}
    elif cfg.use_gpu:  # lamb
        low, high = FUSED_LAMB_TRUST_RANGE
        ds["optimizer"] = {
            "type": "Lamb",
            "params": {**params, "bias_correction": True, "min_coeff": low, "max_coeff": high},
        }
    return ds


def gradient_norm(module: torch.nn.Module) -> float | None:
    """Global gradient L2 norm before clipping, after the backward of a step's last
    micro-batch. DeepSpeed keeps it except in plain fp32 data parallelism (stage 0)."""
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return None
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params])))
