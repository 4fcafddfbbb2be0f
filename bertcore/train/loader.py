"""Training data loader over examples shards (Arrow IPC files, opened memory-mapped).

Per epoch: records are grouped by length bin (or by file when no bins are given), shuffled
within each group, cut into batches, and the batches shuffled, all keyed by (seed, epoch);
data-parallel rank r takes global batches r, r + W, r + 2W, ... Every rank therefore sees
each record of its batches once, the ranks together see every record once per epoch, and
a batch never mixes length bins, so padding stays small.

A batch is a dict of tensors:
    input_ids           (B, T) long   padded with [PAD] to a multiple of 8
    token_type_ids      (B, T) long   0 before segment_b_start, 1 from there to the end
                                      (all 0 with token_types=False: RoBERTa has one type)
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
from dataclasses import dataclass
from os import PathLike
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch
from torch.utils.data import DataLoader, Dataset

from bertcore.examples.config import length_bin
from bertcore.examples.masking import MaskConfig, mask_batch
from bertcore.rng import keyed_numpy, keyed_seed

IGNORE_INDEX = -100


@dataclass
class _Columns:
    """One record batch of a shard: its list columns as (offsets, values) numpy views of the
    map (offsets as memoryviews: indexing one gives a Python int, which is what slicing
    wants, several times faster than a numpy scalar)."""

    ids: tuple[memoryview, np.ndarray]
    positions: tuple[memoryview, np.ndarray]
    masked_ids: tuple[memoryview, np.ndarray]


def _list_column(batch: pa.RecordBatch, name: str) -> tuple[memoryview, np.ndarray]:
    array = batch.column(name)
    return memoryview(array.offsets.to_numpy()), array.values.to_numpy(zero_copy_only=False)


@dataclass
class Rows:
    """The records of one batch, gathered: scalars per record, list columns back to back."""

    lengths: np.ndarray  # (B,) int64
    segment_b_start: np.ndarray  # (B,)
    next_sentence_label: np.ndarray  # (B,) int8
    ids: np.ndarray  # (sum of lengths,) every record's input_ids in turn
    mask_counts: np.ndarray | None = None  # (B,) stored masked positions per record (static)
    positions: np.ndarray | None = None  # (sum of mask_counts,)
    masked_ids: np.ndarray | None = None  # (sum of mask_counts,)


class ExamplesDataset(Dataset):
    """Records of a list of local examples shards, gathered a batch at a time (`rows`).

    The scalar columns (length, segment_b_start, next_sentence_label) are read up front into
    arrays over all records; the list columns stay in the files, which are mapped lazily in
    each process that reads (DataLoader workers included). Item i -> dict (one record, numpy
    id arrays), for inspection.
    """

    def __init__(self, paths: Sequence[str | PathLike], vocab_size: int | None = None):
        self.paths = [str(p) for p in paths]
        self.vocab_size = vocab_size
        """Token ids at or above it are refused, naming the shard, when its file is mapped
        (they would fail deep in the model's embedding with no file named)."""
        lengths, b_starts, labels, file_of, batch_rows, batch_file = [], [], [], [], [], []
        for k, path in enumerate(self.paths):
            try:
                table = ipc.open_file(pa.memory_map(path)).read_all()
                columns = table.select(["length", "segment_b_start", "next_sentence_label"])
                sizes = [len(chunk) for chunk in table.column("length").chunks]
            except (OSError, pa.ArrowInvalid, KeyError) as exc:
                raise ValueError(f"{path}: not a readable examples shard ({exc})") from None
            lengths.append(columns.column("length").to_numpy().astype(np.int64))
            b_starts.append(columns.column("segment_b_start").to_numpy())
            labels.append(columns.column("next_sentence_label").to_numpy())
            file_of.append(np.full(table.num_rows, k, dtype=np.int64))
            batch_rows += sizes
            batch_file += [k] * len(sizes)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        self.segment_b_start = np.concatenate(b_starts) if b_starts else np.zeros(0, dtype=np.int64)
        self.next_sentence_label = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int8)
        self.file_of = np.concatenate(file_of) if file_of else np.zeros(0, dtype=np.int64)
        # record batches of all files in turn: where each starts (global record number), its file
        self.batch_starts = np.concatenate([[0], np.cumsum(batch_rows, dtype=np.int64)]).astype(np.int64)
        self.batch_file = np.asarray(batch_file, dtype=np.int64)
        self._columns: list[_Columns | None] = [None] * len(batch_rows)

    def __len__(self) -> int:
        return len(self.lengths)

    def _map(self, batch: int) -> None:
        """Map the file holding record batch `batch` (all its batches at once)."""
        k = int(self.batch_file[batch])
        first = int(np.searchsorted(self.batch_file, k, side="left"))
        # The numpy views keep the mapping alive after the file is closed (here, not at garbage
        # collection), so an epoch over thousands of shards holds no descriptor per shard.
        with pa.memory_map(self.paths[k]) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                record_batch = reader.get_batch(i)
                columns = _Columns(
                    *(_list_column(record_batch, name) for name in ("input_ids", "masked_positions", "masked_ids"))
                )
                if self.vocab_size is not None:
                    _check_ids(self.paths[k], columns, self.vocab_size)
                self._columns[first + i] = columns

    def rows(self, indices: np.ndarray, masks: bool = True) -> Rows:
        """The records `indices` (global record numbers), in that order; `masks`: gather the
        stored masked positions and ids too."""
        indices = np.asarray(indices, dtype=np.int64)
        batch = np.searchsorted(self.batch_starts, indices, side="right") - 1
        row = indices - self.batch_starts[batch]
        ids, positions, masked = [], [], []
        columns = self._columns
        for b, r in zip(batch.tolist(), row.tolist()):
            c = columns[b]
            if c is None:
                self._map(b)
                c = columns[b]
            offsets, values = c.ids
            ids.append(values[offsets[r] : offsets[r + 1]])
            if masks:
                offsets, values = c.positions
                positions.append(values[offsets[r] : offsets[r + 1]])
                offsets, values = c.masked_ids
                masked.append(values[offsets[r] : offsets[r + 1]])
        out = Rows(
            self.lengths[indices], self.segment_b_start[indices], self.next_sentence_label[indices], _joined(ids)
        )
        if masks:
            out.mask_counts = np.fromiter(map(len, positions), dtype=np.int64, count=len(positions))
            out.positions, out.masked_ids = _joined(positions), _joined(masked)
        return out

    def __getitem__(self, index: int) -> dict:
        rows = self.rows(np.asarray([index]))
        return {
            "input_ids": rows.ids,
            "masked_positions": rows.positions,
            "masked_ids": rows.masked_ids,
            "segment_b_start": int(rows.segment_b_start[0]),
            "next_sentence_label": int(rows.next_sentence_label[0]),
            "length": int(rows.lengths[0]),
        }

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_columns"] = [None] * len(self._columns)  # memory maps do not pickle; workers reopen
        return state


