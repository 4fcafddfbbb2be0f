"""Training data loader over examples shards (Arrow IPC files, opened memory-mapped).

Per epoch: records are grouped by length bin (or by file when no bins are given), shuffled
within each group, cut into batches, and the batches shuffled, all keyed by (seed, epoch);
data-parallel rank r takes global batches r, r + W, r + 2W, ... Every rank therefore sees
each record of its batches once, the ranks together see every record once per epoch, and
a batch never mixes length bins, so padding stays small.

A batch is a dict of tensors:
    input_ids           (B, T) long   padded with [PAD] to a multiple of 8
    token_type_ids      (B, T) long   0 before segment_b_start, 1 from there to the end
    attention_mask      (B, T) long   1 on real tokens
    labels              (B, T) long   original id at masked positions, -100 elsewhere
    next_sentence_label (B,)   long   0/1; -100 where the record has no NSP label (-1 stored)
Static masking reads the stored masks; dynamic masking draws one with `mask_batch`, keyed by
(seed, epoch, global batch index), so each epoch gets a new mask and a rerun the same one.

`state_dict()` records (epoch, batches consumed); a loader restored from it yields exactly
the remaining batches of the uninterrupted epoch, then continues with the next epochs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from os import PathLike
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch
from torch.utils.data import DataLoader, Dataset

from bertcore.examples_config import length_bin
from bertcore.masking import MaskConfig, mask_batch
from bertcore.rng import keyed_numpy, keyed_seed

IGNORE_INDEX = -100


class _MappedFile:
    """One shard's record batches with their list offsets as numpy views of the map."""

    def __init__(self, path: str):
        self.batches = []
        starts = [0]
        # The numpy views keep the mapping alive after the file is closed (here, not at garbage
        # collection), so an epoch over thousands of shards holds no descriptor per shard.
        with pa.memory_map(path) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                columns = {}
                for name in ("input_ids", "masked_positions", "masked_ids"):
                    array = batch.column(name)
                    columns[name] = (array.offsets.to_numpy(), array.values.to_numpy(zero_copy_only=False))
                for name in ("segment_b_start", "next_sentence_label", "length"):
                    columns[name] = batch.column(name).to_numpy()
                self.batches.append(columns)
                starts.append(starts[-1] + batch.num_rows)
        self.starts = np.asarray(starts)

    def record(self, row: int) -> dict:
        b = int(np.searchsorted(self.starts, row, side="right") - 1)
        columns = self.batches[b]
        r = row - self.starts[b]
        out = {}
        for name in ("input_ids", "masked_positions", "masked_ids"):
            offsets, values = columns[name]
            out[name] = values[offsets[r] : offsets[r + 1]]
        for name in ("segment_b_start", "next_sentence_label", "length"):
            out[name] = int(columns[name][r])
        return out


class ExamplesDataset(Dataset):
    """Records of a list of local examples shards; item i -> dict (numpy id arrays).

    Files are mapped lazily in each process that reads (DataLoader workers included); only
    the `length` column is read up front.
    """

    def __init__(self, paths: Sequence[str | PathLike]):
        self.paths = [str(p) for p in paths]
        lengths, file_of = [], []
        for k, path in enumerate(self.paths):
            try:
                table = ipc.open_file(pa.memory_map(path)).read_all().select(["length"])
            except (OSError, pa.ArrowInvalid, KeyError) as exc:
                raise ValueError(f"{path}: not a readable examples shard ({exc})") from None
            lengths.append(table.column("length").to_numpy().astype(np.int64))
            file_of.append(np.full(table.num_rows, k, dtype=np.int64))
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        self.file_of = np.concatenate(file_of) if file_of else np.zeros(0, dtype=np.int64)
        self.file_starts = np.concatenate([[0], np.cumsum([len(x) for x in lengths])]).astype(np.int64)
        self._files: dict[int, _MappedFile] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict:
        k = int(self.file_of[index])
        if k not in self._files:
            self._files[k] = _MappedFile(self.paths[k])
        return self._files[k].record(int(index - self.file_starts[k]))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_files"] = {}  # memory maps do not pickle; workers reopen
        return state


