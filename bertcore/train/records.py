"""The records of examples shards (Arrow IPC files, memory-mapped): one window of the
loader's shards read as arrays of their scalar columns, and the records of one batch
gathered from the list columns (`ExamplesDataset.rows`). The loader (loader.py) decides
which records make a batch; this module only reads them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from torch.utils.data import Dataset


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
    """The records of a list of local examples shards (one window of the loader), gathered
    a batch at a time (`rows`).

    The scalar columns (length, segment_b_start, next_sentence_label) are read up front into
    arrays over the records of these files only; the list columns stay in the files, which
    stay open (memory-mapped) while the dataset lives, so a file deleted from a cache under
    it is still read whole. Item i -> dict (one record, numpy id arrays), for inspection.
    """

    def __init__(self, paths: Sequence[str | PathLike], vocab_size: int | None = None, names: Sequence[str] = ()):
        self.paths = [str(p) for p in paths]
        self.names = list(names) or self.paths
        """What messages call each file (its URI in the store; the local path by default)."""
        self.vocab_size = vocab_size
        """Token ids at or above it are refused, naming the shard, when its file is mapped
        (they would fail deep in the model's embedding with no file named)."""
        lengths, b_starts, labels, file_of, batch_rows, batch_file = [], [], [], [], [], []
        self._sources: list[pa.MemoryMappedFile | None] = []
        for k, path in enumerate(self.paths):
            try:
                source = pa.memory_map(path)
                table = ipc.open_file(source).read_all()
                columns = table.select(["length", "segment_b_start", "next_sentence_label"])
                sizes = [len(chunk) for chunk in table.column("length").chunks]
            except (OSError, pa.ArrowInvalid, KeyError) as exc:
                raise ValueError(f"{self.names[k]}: not a readable examples shard ({exc})") from None
            self._sources.append(source)
            lengths.append(columns.column("length").to_numpy().astype(np.int32))
            b_starts.append(columns.column("segment_b_start").to_numpy())
            labels.append(columns.column("next_sentence_label").to_numpy())
            file_of.append(np.full(table.num_rows, k, dtype=np.int32))
            batch_rows += sizes
            batch_file += [k] * len(sizes)
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int32)
        self.segment_b_start = np.concatenate(b_starts) if b_starts else np.zeros(0, dtype=np.int64)
        self.next_sentence_label = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int8)
        self.file_of = np.concatenate(file_of) if file_of else np.zeros(0, dtype=np.int32)
        # record batches of all files in turn: where each starts (record number), its file
        self.batch_starts = np.concatenate([[0], np.cumsum(batch_rows, dtype=np.int64)]).astype(np.int64)
        self.batch_file = np.asarray(batch_file, dtype=np.int64)
        self._columns: list[_Columns | None] = [None] * len(batch_rows)

    def __len__(self) -> int:
        return len(self.lengths)

    def _map(self, batch: int) -> None:
        """Map the file holding record batch `batch` (all its batches at once)."""
        k = int(self.batch_file[batch])
        first = int(np.searchsorted(self.batch_file, k, side="left"))
        source = self._sources[k]
        if source is None:  # unpickled in another process: open the file again
            source = self._sources[k] = pa.memory_map(self.paths[k])
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            record_batch = reader.get_batch(i)
            columns = _Columns(
                *(_list_column(record_batch, name) for name in ("input_ids", "masked_positions", "masked_ids"))
            )
            if self.vocab_size is not None:
                _check_ids(self.names[k], columns, self.vocab_size)
            self._columns[first + i] = columns

    def rows(self, indices: np.ndarray, masks: bool = True) -> Rows:
        """The records `indices` (record numbers of this dataset), in that order; `masks`:
        gather the stored masked positions and ids too."""
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
            self.lengths[indices].astype(np.int64),
            self.segment_b_start[indices],
            self.next_sentence_label[indices],
            _joined(ids),
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
        state["_columns"] = [None] * len(self._columns)  # memory maps do not pickle; another process reopens
        state["_sources"] = [None] * len(self._sources)
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
