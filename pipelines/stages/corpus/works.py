"""The cleaned work files of a corpus run, in input order, and the order key of their rows.

Work files are named by unit (and batch), units are planned in input order and every task
writes its records in input order, so the work files in name order, row after row, are
the corpus in input order. A document's order key is its position in that sequence:
`offsets[w] + row` for row `row` of work file `w`. The driver keeps one number per work
file, never one per document; tasks turn keys back into (work file, row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

DOCUMENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("title", pa.string()),
        ("sentences", pa.list_(pa.string())),
        ("url", pa.string()),  # web records: the page's URL, crawl date and media type; "" otherwise
        ("crawl_date", pa.string()),
        ("content_type", pa.string()),
        ("language", pa.string()),  # detected ISO 639-1 code ("" when not detected) and its confidence
        ("language_score", pa.float32()),
    ]
)
# What a work unit writes: the documents plus what the driver needs to place them.
WORK_SCHEMA = pa.schema(
    list(DOCUMENT_SCHEMA)
    + [
        ("file", pa.int64()),
        ("major", pa.int64()),
        ("minor", pa.int64()),
        ("seq", pa.int64()),
        ("chars", pa.int64()),
        ("n_sentences", pa.int64()),
        ("content_hash", pa.binary(16)),
        ("signature", pa.binary()),  # MinHash signature, num_perm little-endian uint32 (null without near dedup)
        ("validation", pa.bool_()),
    ]  # the document's split: a hash of its id under corpus.validation_fraction
)

ORDER_COLUMNS = ("file", "major", "minor", "seq")
"""The columns that order a work file's records (input file, offset key, record number)."""


@dataclass(frozen=True)
class Works:
    paths: tuple[str, ...]
    rows: tuple[int, ...]
    failed: tuple[int, ...] = ()
    """Input files with a failed piece: none of their documents is kept."""

    @property
    def offsets(self) -> np.ndarray:
        """Order key of each work file's first row (and the total after the last)."""
        return np.concatenate([[0], np.cumsum(np.asarray(self.rows, dtype=np.int64))])

    @property
    def documents(self) -> int:
        return int(sum(self.rows))

    def __len__(self) -> int:
        return len(self.paths)

    def split(self, keys: np.ndarray) -> list[np.ndarray]:
        """Sorted order keys cut into one array per work file, as rows of that file."""
        offsets = self.offsets
        bounds = np.searchsorted(keys, offsets)
        return [keys[bounds[w] : bounds[w + 1]] - offsets[w] for w in range(len(self))]

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(work file, row) of each order key."""
        offsets = self.offsets
        work = np.searchsorted(offsets, keys, side="right") - 1
        return work, keys - offsets[work]


def check_order(path: str, columns: dict[str, np.ndarray]) -> tuple[list[int], list[int]] | None:
    """The first and last order key of a work file's records, after checking they are in
    input order (the order keys assume it); None for an empty file."""
    keys = [columns[name] for name in ORDER_COLUMNS]
    if len(keys[0]) == 0:
        return None
    order = np.lexsort(keys[::-1])
    if np.any(order != np.arange(len(order))):
        raise RuntimeError(f"{path}: records are not in input order; this is a bertpipe bug, please report it")
    return [int(k[0]) for k in keys], [int(k[-1]) for k in keys]


def check_files_in_order(works: Works, ranges: list[tuple[list[int], list[int]] | None]) -> None:
    """Each work file's records come after the previous file's (their first and last keys)."""
    last, last_path = None, None
    for path, span in zip(works.paths, ranges):
        if span is None:
            continue
        if last is not None and tuple(span[0]) < tuple(last):
            raise RuntimeError(f"{path} starts before the end of {last_path}; this is a bertpipe bug, please report it")
        last, last_path = span[1], path