class _Keyed(Dataset):
    """Adds the batch key to each item so the collator can key the dynamic mask."""

    def __init__(self, dataset: ExamplesDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[int, int, dict]:
        epoch, batch_index, index = key
        return epoch, batch_index, self.dataset[index]


class Collator:
    """Records -> padded tensors (see the module docstring)."""

    def __init__(
        self,
        *,
        seed: int,
        masking: Literal["static", "dynamic"] = "static",
        mask_config: MaskConfig | None = None,
        pad_id: int | None = None,
        pad_to_multiple_of: int = 8,
        max_length: int | None = None,
    ):
        if masking == "dynamic" and mask_config is None:
            raise ValueError("dynamic masking needs a mask_config")
        if pad_id is None:
            if mask_config is None:
                raise ValueError("give pad_id or a mask_config (which knows [PAD])")
            pad_id = mask_config.vocab.special.pad
        self.seed, self.masking, self.mask_config = seed, masking, mask_config
        self.pad_id, self.multiple, self.max_length = pad_id, pad_to_multiple_of, max_length

    def __call__(self, items: Sequence[tuple[int, int, dict]]) -> dict[str, torch.Tensor]:
        epoch, batch_index, _ = items[0]
        records = [record for _, _, record in items]
        lengths = torch.tensor([r["length"] for r in records])  # (B,)
        longest = int(lengths.max())
        T = math.ceil(longest / self.multiple) * self.multiple
        if self.max_length is not None:
            T = max(longest, min(T, self.max_length))
        B = len(records)
        input_ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        if self.masking == "static" and not any(len(r["masked_positions"]) for r in records):
            # Static records always have at least one target (the quota is >= 1).
            raise ValueError("these examples carry no stored masks (written with dynamic masking): use masking='dynamic'")
        for b, r in enumerate(records):
            input_ids[b, : r["length"]] = torch.from_numpy(r["input_ids"].astype(np.int64))
            if self.masking == "static":
                positions = torch.from_numpy(r["masked_positions"].astype(np.int64))
                labels[b, positions] = torch.from_numpy(r["masked_ids"].astype(np.int64))
        position = torch.arange(T)[None, :]  # (1, T)
        attention_mask = (position < lengths[:, None]).long()  # (B, T)
        b_start = torch.tensor([r["segment_b_start"] for r in records])[:, None]
        token_type_ids = ((position >= b_start) & (attention_mask == 1)).long()
        nsp = torch.tensor([r["next_sentence_label"] for r in records], dtype=torch.long)
        nsp = torch.where(nsp < 0, torch.full_like(nsp, IGNORE_INDEX), nsp)
        if self.masking == "dynamic":
            cfg = self.mask_config
            never = torch.tensor(sorted(cfg.never_masked))
            special_mask = torch.isin(input_ids, never) | (attention_mask == 0)
            continuation = torch.from_numpy(cfg.vocab.is_continuation)[input_ids] & (attention_mask == 1)
            generator = torch.Generator().manual_seed(keyed_seed(self.seed, "dynamic-mask", epoch, batch_index) >> 1)
            input_ids, labels = mask_batch(input_ids, special_mask, continuation, generator, cfg)
        return {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "next_sentence_label": nsp,
        }


class ExamplesLoader:
    """Batches of examples shards for one data-parallel rank; resumable mid-epoch.

    paths: local examples shard files (all ranks pass the same list). length_bins: batch
    within these length bins (None: within each file, which the examples stage already
    groups by bin). even_batches: every rank gets the same number of batches per epoch
    (ranks short of one repeat a batch from the start of the epoch's order), which
    collective training steps need; False gives each record exactly once per epoch.
    num_workers > 0 reads and collates in DataLoader worker processes.
    """

    def __init__(
        self,
        paths: Sequence[str | PathLike],
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        length_bins: Sequence[int] | None = None,
        masking: Literal["static", "dynamic"] = "static",
        mask_config: MaskConfig | None = None,
        pad_id: int | None = None,
        pad_to_multiple_of: int = 8,
        max_length: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        even_batches: bool = True,
        num_workers: int = 0,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.dataset = ExamplesDataset(paths)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle, self.drop_last, self.even_batches = shuffle, drop_last, even_batches
        self.num_workers = num_workers
        self.collator = Collator(
            seed=seed,
            masking=masking,
            mask_config=mask_config,
            pad_id=pad_id,
            pad_to_multiple_of=pad_to_multiple_of,
            max_length=max_length,
        )
        if length_bins is None:
            self._group = self.dataset.file_of
        else:
            self._group = length_bin(self.dataset.lengths, length_bins)
        self._groups = [np.flatnonzero(self._group == g) for g in np.unique(self._group)]
        self.epoch = 0
        self._consumed = 0  # batches of self.epoch already yielded

    def _global_batches(self, epoch: int) -> list[np.ndarray]:
        """Every batch of the epoch (all ranks), in the epoch's order."""
        rng = keyed_numpy(self.seed, "loader", epoch)
        batches = []
        for group in self._groups:
            order = rng.permutation(group) if self.shuffle else group
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                if len(batch) < self.batch_size and self.drop_last:
                    continue
                batches.append(batch)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _rank_positions(self, n: int) -> list[int]:
        if self.even_batches and n:
            per_rank = math.ceil(n / self.world_size)
            return [(self.rank + k * self.world_size) % n for k in range(per_rank)]
        return list(range(self.rank, n, self.world_size))

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        per_group = [
            len(g) // self.batch_size if self.drop_last else math.ceil(len(g) / self.batch_size) for g in self._groups
        ]
        return len(self._rank_positions(sum(per_group)))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """The rest of the current epoch; afterwards the loader moves to the next epoch."""
        epoch, start = self.epoch, self._consumed
        batches = self._global_batches(epoch)
        positions = self._rank_positions(len(batches))[start:]
        keys = [[(epoch, p, int(i)) for i in batches[p]] for p in positions]
        if self.num_workers > 0:
            stream = DataLoader(
                _Keyed(self.dataset),
                batch_sampler=keys,
                collate_fn=self.collator,
                num_workers=self.num_workers,
            )
        else:
            keyed = _Keyed(self.dataset)
            stream = (self.collator([keyed[key] for key in batch]) for batch in keys)
        for k, batch in enumerate(stream):
            self._consumed = start + k + 1  # counted before handing over: state_dict is exact
            yield batch
        self.epoch, self._consumed = epoch + 1, 0

    def state_dict(self) -> dict:
        epoch, consumed = self.epoch, self._consumed
        if consumed >= len(self):
            epoch, consumed = epoch + 1, 0
        return {
            "epoch": epoch,
            "batches_consumed": consumed,
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "num_records": len(self.dataset),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = {
            "seed": self.seed,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "num_records": len(self.dataset),
        }
        for key, value in mine.items():
            if state[key] != value:
                raise ValueError(
                    f"loader state has {key}={state[key]} but this loader has {value}; "
                    "resume with the same shards, seed, batch size and world size"
                )
        self.epoch, self._consumed = state["epoch"], state["batches_consumed"]
