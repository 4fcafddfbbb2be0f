"""The corpus stage's duplicate removal, partitioned over Ray tasks.

The driver never sees a document. Every step is a task over a part of the corpus, and what
comes back to the driver is counts and the order keys of the documents to remove
(pipelines/stages/corpus/works.py: a document's position in input order):

    index   per work file, one read: (content hash, key) of each document into partitions
            by hash; with near dedup the LSH band keys of its MinHash signature (computed by
            the cleaning task) into partitions by band key
    group   one task per partition, exact and near partitions side by side:
            exact   sort by (hash, key); every key but a hash's first is a duplicate
            near    sort by (band, key, order key); pair each bucket's members with its first
                    member and their predecessor (bertcore.text.dedup.bucket_pairs); keep the
                    pairs whose full signatures reach the threshold (read from the work
                    files, for the candidates only)
    driver          the rule (corpus.near_dedup_rule) over the similar pairs, the duplicates
                    and not the corpus: `first` removes a document similar to an earlier
                    kept one, walking in input order; `connected` keeps the first document
                    of each connected group (union-find)

A task's output is a file under `_dedup/` with a completion marker, so a retried task or a
rerun of the stage redoes only what is missing; the partition counts depend only on the
number of documents, so the output is the same for any number of workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import ray

from bertcore.text.dedup import MinHashSpec, band_keys, bucket_pairs, losers, similar
from pipelines.ray_runtime import run_tasks
from pipelines.shards import read_table, take_rows, write_table
from pipelines.stage_dir import StageDir
from pipelines.stages.corpus.shuffle import (
    fixed_width,
    read_partition,
    write_partitioned,
)
from pipelines.stages.corpus.works import (
    ORDER_COLUMNS,
    Works,
    check_files_in_order,
    check_order,
)

EXACT_PER_PARTITION = 1_000_000
"""Records (24 bytes each) per exact-dedup partition: what one group task sorts."""
NEAR_PER_PARTITION = 1_000_000
"""Band records (17 bytes each, one per band per document) per near-dedup partition."""
MIN_PARTITIONS = 4
MAX_PARTITIONS = 4096


def partitions_for(records: int, per_partition: int) -> int:
    """How many partitions `records` records are cut into: a function of the corpus alone,
    never of the number of workers, so reruns find their partitions' markers."""
    return min(MAX_PARTITIONS, max(MIN_PARTITIONS, math.ceil(records / per_partition)))


@dataclass
class Removals:
    """Order keys (sorted) of the documents each rule removes."""

    exact: np.ndarray
    near: np.ndarray
    candidates: int = 0
    """Candidate pairs the LSH buckets proposed (near dedup)."""
    similar_pairs: int = 0
    """Of those, the pairs whose signatures reach the threshold."""
    files: list[str] = field(default_factory=list)
    """What the steps wrote under _dedup/."""


# -- index ---------------------------------------------------------------------------------------


def index_path(kind: str, w: int) -> str:
    """What the index step writes for work file `w`: `exact` or `near` partitioned records."""
    return f"_dedup/{kind}-index-{w:05d}.arrow"


def group_path(kind: str, p: int) -> str:
    """What the group step writes for partition `p`: `exact` removals or `near` similar pairs."""
    return f"_dedup/{kind}-{p:05d}.arrow"


@dataclass(frozen=True)
class Layout:
    """Partitions of each kind (near: 0 without near dedup); a function of the corpus alone,
    never of the number of workers, so reruns find their partitions' markers."""

    exact: int
    near: int

    @classmethod
    def of(cls, works: Works, spec: MinHashSpec | None) -> Layout:
        near = partitions_for(works.documents * spec.bands[0], NEAR_PER_PARTITION) if spec else 0
        return cls(partitions_for(works.documents, EXACT_PER_PARTITION), near)


def _signatures(table: pa.Table, spec: MinHashSpec) -> np.ndarray:
    return fixed_width(table.column("signature"), spec.num_perm * 4, "<u4")


@ray.remote(num_cpus=1, max_retries=3)
def index_work(w: int, works: Works, layout: Layout, spec: MinHashSpec | None, stage: StageDir, fp: str) -> dict:
    """Work file `w` read once: its hash records and its band records; returns its first and
    last input-order key."""
    unit = f"_dedup/index-{w:05d}"
    done = stage.done(unit, fp)
    if done is not None:
        return done.result
    path = works.paths[w]
    columns = [*ORDER_COLUMNS, "content_hash", *(["signature"] if spec else [])]
    table = read_table(stage.storage, stage.path(path), columns)
    span = check_order(path, {name: table.column(name).to_numpy() for name in ORDER_COLUMNS})
    file = table.column("file").to_numpy()
    rows = np.flatnonzero(~np.isin(file, works.failed))
    keys = works.offsets[w] + rows
    hashes = fixed_width(table.column("content_hash"), 16, "<u8")[rows]  # (n, 2)
    infos = [
        _write(
            stage,
            index_path("exact", w),
            {"h1": hashes[:, 0], "h2": hashes[:, 1], "key": keys},
            layout.exact,
            hashes[:, 0] % np.uint64(layout.exact),
        )
    ]
    if spec is not None:
        bands, per_band = spec.bands
        buckets = band_keys(_signatures(table.take(pa.array(rows)), spec), bands, per_band).ravel()  # (n * bands,)
        band = {
            "band": np.tile(np.arange(bands, dtype=np.uint8), len(rows)),
            "bucket": buckets,
            "key": np.repeat(keys, bands),
        }
        infos.append(_write(stage, index_path("near", w), band, layout.near, buckets % np.uint64(layout.near)))
    stage.complete(unit, fp, infos, {"span": span})
    return {"span": span}


