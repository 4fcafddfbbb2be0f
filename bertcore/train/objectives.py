"""What a training step optimises: the `Objective` that the one training loop
(bertcore/train/trainer.py) is given, and pretraining's, masked LM plus next-sentence prediction.

The loop owns everything an objective does not decide: the DeepSpeed engine around the
module the objective builds, the data, the schedule, checkpoints, validation, the time
budget and the trackers. An objective decides the trainable module (what DeepSpeed wraps,
optimises and checkpoints), the loss of one micro-batch, the quantities summed over a
step's micro-batches and ranks, and the metrics made from those sums. Distillation
(bertcore/distill/objective.py) is another objective: a frozen teacher outside the engine,
the student and its learned projections inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from bertcore.model.config import ModelConfig, encoder_flops_per_token
from bertcore.model.pretrained import load_into
from bertcore.rng import keyed_seed


def init_generator(seed: int, section: str) -> torch.Generator:
    """The generator a training stage's model is initialised from: keyed by the run seed
    and the section, the same on every rank and for any world size."""
    return torch.Generator().manual_seed(keyed_seed(seed, section, "init"))


@dataclass
class MicroBatchResult:
    """One micro-batch's loss (what the loop backpropagates) and the objective's sums."""

    loss: torch.Tensor
    sums: dict[str, float]
    """Values of `Objective.sums`, summed by the loop over the step's micro-batches and the ranks."""
    flops: float = 0.0
    """Training FLOPs the micro-batch cost (for MFU), see bertcore.train.mfu."""


@dataclass(frozen=True)
class BatchCounts:
    """What a loader batch holds, padded (input_ids (B, T) with an attention_mask) or
    packed (input_ids (1, N) or (N,) with cu_seqlens, bertcore/train/packing.py)."""

    tokens: int
    """Real (non-padding) tokens."""
    sequences: int
    slots: int
    """Token positions the model runs on: B x T padded, N (+ any tail padding) packed."""
    attended: float
    """Keys a token attends on average in a global layer: T padded, sum(L_i^2) / N packed."""


def batch_counts(batch: dict[str, torch.Tensor]) -> BatchCounts:
    ids = batch["input_ids"]
    if "cu_seqlens" in batch:
        cu = batch["cu_seqlens"].to(torch.int64)
        lengths = cu[1:] - cu[:-1]
        tokens = int(cu[-1])
        return BatchCounts(tokens, len(lengths), ids.numel(), float((lengths**2).sum()) / max(1, tokens))
    return BatchCounts(int(batch["attention_mask"].sum()), ids.shape[0], ids.numel(), float(ids.shape[1]))


@dataclass
class StepSums:
    """Per-rank sums over a step's micro-batches, all-reduced into the step's metrics: the
    loop's own (loss, micro-batches, tokens, ...) then the objective's `sums`."""

    names: tuple[str, ...]
    values: torch.Tensor = field(init=False)
    OWN = ("loss", "micro", "tokens", "sequences", "flops", "padded")

    def __post_init__(self) -> None:
        self.values = torch.zeros(len(self.OWN) + len(self.names), dtype=torch.float64)

    def add(self, out: MicroBatchResult, batch: dict[str, torch.Tensor]) -> None:
        counts = batch_counts(batch)
        own = (out.loss.item(), 1, counts.tokens, counts.sequences, out.flops, counts.slots)
        for i, value in enumerate(own):
            self.values[i] += value
        for i, name in enumerate(self.names, start=len(self.OWN)):
            self.values[i] += out.sums[name]

    def totals(self, values: torch.Tensor) -> dict[str, float]:
        """Summed `values` (this layout, e.g. all-reduced) by name."""
        return {name: float(v) for name, v in zip(self.OWN + self.names, values)}


