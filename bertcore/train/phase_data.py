"""What one training worker reads: where it sits among the workers (`WorkerContext`), the
examples of each phase (`PhaseData`), and the batches of a phase, epoch after epoch.

The trainer (bertcore/train/trainer.py) builds one loader per phase and one for each
validation from these; the loader itself is bertcore/train/loader.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from bertcore.errors import ConfigError
from bertcore.examples.masking import MaskConfig
from bertcore.rng import keyed_seed
from bertcore.train.config import TrainingConfig, TrainingPhase
from bertcore.train.loader import ExamplesLoader

if TYPE_CHECKING:
    import torch


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
    token_types: bool = True
    """Segment B gets token type 1; False: every token type is 0 (RoBERTa has one type)."""
    vocab_size: int | None = None
    """Shards holding ids at or above it are refused, naming the file."""


@dataclass
class WorkerContext:
    """Where this worker sits: its rank among `world_size`, and its device."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"
    """e.g. cuda:0 (the launcher knows which GPU is this worker's)."""

    def torch_device(self) -> torch.device:
        """This worker's device, made the current CUDA device when it is a GPU."""
        import torch

        device = torch.device(self.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device


def phase_loader(
    cfg: TrainingConfig, data: PhaseData, phase: TrainingPhase, seed: int, ctx: WorkerContext, validation: bool = False
) -> ExamplesLoader:
    """The loader of one phase's examples on this worker (its rank's share), or of its
    validation examples: a keyed shuffle, the same on every run and after a resume."""
    return ExamplesLoader(
        data.validation_paths if validation else data.paths,
        cfg.micro_batch_size(phase),
        seed=keyed_seed(seed, cfg.SECTION, phase.name, "validation" if validation else "train") >> 1,
        rank=ctx.rank,
        world_size=ctx.world_size,
        length_bins=data.length_bins,
        masking=data.masking,
        mask_config=data.mask_config,
        pad_id=data.pad_id,
        token_types=data.token_types,
        max_length=phase.max_seq_length,
        # validation: the first batches of one keyed shuffle are the same sample at every
        # call, drawn from every length bin
        shuffle=True,
        # every step gets exactly the configured global batch; what a length bin leaves
        # over differs from epoch to epoch, as the order is reshuffled
        drop_last=not validation,
        num_workers=cfg.loader_processes,
        vocab_size=data.vocab_size,
    )


def endless_batches(loader: ExamplesLoader, phase: str, section: str = "pretrain") -> Iterator[dict[str, torch.Tensor]]:
    """Epoch after epoch, forever; the loader's state_dict stays exact between batches."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ConfigError(
                f"{section}: the examples of phase {phase} ({len(loader.dataset)} sequences) fill no batch of "
                f"{loader.batch_size} per worker in any length bin; lower the phase's batch_size or make more examples"
            )