def _write(
    stage: StageDir,
    relative: str,
    columns: dict[str, np.ndarray],
    partitions: int | None = None,
    partition: np.ndarray | None = None,
):
    """Publish one output file (one record batch per partition when partitioned)."""
    rows = len(next(iter(columns.values())))
    if partitions is None:
        return stage.publish(relative, lambda path: write_table(path, pa.table(columns)), rows=rows)
    return stage.publish(
        relative, lambda path: write_partitioned(path, columns, partition.astype(np.int64), partitions), rows=rows
    )


# -- group ---------------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def exact_group(p: int, maps: list[str], stage: StageDir, fp: str) -> int:
    """Partition `p`: every document whose hash an earlier document (in input order) has."""
    relative = group_path("exact", p)
    done = stage.done(relative, fp)
    if done is not None:
        return done.result
    records = read_partition(stage.storage, [stage.path(m) for m in maps], p)
    h1, h2, key = records["h1"], records["h2"], records["key"]
    order = np.lexsort((key, h2, h1))
    h1, h2, key = h1[order], h2[order], key[order]
    repeat = np.zeros(len(key), dtype=bool)
    repeat[1:] = (h1[1:] == h1[:-1]) & (h2[1:] == h2[:-1])
    removed = np.sort(key[repeat])
    stage.complete(relative, fp, [_write(stage, relative, {"key": removed})], int(len(removed)))
    return int(len(removed))


def _signatures_of(stage: StageDir, works: Works, keys: np.ndarray, spec: MinHashSpec) -> np.ndarray:
    """(len(keys), num_perm) signatures of sorted order keys, read from their work files."""
    out = np.empty((len(keys), spec.num_perm), dtype=np.uint32)
    work, row = works.locate(keys)
    for w in np.unique(work):
        at = np.flatnonzero(work == w)
        out[at] = _signatures(take_rows(stage.storage, stage.path(works.paths[w]), row[at], ["signature"]), spec)
    return out


@ray.remote(num_cpus=1, max_retries=3)
def near_group(p: int, maps: list[str], works: Works, spec: MinHashSpec, stage: StageDir, fp: str) -> dict:
    """Partition `p`: the candidate pairs of its buckets, and those whose signatures are
    similar enough (written)."""
    relative = group_path("near", p)
    done = stage.done(relative, fp)
    if done is not None:
        return done.result
    records = read_partition(stage.storage, [stage.path(m) for m in maps], p)
    order = np.lexsort((records["key"], records["bucket"], records["band"]))
    a, b = bucket_pairs(records["band"][order], records["bucket"][order], records["key"][order])
    del records, order
    involved = np.unique(np.concatenate([a, b]))
    signatures = _signatures_of(stage, works, involved, spec)
    ok = similar(signatures[np.searchsorted(involved, a)], signatures[np.searchsorted(involved, b)], spec.threshold)
    result = {"candidates": int(len(a)), "similar": int(ok.sum())}
    stage.complete(relative, fp, [_write(stage, relative, {"a": a[ok], "b": b[ok]})], result)
    return result


# -- the driver's part ---------------------------------------------------------------------------


def _read_keys(stage: StageDir, relatives: list[str], *columns: str) -> list[np.ndarray]:
    """`columns` of the files `relatives`, concatenated; each file read once."""
    tables = [read_table(stage.storage, stage.path(r), list(columns)) for r in relatives]
    return [
        np.concatenate([t.column(c).to_numpy() for t in tables]) if tables else np.empty(0, dtype=np.int64)
        for c in columns
    ]


def deduplicate(stage: StageDir, works: Works, spec: MinHashSpec | None, fp: str, parallelism: int | None) -> Removals:
    """Exact and (with `spec`) near duplicates of the documents in `works`.

    Exact copies go through the near pass too: they share their first copy's signature, so
    they pair with whatever it pairs with, and they leave the near removals again at the
    end (an exact copy counts as a duplicate, not a near duplicate)."""
    shared, layout = ray.put(works), Layout.of(works, spec)
    spans = run_tasks(
        lambda w: index_work.remote(w, shared, layout, spec, stage, fp),
        range(len(works)),
        parallelism=parallelism,
        desc="corpus: duplicates, indexing",
        unit="work files",
    )
    check_files_in_order(works, [s["span"] for s in spans])
    exact_maps = [index_path("exact", w) for w in range(len(works))]
    near_maps = [index_path("near", w) for w in range(len(works))] if spec else []
    groups = [("exact", p) for p in range(layout.exact)] + [("near", p) for p in range(layout.near)]

    def submit(group: tuple[str, int]):
        kind, p = group
        if kind == "exact":
            return exact_group.remote(p, exact_maps, stage, fp)
        return near_group.remote(p, near_maps, shared, spec, stage, fp)

    counts = run_tasks(submit, groups, parallelism=parallelism, desc="corpus: duplicates, grouping", unit="partitions")
    exact_files = [group_path("exact", p) for p in range(layout.exact)]
    near_files = [group_path("near", p) for p in range(layout.near)]
    (exact,) = _read_keys(stage, exact_files, "key")
    exact.sort()
    removals = Removals(
        exact=exact, near=np.empty(0, dtype=np.int64), files=[*exact_maps, *near_maps, *exact_files, *near_files]
    )
    if spec is not None:
        a, b = _read_keys(stage, near_files, "a", "b")
        removals.near = np.setdiff1d(losers(a, b, spec.rule), exact, assume_unique=True)
        near_counts = counts[layout.exact :]
        removals.candidates = sum(c["candidates"] for c in near_counts)
        removals.similar_pairs = sum(c["similar"] for c in near_counts)
    return removals
