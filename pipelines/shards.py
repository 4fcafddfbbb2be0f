"""Shard I/O every stage shares: Arrow IPC files read and written, local copies of remote
files (tokenizers, transformers and the data loader read local paths), and the local
folder of a stage's files (the vocabulary, the exported model). pyarrow is imported by
the functions that read or write Arrow, so the copies serve commands that must start fast."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pipelines.storage import Storage

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 1024
"""Rows per record batch in the shards a stage writes."""


def read_table(storage: Storage, uri: str, columns: list[str] | None = None) -> pa.Table:
    """A whole Arrow shard, or `columns` of it (memory-mapped when local; from an object
    store, only those columns are read)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    local = storage.local_path(uri)
    if local is not None:
        with pa.memory_map(local) as source:
            table = ipc.open_file(source).read_all()
    elif columns:  # only those columns' buffers travel (a work file's metadata, not its text)
        with storage.open(uri, "rb") as handle:
            reader = ipc.open_file(handle)
            names = reader.schema.names
            reader = ipc.open_file(
                handle, options=ipc.IpcReadOptions(included_fields=[names.index(c) for c in columns])
            )
            table = reader.read_all()
    else:
        with storage.open(uri, "rb") as handle:
            table = ipc.open_file(pa.py_buffer(handle.read())).read_all()
    return table.select(columns) if columns else table


def read_batches(storage: Storage, uri: str) -> Iterator[pa.RecordBatch]:
    """Record batches of one Arrow shard, memory-mapped when local (never read whole)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    local = storage.local_path(uri)
    if local is not None:
        with pa.memory_map(local) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    else:
        with storage.open(uri, "rb") as handle:
            reader = ipc.open_file(handle)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


def take_rows(storage: Storage, uri: str, rows: Sequence[int], columns: list[str] | None = None) -> pa.Table:
    """Rows `rows` (in that order) of one Arrow shard, a record batch at a time, stopping
    after the batch that holds the last row asked for: `pa.Table.take` over a whole file
    would first join the chunks of every column, holding all of the file's text in memory
    to keep a few rows of it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    wanted = np.asarray(rows, dtype=np.int64)
    order = np.argsort(wanted, kind="stable")
    ascending = wanted[order]
    local = storage.local_path(uri)
    with pa.memory_map(local) if local is not None else storage.open(uri, "rb") as source:
        reader = ipc.open_file(source)
        schema = reader.schema if columns is None else pa.schema([reader.schema.field(c) for c in columns])
        if len(ascending) and ascending[0] < 0:
            raise IndexError(f"{uri}: row {int(ascending[0])} asked for")
        parts, start, found = [], 0, 0
        for i in range(reader.num_record_batches):
            if found == len(ascending):
                break
            batch = reader.get_batch(i)
            end = start + batch.num_rows
            upto = int(np.searchsorted(ascending, end))
            if upto > found:
                batch = batch.select(columns) if columns is not None else batch
                parts.append(batch.take(pa.array(ascending[found:upto] - start)))
                found = upto
            start = end
        if found < len(ascending):  # every batch was read: `start` is the file's row count
            raise IndexError(f"{uri}: rows {int(ascending[0])}..{int(ascending[-1])} asked of {start}")
        table = pa.Table.from_batches(parts, schema=schema)
    if np.any(order != np.arange(len(order))):  # back to the order asked for
        table = table.take(pa.array(np.argsort(order, kind="stable")))
    return table


def write_table(path: str, table: pa.Table, max_chunksize: int = BATCH_ROWS) -> None:
    """Write `table` to a local Arrow IPC file in record batches of `max_chunksize` rows."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max_chunksize)


def local_copy(storage: Storage, uri: str, cache_key: str) -> str:
    """A local path for `uri`: itself when local, else a download cached under `cache_key`
    (a fingerprint, so new content gets a new copy)."""
    local = storage.local_path(uri)
    if local is not None:
        return local
    cache = os.path.join(tempfile.gettempdir(), "bertpipe-cache", cache_key)
    target = os.path.join(cache, uri.split("://", 1)[-1])
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.{os.getpid()}.part"
        fs, path = storage.fs(uri)
        fs.get_file(path, tmp)
        os.replace(tmp, target)
    return target


def download_into(storage: Storage, uri: str, folder: str) -> str:
    """A local path for `uri`: itself when local, else a download into `folder`, a
    temporary folder of the caller's that goes with everything in it (unlike `local_copy`'s
    cache, which outlives the process)."""
    local = storage.local_path(uri)
    if local is not None:
        return local
    target = os.path.join(folder, uri.split("://", 1)[-1])
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs, path = storage.fs(uri)
        fs.get_file(path, f"{target}.part")  # a download cut off is never taken for the file
        os.replace(f"{target}.part", target)
    return target


def local_folder(storage: Storage, folder_uri: str, names: Sequence[str], cache_key: str) -> str:
    """A local folder holding `names` of the folder at `folder_uri` (the folder itself when local)."""
    paths = [local_copy(storage, f"{folder_uri.rstrip('/')}/{name}", cache_key) for name in names]
    return os.path.dirname(paths[0])
