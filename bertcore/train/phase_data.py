"""What one training worker reads: where it sits among the workers (`WorkerContext`), the
examples of each phase (`PhaseData`: the shards as the manifest lists them, and the cache
they are read through), and the batches of a phase, epoch after epoch.

The trainer (bertcore/train/trainer.py) builds one loader per phase and one for each
validation from these; the loader itself is bertcore/train/loader.py, the cache
bertcore/train/shard_cache.py.
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
from bertcore.train.shard_cache import CacheSpec, ShardRef

if TYPE_CHECKING:
    import torch


@dataclass
class PhaseData:
    """What a phase's loader reads: examples shards and how to batch them."""

    name: str
    shards: list[ShardRef]
    """The phase's training shards (ShardRefs from the manifest, or local paths)."""
    masking: Literal["static", "dynamic"] = "static"
    mask_config: MaskConfig | None = None
    """Needed for dynamic masking."""
    pad_id: int = 0
    length_bins: list[int] | None = None
    validation_shards: list[ShardRef] = field(default_factory=list)
    token_types: bool = True
    """Segment B gets token type 1; False: every token type is 0 (RoBERTa has one type)."""
    vocab_size: int | None = None
    """Shards holding ids at or above it are refused, naming the file."""
    cache: CacheSpec | None = None
    """The machine's shard cache (a remote run root), or None: the shards are local paths, read in place."""
    window_shards: int | None = None
    """Shards shuffled together and held at once (None: all of them)."""


@dataclass
class WorkerContext:
    """Where this worker sits: its rank among `world_size`, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    """This worker's place among the workers of its machine (they share one shard cache)."""
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
    validation examples: a keyed shuffle, the same on every run and after a resume. Its
    shards come through the machine's cache, which knows this loader as its owner."""
    role = "validation" if validation else "train"
    cache = None if data.cache is None else data.cache.open(owner=f"rank-{ctx.rank}-{phase.name}-{role}")
    return ExamplesLoader(
        data.validation_shards if validation else data.shards,
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
        cache=cache,
        window_shards=data.window_shards,
        local_rank=ctx.local_rank,
        # validation reads the first batches only: nothing to fetch ahead
        prefetch=not validation,
        # packed batches where the phase gives a token budget (validation stays padded: the
        # same sample of sequences at every call, which a model that reads packed batches
        # also reads padded)
        token_budget=None if validation else cfg.micro_token_budget(phase),
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
                f"{section}: the examples of phase {phase} ({loader.num_records} sequences) fill no batch of "
                f"{loader.batch_size} per worker in any length bin; lower the phase's batch_size or make more examples"
            )
