"""The corpus stage's shard plan: which documents are kept, their train/validation split, and
the output shards cut in input order at equal character counts.

One `plan_work` task per work file applies the removals to the rows' numeric columns
(characters, sentences, input file, and the split the cleaning task drew from a hash of the
document id) and writes the kept rows with their character counts to
`_dedup/plan-NNNNN.arrow`; it returns per-split totals and per-input-file counts. The driver cuts the shards from those
totals, reading a work file's character counts only where a shard boundary falls in it,
so its memory grows with the number of work files, never with documents. One task per
output shard gathers its documents from the work files. `write_corpus` runs all that
comes after cleaning: dedup (dedup.py), the split, the cut and the shards.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from bertcore.text.config import CorpusConfig
from bertcore.text.dedup import MinHashSpec
from pipelines.ray_runtime import run_tasks
from pipelines.shards import read_table, take_rows, write_table
from pipelines.stage_dir import ShardInfo, StageDir
from pipelines.stages.corpus.dedup import Removals, deduplicate
from pipelines.stages.corpus.works import DOCUMENT_SCHEMA, Works

SPLITS = ("train", "validation")


def plan_path(w: int) -> str:
    return f"_dedup/plan-{w:05d}.arrow"


@dataclass
class WorkPlan:
    """What `plan_work` found in one work file: per split (documents, characters), and per
    input file its kept documents, sentences and characters and what dedup removed."""

    splits: dict[str, list[int]]
    files: dict[int, Counter] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"splits": self.splits, "files": {str(k): dict(v) for k, v in self.files.items()}}

    @classmethod
    def from_json(cls, data: dict) -> WorkPlan:
        return cls(data["splits"], {int(k): Counter(v) for k, v in data["files"].items()})


@ray.remote(num_cpus=1, max_retries=3)
def plan_work(
    w: int, works: Works, exact_rows: np.ndarray, near_rows: np.ndarray, stage: StageDir, fp: str
) -> WorkPlan:
    """The kept rows of work file `w` with their characters and split, and its counts per
    input file."""
    relative = plan_path(w)
    done = stage.done(relative, fp)
    if done is not None:
        return WorkPlan.from_json(done.result)
    table = read_table(stage.storage, stage.path(works.paths[w]), ["file", "chars", "n_sentences", "validation"])
    file = table.column("file").to_numpy()
    counted = ~np.isin(file, works.failed)
    exact = np.zeros(len(file), dtype=bool)
    exact[exact_rows] = True
    near = np.zeros(len(file), dtype=bool)
    near[near_rows] = True
    rows = np.flatnonzero(counted & ~exact & ~near)
    validation = table.column("validation").to_numpy(zero_copy_only=False)[rows]
    chars = table.column("chars").to_numpy()
    sentences = table.column("n_sentences").to_numpy()
    plan = WorkPlan(
        {
            split: [
                int(np.count_nonzero(validation == (split == "validation"))),
                int(chars[rows][validation == (split == "validation")].sum()),
            ]
            for split in SPLITS
        }
    )
    kept = np.zeros(len(file), dtype=bool)
    kept[rows] = True
    ids, inverse = np.unique(file, return_inverse=True)

    def per_file(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(inverse[mask], None if weights is None else weights[mask], minlength=len(ids)).astype(
            np.int64
        )

    figures = {
        "kept": per_file(kept),
        "sentences": per_file(kept, sentences),
        "characters": per_file(kept, chars),
        "duplicate": per_file(exact & counted),
        "near_duplicate": per_file(near & counted),
    }
    for i, f in enumerate(ids):
        if f not in works.failed:
            plan.files[int(f)] = Counter({name: int(values[i]) for name, values in figures.items()})
    columns = {"row": rows, "chars": chars[rows], "validation": validation}
    info = stage.publish(relative, lambda path: write_table(path, pa.table(columns)), rows=len(rows))
    stage.complete(relative, fp, [info], plan.to_json())
    return plan


def _kept(stage: StageDir, w: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows and characters of the documents of `split` kept in work file `w`, in order."""
    table = read_table(stage.storage, stage.path(plan_path(w)))
    mine = table.column("validation").to_numpy(zero_copy_only=False) == (split == "validation")
    return table.column("row").to_numpy()[mine], table.column("chars").to_numpy()[mine]


# -- cutting -------------------------------------------------------------------------------------


class Parts:
    """A sequence of non-negative numbers (documents' characters, in order) held as parts:
    each part's length and sum are known, its values are loaded on demand (`load(part)`),
    so the running total can be searched without holding the sequence."""

    def __init__(self, lengths: list[int], sums: list[int], load: Callable[[int], np.ndarray]):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])
        self.before = np.concatenate([[0], np.cumsum(np.asarray(sums, dtype=np.int64))])
        self._load = load
        self._cache: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, values: np.ndarray) -> Parts:
        values = np.asarray(values)
        return cls([len(values)], [int(values.sum())], lambda _: values)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def total(self) -> int:
        return int(self.before[-1])

    def _cumulative(self, part: int) -> np.ndarray:
        if part not in self._cache:
            self._cache.clear()  # boundaries are searched in order: one part at a time
            self._cache[part] = self.before[part] + np.cumsum(self._load(part))
        return self._cache[part]

    def _part(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, side="right")) - 1

    def cumulative(self, i: int) -> int:
        part = self._part(i)
        return int(self._cumulative(part)[i - self.starts[part]])

    def value(self, i: int) -> int:
        part = self._part(i)
        cumulative = self._cumulative(part)
        local = i - self.starts[part]
        return int(cumulative[local] - (cumulative[local - 1] if local else self.before[part]))

    def searchsorted(self, target: float) -> int:
        """The first index whose running total is at least `target` (len(self) if none)."""
        ends = self.before[1:]
        candidates = np.flatnonzero((ends >= target) & (self.lengths > 0))
        if not len(candidates):
            return len(self)
        part = int(candidates[0])
        return int(self.starts[part] + np.searchsorted(self._cumulative(part), target))