def _check_ids(path: str, columns: _Columns, vocab_size: int) -> None:
    for name, (_, values) in (("input_ids", columns.ids), ("masked_ids", columns.masked_ids)):
        if not values.size:
            continue
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= vocab_size:
            bad = high if high >= vocab_size else low
            raise ValueError(
                f"{path}: {name} holds token id {bad}, outside this run's vocabulary of {vocab_size} entries "
                "(a shard made with another vocabulary?)"
            )


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


class Collator:
    """Gathered records -> padded tensors (see the module docstring), numpy for the whole
    batch at once."""

    def __init__(
        self,
        *,
        seed: int,
        masking: Literal["static", "dynamic"] = "static",
        mask_config: MaskConfig | None = None,
        pad_id: int | None = None,
        pad_to_multiple_of: int = 8,
        max_length: int | None = None,
        token_types: bool = True,
    ):
        if masking == "dynamic" and mask_config is None:
            raise ValueError("dynamic masking needs a mask_config")
        if pad_id is None:
            if mask_config is None:
                raise ValueError("give pad_id or a mask_config (which knows [PAD])")
            pad_id = mask_config.vocab.special.pad
        self.seed, self.masking, self.mask_config = seed, masking, mask_config
        self.pad_id, self.multiple, self.max_length = pad_id, pad_to_multiple_of, max_length
        self.token_types = token_types
        if mask_config is not None:
            self._never = np.zeros(mask_config.vocab_size, dtype=bool)  # (V,) never a target
            self._never[sorted(mask_config.never_masked)] = True

    def __call__(self, rows: Rows, epoch: int, batch_index: int) -> dict[str, torch.Tensor]:
        lengths = rows.lengths  # (B,)
        longest = int(lengths.max())
        T = math.ceil(longest / self.multiple) * self.multiple
        if self.max_length is not None:
            T = max(longest, min(T, self.max_length))
        B = len(lengths)
        position = np.arange(T)
        real = position < lengths[:, None]  # (B, T) real tokens, in row-major order as rows.ids
        input_ids = np.full((B, T), self.pad_id, dtype=np.int64)
        input_ids[real] = rows.ids
        labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
        if self.masking == "static":
            if not rows.mask_counts.any():
                # Static records always have at least one target (the quota is >= 1).
                raise ValueError(
                    "these examples carry no stored masks (written with dynamic masking): use masking='dynamic'"
                )
            labels[np.repeat(np.arange(B), rows.mask_counts), rows.positions] = rows.masked_ids
        token_type_ids = (position >= rows.segment_b_start[:, None]) & real & self.token_types
        nsp = rows.next_sentence_label.astype(np.int64)
        nsp[nsp < 0] = IGNORE_INDEX
        out = {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids.astype(np.int64)),
            "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "labels": torch.from_numpy(labels),
            "next_sentence_label": torch.from_numpy(nsp),
        }
        if self.masking == "dynamic":
            cfg = self.mask_config
            special_mask = torch.from_numpy(self._never[input_ids] | ~real)
            continuation = torch.from_numpy(cfg.vocab.is_continuation[input_ids] & real)
            generator = torch.Generator().manual_seed(keyed_seed(self.seed, "dynamic-mask", epoch, batch_index) >> 1)
            out["input_ids"], out["labels"] = mask_batch(out["input_ids"], special_mask, continuation, generator, cfg)
        return out


