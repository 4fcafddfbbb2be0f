"""Divergence detection for pretraining: NaN/inf losses and loss spikes, and the jumps a
reader should hear about although training goes on."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from bertcore.errors import BertpipeError

log = logging.getLogger(__name__)

JUMP_FACTOR = 1.5
"""A step loss above this multiple of the running mean is a jump: reported (console,
report, `inspect pretrain`), not acted on; `loss_spike_factor` is what stops or skips."""


MAX_CONSECUTIVE_SKIPS = 20
"""With on_nonfinite: skip, this many skipped micro-batches in a row stop the run anyway."""


class TrainingDiverged(BertpipeError):
    """The loss became NaN/inf or spiked, and <section>.on_nonfinite says stop."""


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

    def refuse(self, loss: float, nonfinite: bool, *, key: str, where: str, action: str, run: int) -> None:
        """A micro-batch whose loss is not finite or spiked (on any rank): raises
        TrainingDiverged when `action` is "stop" or `run` (skips in a row) reaches
        MAX_CONSECUTIVE_SKIPS; otherwise warns that it is skipped."""
        what = "is not finite" if nonfinite else f"spiked ({loss:.4g} vs a running mean of {self.mean:.4g})"
        if action == "stop":
            raise TrainingDiverged(
                f"{key}: the loss {what} at {where}; lower {key}.learning_rate, raise {key}.warmup_steps, "
                f"or set {key}.on_nonfinite=skip; the latest complete checkpoint is kept"
            )
        log.warning("%s: skipped a micro-batch at %s: the loss %s", key, where, what)
        if run >= MAX_CONSECUTIVE_SKIPS:
            raise TrainingDiverged(f"{key}: {run} micro-batches in a row skipped at {where}; the run has diverged")

    def observe(self, step_loss: float) -> dict | None:
        """Feed a step's loss into the running mean. Returns {"running_mean", "factor"} when,
        after `grace` steps, the loss was above JUMP_FACTOR times the mean before it."""
        if not math.isfinite(step_loss):
            return None
        jump = None
        if self.mean is not None and self.seen >= self.grace and self.mean > 0 and step_loss > JUMP_FACTOR * self.mean:
            jump = {"running_mean": self.mean, "factor": step_loss / self.mean}
        self.mean = step_loss if self.mean is None else (1 - self.alpha) * self.mean + self.alpha * step_loss
        self.seen += 1
        return jump

    def reset(self) -> None:
        self.mean, self.seen = None, 0

    def state_dict(self) -> dict:
        return {"mean": self.mean, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.seen = state["mean"], state["seen"]