class Objective(Protocol):
    """A component of the training loop; see the module docstring."""

    sums: tuple[str, ...]
    """Names of the per-micro-batch quantities `forward` returns."""
    metrics: tuple[str, ...]
    """Fields `summarise` adds to each step's and each validation's record (after `loss`)."""
    init_report: dict | None
    """What `build` started from, for the final checkpoint's marker (None: a fresh initialisation)."""

    def build(self, generator: torch.Generator, device: torch.device) -> nn.Module:
        """The trainable module, initialised from `generator` (then from whatever it starts
        from); frozen parts (a teacher) go to `device` here."""
        ...

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> MicroBatchResult:
        """Loss and sums of one batch from ExamplesLoader; `module` is the engine around `build`'s module."""
        ...

    def summarise(self, totals: dict[str, float], micro_batches: float) -> dict[str, Any]:
        """The `metrics` fields from the sums over `micro_batches` micro-batches."""
        ...

    def describe(self) -> dict[str, Any]:
        """What a checkpoint marker records about the module (`model_config`: the exported model's)."""
        ...

    # optional: enter_phase(module, global_rope_theta), called by the loop as each phase
    # starts (and on resume) with the phase's rotary base; objectives without it ignore it


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def model_inputs(batch: dict[str, torch.Tensor], device: torch.device, *names: str) -> dict[str, torch.Tensor]:
    """The named entries of a loader batch that it holds, on `device`."""
    return {name: batch[name].to(device) for name in names if name in batch}


@dataclass
class Pretraining:
    """The pretraining objective: masked LM plus next-sentence prediction (the NSP term is
    absent for examples without NSP labels, and for a family without the head), on the
    model the config's family builds (bertcore/model/families/: BERT's BertForPreTraining,
    the modern encoder's ModernBertForMaskedLM), fed the batch entries the family takes
    (padded or packed). `init_state_dict`: start from these weights (the family's names,
    e.g. an existing model's, see bertcore.model.pretrained) instead of a fresh
    initialisation; entries it lacks (the heads) keep the seeded initialisation. A phase
    may change the global rotary base (`enter_phase`)."""

    model_cfg: ModelConfig
    init_state_dict: dict[str, torch.Tensor] | None = None
    sums: tuple[str, ...] = ("mlm", "nsp", "mlm_ok", "mlm_n", "nsp_ok", "nsp_n")
    metrics: tuple[str, ...] = ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
    init_report: dict | None = field(default=None, init=False)

    def build(self, generator: torch.Generator, device: torch.device) -> nn.Module:
        model = self.model_cfg.family.build(self.model_cfg, generator)
        if self.init_state_dict is not None:
            plan = load_into(model, self.init_state_dict)
            self.init_report = {"fresh": plan.fresh, "ignored": plan.ignored}
        return model

    def __post_init__(self) -> None:
        self._configured_theta = self.model_cfg.global_rope_theta

    def enter_phase(self, module: nn.Module, global_rope_theta: float | None) -> None:
        """A phase's rotary base for the global layers (None: the model config's), set on
        a module that has rotary positions and recorded in what `describe` hands the export."""
        if not hasattr(module, "set_global_rope_theta"):
            return
        theta = self._configured_theta if global_rope_theta is None else float(global_rope_theta)
        module.set_global_rope_theta(theta)
        self.model_cfg = self.model_cfg.model_copy(update={"global_rope_theta": theta})

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> MicroBatchResult:
        out = module(**model_inputs(batch, device, *self.model_cfg.family.batch_keys))
        counts = batch_counts(batch)
        tokens = counts.tokens
        mlm_n = int(out.mlm_count)
        sums = {
            "mlm": out.mlm_loss.item(),
            "nsp": out.nsp_loss.item() if out.nsp_loss is not None else 0.0,
            "mlm_ok": int(out.mlm_correct),
            "mlm_n": mlm_n,
            "nsp_ok": int(out.nsp_correct) if out.nsp_correct is not None else 0,
            "nsp_n": int(out.nsp_count) if out.nsp_count is not None else 0,
        }
        flops = encoder_flops_per_token(self.model_cfg, counts.attended, mlm_n / max(1, tokens)) * tokens
        return MicroBatchResult(out.loss, sums, flops)

    def summarise(self, totals: dict[str, float], micro_batches: float) -> dict[str, Any]:
        return {
            "mlm_loss": totals["mlm"] / micro_batches,
            "nsp_loss": totals["nsp"] / micro_batches if totals["nsp_n"] else None,
            "mlm_accuracy": ratio(totals["mlm_ok"], totals["mlm_n"]),
            "nsp_accuracy": ratio(totals["nsp_ok"], totals["nsp_n"]),
        }

    def describe(self) -> dict[str, Any]:
        return {"model_config": self.model_cfg.model_dump(mode="json")}
