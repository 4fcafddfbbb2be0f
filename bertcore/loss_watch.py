"""Divergence detection for pretraining: NaN/inf losses and loss spikes."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