def cut_shards(chars: np.ndarray | Parts, shard_chars: int) -> list[tuple[int, int]]:
    """Contiguous, non-empty [start, end) ranges covering the documents in order, each
    holding about the same number of characters: n = round(total / shard_chars) shards
    (at least one, at most one per document), boundary k placed where the running total
    is nearest to k * total / n."""
    parts = chars if isinstance(chars, Parts) else Parts.of(chars)
    count = len(parts)
    if count == 0:
        return []
    total = parts.total
    n = min(count, max(1, round(total / shard_chars)))
    bounds = [0]
    for k in range(1, n):
        target = k * total / n
        cut = parts.searchsorted(target)
        # choose the side of document `cut` whose running total is nearer the target
        if cut < count:
            running = parts.cumulative(cut)
            if abs(running - target) < abs(running - parts.value(cut) - target):
                cut += 1
        # leave at least one document for this shard and each one after it
        bounds.append(min(max(cut, bounds[-1] + 1), count - (n - k)))
    bounds.append(count)
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


Job = tuple[str, list[tuple[int, str, int, int]]]
"""An output shard's path and its pieces: (work file, split, first, end) in kept-row order."""


def shard_jobs(stage: StageDir, plans: list[WorkPlan], shard_chars: int) -> list[Job]:
    jobs: list[Job] = []
    for split in SPLITS:
        lengths = [p.splits[split][0] for p in plans]
        parts = Parts(lengths, [p.splits[split][1] for p in plans], lambda w, split=split: _kept(stage, w, split)[1])
        for index, (start, end) in enumerate(cut_shards(parts, shard_chars)):
            pieces = []
            for w in range(len(plans)):
                lo, hi = max(start, parts.starts[w]), min(end, parts.starts[w + 1])
                if lo < hi:
                    pieces.append((w, split, int(lo - parts.starts[w]), int(hi - parts.starts[w])))
            jobs.append((f"{split}/part-{index:05d}.arrow", pieces))
    return jobs


@ray.remote(num_cpus=1, max_retries=3)
def write_output_shard(
    relative: str, pieces: list[tuple[int, str, int, int]], works: Works, names: list[str], stage: StageDir, fp: str
) -> ShardInfo:
    """Gather a shard's documents (kept rows of work files), in order, into one file."""
    done = stage.done(relative, fp)
    if done is not None:
        return done.shards[0]
    tables = []
    for w, split, start, end in pieces:
        rows, _ = _kept(stage, w, split)
        tables.append(take_rows(stage.storage, stage.path(works.paths[w]), rows[start:end], names))
    table = pa.concat_tables(tables).combine_chunks()
    chars = int(pc.sum(pc.utf8_length(pc.list_flatten(table.column("sentences")))).as_py() or 0)
    sentences = int(pc.sum(pc.list_value_length(table.column("sentences"))).as_py() or 0)
    return stage.write_shard(
        relative,
        fp,
        lambda path: write_table(path, table),
        rows=table.num_rows,
        extra={"chars": chars, "sentences": sentences},
    )


# -- everything after cleaning --------------------------------------------------------------------


@dataclass
class Written:
    removals: Removals
    plans: list[WorkPlan]
    shards: list[ShardInfo]
    timings: dict[str, float]


def write_corpus(
    stage: StageDir, works: Works, corpus: CorpusConfig, minhash: MinHashSpec | None, fp: str, parallelism: int | None
) -> Written:
    """Everything after cleaning: remove duplicates, split, cut and write the output shards,
    and drop what an earlier run with other settings left. Timings are wall seconds and the
    driver's own CPU seconds per phase."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    removals = deduplicate(stage, works, minhash, fp, parallelism)
    t_dedup, cpu_dedup = time.perf_counter() - t0, time.process_time() - cpu0

    t0, cpu0 = time.perf_counter(), time.process_time()
    shared = ray.put(works)
    exact, near = works.split(removals.exact), works.split(removals.near)
    plans = run_tasks(
        lambda w: plan_work.remote(w, shared, exact[w], near[w], stage, fp),
        range(len(works)),
        parallelism=parallelism,
        desc="corpus: split",
        unit="work files",
    )
    jobs = shard_jobs(stage, plans, corpus.shard_chars)
    t_plan, cpu_plan = time.perf_counter() - t0, time.process_time() - cpu0

    t0 = time.perf_counter()
    shards: list[ShardInfo] = run_tasks(
        lambda job: write_output_shard.remote(job[0], job[1], shared, list(DOCUMENT_SCHEMA.names), stage, fp),
        jobs,
        parallelism=parallelism,
        desc="corpus: shards",
        rows=lambda shard: shard.rows,
    )
    t_write = time.perf_counter() - t0
    keep = {s.path for s in shards} | set(works.paths) | set(removals.files) | {plan_path(w) for w in range(len(works))}
    stage.remove_except([*SPLITS, "_work", "_dedup"], keep)
    timings = {
        "dedup_s": t_dedup,
        "plan_s": t_plan,
        "write_s": t_write,
        "driver_cpu_dedup_s": cpu_dedup,
        "driver_cpu_plan_s": cpu_plan,
    }
    return Written(removals, plans, shards, {k: round(v, 3) for k, v in timings.items()})