class _Batches(Dataset):
    """Item (epoch, global batch index, record numbers) -> the collated batch: what a
    DataLoader worker computes."""

    def __init__(self, dataset: ExamplesDataset, collator: Collator):
        self.dataset, self.collator = dataset, collator

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, np.ndarray]) -> dict[str, torch.Tensor]:
        epoch, batch_index, indices = key
        rows = self.dataset.rows(indices, masks=self.collator.masking == "static")
        return self.collator(rows, epoch, batch_index)


class ExamplesLoader:
    """Batches of examples shards for one data-parallel rank; resumable mid-epoch.

    paths: local examples shard files (all ranks pass the same list). length_bins: batch
    within these length bins (None: within each file, which the examples stage already
    groups by bin). even_batches: every rank gets the same number of batches per epoch
    (ranks short of one repeat a batch from the start of the epoch's order), which
    collective training steps need; False gives each record exactly once per epoch.
    num_workers > 0 reads and collates in DataLoader worker processes. The other keyword
    arguments (masking, mask_config, pad_id, pad_to_multiple_of, max_length, token_types)
    are the Collator's, which turns the records into tensors.
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
        shuffle: bool = True,
        drop_last: bool = False,
        even_batches: bool = True,
        num_workers: int = 0,
        vocab_size: int | None = None,
        **collate: Any,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.dataset = ExamplesDataset(paths, vocab_size)
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.shuffle, self.drop_last, self.even_batches = shuffle, drop_last, even_batches
        self.num_workers = num_workers
        self.collator = Collator(seed=seed, **collate)
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
        keys = [(epoch, p, batches[p]) for p in positions]
        collate = _Batches(self.dataset, self.collator)
        if self.num_workers > 0:
            stream = DataLoader(collate, sampler=keys, batch_size=None, num_workers=self.num_workers)
        else:
            stream = (collate[key] for key in keys)
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
        """Resume where `state` stopped; a state of another world size resumes too when the
        batches the ranks consumed together split evenly over this one's ranks (global
        batches go round-robin, so W ranks after k batches each have consumed the first
        W x k batches of the epoch)."""
        mine = {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_records": len(self.dataset),
        }
        for key, value in mine.items():
            if state[key] != value:
                raise ValueError(
                    f"loader state has {key}={state[key]} but this loader has {value}; "
                    "resume with the same shards, seed and batch size"
                )
        consumed = state["batches_consumed"]
        if state["world_size"] != self.world_size:
            together = consumed * state["world_size"]
            if together % self.world_size:
                raise ValueError(
                    f"loader state of {state['world_size']} ranks at {consumed} batches each does not split "
                    f"over {self.world_size} ranks"
                )
            consumed = together // self.world_size
        self.epoch, self._consumed = state["epoch"], consumed
