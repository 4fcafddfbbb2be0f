"""Partitioned files: how the corpus stage's dedup tasks hand records to one another.

A map task writes one Arrow IPC file whose record batch p holds the records of partition
p (empty batches included, so batch p is partition p in every file); a reduce task reads
batch p of every map file. Only the batches asked for are read (memory-mapped locally, by
range from an object store), so a reducer's memory is its partition, and the files stay
one per map task however many partitions there are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from pipelines.storage import Storage


def write_partitioned(path: str, columns: dict[str, np.ndarray], partition: np.ndarray, n: int) -> None:
    """Write `columns` (equal-length numpy arrays) to a local IPC file as `n` record
    batches, batch p holding the rows whose `partition` is p, in their given order."""
    order = np.argsort(partition, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(partition, minlength=n))])
    ordered = {name: values[order] for name, values in columns.items()}
    schema = pa.schema([(name, pa.from_numpy_dtype(values.dtype)) for name, values in ordered.items()])
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, schema) as writer:
        for p in range(n):
            lo, hi = bounds[p], bounds[p + 1]
            writer.write_batch(pa.record_batch([pa.array(values[lo:hi]) for values in ordered.values()], schema=schema))


def read_partition(storage: Storage, uris: Sequence[str], p: int) -> dict[str, np.ndarray]:
    """Partition `p` of every file, concatenated in the files' order, as numpy columns."""
    parts: dict[str, list[np.ndarray]] = {}
    for uri in uris:
        local = storage.local_path(uri)
        with pa.memory_map(local) if local is not None else storage.open(uri, "rb") as source:
            reader = ipc.open_file(source)
            if reader.num_record_batches <= p:
                raise ValueError(f"{uri}: {reader.num_record_batches} partitions, partition {p} asked for")
            batch = reader.get_batch(p)
            for name, column in zip(batch.schema.names, batch.columns):
                # copied out before the file (or its memory map) closes
                parts.setdefault(name, []).append(np.array(column.to_numpy(zero_copy_only=False), copy=True))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def fixed_width(column: pa.ChunkedArray | pa.Array, width: int, dtype: str) -> np.ndarray:
    """A binary column whose values all have `width` bytes as an (n, width / itemsize)
    numpy array, without a Python object per value."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(array)
    if n == 0:
        return np.empty((0, width // np.dtype(dtype).itemsize), dtype=dtype)
    if pa.types.is_fixed_size_binary(array.type):
        data = array.buffers()[1]
        raw = np.frombuffer(data, dtype=np.uint8)[array.offset * width : (array.offset + n) * width]
    else:
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset : array.offset + n + 1]
        if np.any(np.diff(offsets) != width):
            raise ValueError(f"expected every value to have {width} bytes")
        raw = np.frombuffer(array.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return raw.view(dtype).reshape(n, -1).copy()
