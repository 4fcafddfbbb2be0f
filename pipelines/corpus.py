"""Corpus stage: raw files -> cleaned, sentence-split, deduplicated Arrow shards.

Ray shape: one task per work unit (a file, or one of the `ceil(size / split_bytes)` parts
that share a large file), each writing its cleaned documents to `_work/`; the driver then
decides duplicates, the train/validation split and the shard boundaries from small
per-document metadata, and one task per output shard gathers the documents and writes
`{train,validation}/part-NNNNN.arrow`.

Output order and boundaries depend only on the inputs and the config, never on the number
of workers: documents keep their input order (file, byte offset), exact duplicates keep
the first occurrence, and shards are cut in that order at equal character counts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import posixpath
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from bertcore.errors import InputDataError
from bertcore.rng import stable_fraction
from bertcore.text.clean import Cleaned, clean_document
from bertcore.text.config import CorpusConfig, InputSpec
from bertcore.text.dedup import content_hash, minhash_signature, near_duplicates
from bertcore.text.records import InputError, detect_format, iter_raw_documents
from pipelines.progress import size
from pipelines.ray_runtime import run_tasks
from pipelines.shards import read_table, write_table
from pipelines.stage import External, Output, ShardInfo, Stage, StageDir, StageRun
from pipelines.storage import Storage

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")

DOCUMENT_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source", pa.string()),
        ("title", pa.string()),
        ("sentences", pa.list_(pa.string())),
    ]
)
# What a work unit writes: the documents plus what the driver needs to place them.
WORK_SCHEMA = pa.schema(
    list(DOCUMENT_SCHEMA)
    + [("offset", pa.int64()), ("seq", pa.int64()), ("chars", pa.int64()), ("n_sentences", pa.int64()), ("content_hash", pa.binary(16))]
)


@dataclass(frozen=True)
class Unit:
    """One Ray task's share of the input: part `part` of `n_parts` of one file."""

    index: int
    file_index: int
    uri: str
    spec: InputSpec
    source: str
    part: int
    n_parts: int

    @property
    def work_path(self) -> str:
        return f"_work/unit-{self.index:05d}.arrow"


@dataclass
class UnitResult:
    unit: int
    read: int = 0
    dropped: Counter = field(default_factory=Counter)
    skipped: str | None = None


def doc_id(source: str, uri: str, title: str) -> str:
    """Stable id: hash of the source label, the file name and the title (or record key)."""
    key = "\x1f".join([source, posixpath.basename(uri), title])
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


# -- planning --------------------------------------------------------------------------------


def list_inputs(cfg: CorpusConfig, storage: Storage) -> tuple[list[tuple[InputSpec, str, str, dict]], list[dict]]:
    """Expand the inputs: (spec, source label, uri, {size, version}) per file, plus the
    inputs that matched nothing when `on_error: skip`."""
    files, skipped = [], []
    for position, spec in enumerate(cfg.inputs):
        try:
            matches = storage.glob(spec.uri)
        except (FileNotFoundError, PermissionError, OSError) as exc:
            matches, reason = [], f"cannot list {spec.uri}: {exc}"
        else:
            reason = f"no file matches {spec.uri}"
        if not matches:
            if cfg.on_error == "raise":
                raise InputDataError(f"corpus.inputs[{position}]: {reason} (check the path, bucket and credentials)")
            skipped.append({"file": spec.uri, "reason": reason})
            continue
        source = spec.name or posixpath.basename(spec.uri.rstrip("/")) or spec.uri
        for uri in matches:
            info = storage.info(uri)
            version = info.get("ETag") or info.get("mtime") or info.get("LastModified")
            files.append((spec, source, uri, {"size": int(info.get("size") or 0), "version": str(version)}))
    return files, skipped


def plan_units(cfg: CorpusConfig, files: list[tuple[InputSpec, str, str, dict]]) -> list[Unit]:
    units = []
    for file_index, (spec, source, uri, meta) in enumerate(files):
        n_parts = max(1, math.ceil(meta["size"] / cfg.split_bytes))
        for part in range(n_parts):
            units.append(Unit(len(units), file_index, uri, spec, source, part, n_parts))
    return units


def cut_shards(chars: np.ndarray, shard_chars: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges over documents in order, each holding about the same
    number of characters: n = round(total / shard_chars) shards (at least one), boundary k
    placed where the running total is nearest to k * total / n."""
    total = int(chars.sum())
    if len(chars) == 0:
        return []
    n = max(1, round(total / shard_chars))
    cumulative = np.cumsum(chars)
    bounds = [0]
    for k in range(1, n):
        target = k * total / n
        cut = int(np.searchsorted(cumulative, target))
        # choose the side of document `cut` whose running total is nearer the target
        if cut < len(chars) and abs(cumulative[cut] - target) < abs(cumulative[cut] - chars[cut] - target):
            cut += 1
        cut = min(max(cut, bounds[-1] + 1), len(chars) - (n - k))
        bounds.append(cut)
    bounds.append(len(chars))
    return [(bounds[i], bounds[i + 1]) for i in range(n) if bounds[i + 1] > bounds[i]]


# -- Ray tasks -------------------------------------------------------------------------------


def _open_decompressed(storage: Storage, uri: str):
    return storage.open(uri, "rb", compression="infer")


def _format_of(storage: Storage, unit: Unit) -> str:
    if unit.spec.format != "auto":
        return unit.spec.format
    with _open_decompressed(storage, unit.uri) as stream:
        head = stream.read(4096)
    return detect_format(posixpath.basename(unit.uri), head)


@ray.remote(num_cpus=1, max_retries=3)
def clean_unit(unit: Unit, cfg: CorpusConfig, stage: StageDir, fp: str) -> UnitResult:
    """Read one work unit, clean and sentence-split its documents, write them to `_work/`."""
    storage = stage.storage
    result = UnitResult(unit=unit.index)
    done = stage.done(unit.work_path, fp)
    if done is not None:
        result.read = done.result["read"]
        result.dropped = Counter(done.result["dropped"])
        return result

    columns: dict[str, list] = {name: [] for name in WORK_SCHEMA.names}
    try:
        fmt = _format_of(storage, unit)
        with _open_decompressed(storage, unit.uri) as stream:
            records = iter_raw_documents(
                stream,
                fmt,
                part=unit.part,
                n_parts=unit.n_parts,
                text_column=unit.spec.text_column,
                title_column=unit.spec.title_column,
                name=posixpath.basename(unit.uri),
            )
            for j, raw in enumerate(records):
                result.read += 1
                outcome = clean_document(raw, cfg, unit.spec.language)
                if not isinstance(outcome, Cleaned):
                    result.dropped[outcome.reason] += 1
                    continue
                columns["doc_id"].append(doc_id(unit.source, unit.uri, outcome.title))
                columns["source"].append(unit.source)
                columns["title"].append(outcome.title)
                columns["sentences"].append(outcome.sentences)
                # input order: by byte offset in the file, then by position within the unit
                # (Parquet rows of one row group share the group's offset)
                columns["offset"].append(raw.offset)
                columns["seq"].append(j)
                columns["chars"].append(outcome.chars)
                columns["n_sentences"].append(len(outcome.sentences))
                columns["content_hash"].append(content_hash(outcome.sentences))
    except (InputError, EOFError, OSError, UnicodeDecodeError, ValueError) as exc:
        message = _one_line(exc).removeprefix(f"{posixpath.basename(unit.uri)}: ")
        reason = f"{unit.uri}: {message}"
        if cfg.on_error == "raise":
            raise InputDataError(f"{reason} (or set corpus.on_error: skip to list the file in the manifest and go on)") from None
        return UnitResult(unit=unit.index, skipped=reason)

    table = pa.table(columns, schema=WORK_SCHEMA)
    work = stage.publish(unit.work_path, lambda path: write_table(path, table), rows=table.num_rows)
    stage.complete(unit.work_path, fp, [work], {"read": result.read, "dropped": dict(result.dropped)})
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


@ray.remote(num_cpus=1, max_retries=3)
def write_output_shard(relative: str, pieces: list[tuple[str, np.ndarray]], stage: StageDir, fp: str) -> ShardInfo:
    """Gather rows (work file, row indices), in order, into one output shard."""
    done = stage.done(relative, fp)
    if done is not None:
        return done.shards[0]
    tables = [
        read_table(stage.storage, stage.path(work), DOCUMENT_SCHEMA.names).take(pa.array(rows)) for work, rows in pieces
    ]
    table = pa.concat_tables(tables).combine_chunks()
    chars = sum(len(s) for doc in table.column("sentences").to_pylist() for s in doc)
    sentences = int(pc.sum(pc.list_value_length(table.column("sentences"))).as_py() or 0)
    return stage.write_shard(
        relative,
        fp,
        lambda path: write_table(path, table),
        rows=table.num_rows,
        extra={"chars": chars, "sentences": sentences},
    )


# -- the stage -------------------------------------------------------------------------------


def identify(cfg: CorpusConfig, storage: Storage) -> External:
    """The input files and what identifies their content; the files are listed once."""
    files, skipped = list_inputs(cfg, storage)
    identity = {"files": {uri: meta for _, _, uri, meta in files}, "missing": [s["file"] for s in skipped]}
    summary = f"{len(files)} input files ({size(sum(meta['size'] for *_, meta in files))})"
    return External(identity=identity, value=(files, skipped), summary=summary)


def run(r: StageRun) -> Output:
    """Clean every work unit, decide duplicates and the split, write the output shards."""
    corpus: CorpusConfig = r.section
    files, listed_skipped = r.external
    skipped = list(listed_skipped)
    units = plan_units(corpus, files)
    log.info("corpus: %d files in %d work units", len(files), len(units))
    t0 = time.perf_counter()
    results: list[UnitResult] = run_tasks(
        lambda unit: clean_unit.remote(unit, corpus, r.dir, r.fingerprint),
        units,
        parallelism=r.parallelism,
        desc="corpus: clean",
        sizes=[files[u.file_index][3]["size"] // u.n_parts for u in units],
        rows=lambda result: result.read,
    )
    t_clean = time.perf_counter() - t0

    # A file with any failed part is skipped whole: nothing of it reaches the shards.
    failed_files = {units[u.unit].file_index: u.skipped for u in results if u.skipped}
    for file_index, reason in sorted(failed_files.items()):
        skipped.append({"file": files[file_index][2], "reason": reason})
    kept_units = [u for u in units if u.file_index not in failed_files]

    t0 = time.perf_counter()
    meta = _gather_metadata(r.dir, kept_units)
    decision, drop_counts = _decide(meta, corpus, r.seed, r.dir, kept_units)
    t_plan = time.perf_counter() - t0

    t0 = time.perf_counter()
    jobs = _shard_jobs(meta, decision, kept_units, corpus.shard_chars)
    shards: list[ShardInfo] = run_tasks(
        lambda job: write_output_shard.remote(job[0], job[1], r.dir, r.fingerprint),
        jobs,
        parallelism=r.parallelism,
        desc="corpus: shards",
        rows=lambda shard: shard.rows,
    )
    t_write = time.perf_counter() - t0
    r.dir.remove_except([*SPLITS, "_work"], {s.path for s in shards} | {u.work_path for u in kept_units})

    stats = _statistics(results, units, failed_files, meta, decision, drop_counts, shards)
    return Output(
        shards=shards,
        stats=stats,
        headline={"documents": stats["documents_kept"], "sentences": stats["sentences"], "dropped": sum(stats["dropped"].values())},
        timings={
            "clean_s": round(t_clean, 3),
            "plan_s": round(t_plan, 3),
            "write_s": round(t_write, 3),
        },
        skipped=skipped,
        inputs={"files": {uri: m for _, _, uri, m in files}},
    )


def _shard_jobs(meta, decision, units: list[Unit], shard_chars: int) -> list[tuple[str, list[tuple[str, np.ndarray]]]]:
    """Per output shard: its path and its rows as (work file, row indices) pieces in order."""
    jobs = []
    for split in SPLITS:
        rows = decision[split]
        for shard_index, (start, end) in enumerate(cut_shards(meta["chars"][rows], shard_chars)):
            chosen = rows[start:end]
            pieces = []
            # consecutive rows of the same work file form one piece (keeps document order)
            boundaries = np.flatnonzero(np.diff(meta["unit"][chosen])) + 1
            for block in np.split(chosen, boundaries):
                unit = units[meta["unit_pos"][block[0]]]
                pieces.append((unit.work_path, meta["row"][block]))
            jobs.append((f"{split}/part-{shard_index:05d}.arrow", pieces))
    return jobs


def _gather_metadata(stage: StageDir, units: list[Unit]) -> dict[str, np.ndarray]:
    """Per kept document, in input order: work unit, row in its work file, chars, hash, id."""
    parts = defaultdict(list)
    for position, unit in enumerate(units):
        table = read_table(stage.storage, stage.path(unit.work_path), ["doc_id", "offset", "seq", "chars", "n_sentences", "content_hash"])
        n = table.num_rows
        parts["unit"].append(np.full(n, unit.index, dtype=np.int64))
        parts["unit_pos"].append(np.full(n, position, dtype=np.int64))
        parts["file"].append(np.full(n, unit.file_index, dtype=np.int64))
        parts["row"].append(np.arange(n, dtype=np.int64))
        parts["offset"].append(table.column("offset").to_numpy())
        parts["seq"].append(table.column("seq").to_numpy())
        parts["chars"].append(table.column("chars").to_numpy())
        parts["sentences"].append(table.column("n_sentences").to_numpy())
        parts["doc_id"].append(np.array(table.column("doc_id").to_pylist(), dtype=object))
        parts["hash"].append(np.array(table.column("content_hash").to_pylist(), dtype=object))
    if not parts:
        return {k: np.array([], dtype=np.int64) for k in ("unit", "unit_pos", "file", "row", "offset", "seq", "chars", "sentences", "doc_id", "hash")}
    meta = {k: np.concatenate(v) for k, v in parts.items()}
    order = np.lexsort((meta["seq"], meta["offset"], meta["file"]))  # input order
    return {k: v[order] for k, v in meta.items()}


def _decide(meta, corpus: CorpusConfig, seed: int, stage: StageDir, units: list[Unit]):
    """Which documents survive deduplication, and their split. Returns index arrays into
    `meta` per split (in input order) and the drop counts per source."""
    n = len(meta["chars"])
    keep = np.ones(n, dtype=bool)
    seen: set[bytes] = set()
    for i, digest in enumerate(meta["hash"]):
        if digest in seen:
            keep[i] = False
        else:
            seen.add(digest)
    duplicate = ~keep
    near = np.zeros(n, dtype=bool)
    if corpus.near_dedup and keep.any():
        candidates = np.flatnonzero(keep)
        signatures = _signatures(stage, units, meta, candidates, corpus, seed)
        flagged = near_duplicates(list(range(len(candidates))), signatures, corpus.minhash_threshold, corpus.minhash_num_perm)
        near[candidates[sorted(flagged)]] = True
        keep &= ~near
    validation = np.array([stable_fraction("split", d) < corpus.validation_fraction for d in meta["doc_id"]], dtype=bool)
    decision = {
        "train": np.flatnonzero(keep & ~validation),
        "validation": np.flatnonzero(keep & validation),
    }
    drops = {"duplicate": duplicate, "near_duplicate": near}
    return decision, drops


def _signatures(stage: StageDir, units, meta, candidates, corpus: CorpusConfig, seed: int) -> list:
    """MinHash signatures of the candidate documents (computed from the work files)."""
    signatures = []
    cache: dict[int, pa.Table] = {}
    for i in candidates:
        position = int(meta["unit_pos"][i])
        if position not in cache:
            cache.clear()
            cache[position] = read_table(stage.storage, stage.path(units[position].work_path), ["sentences"])
        sentences = cache[position].column("sentences")[int(meta["row"][i])].as_py()
        signatures.append(minhash_signature(sentences, corpus.minhash_num_perm, corpus.shingle_words, seed))
    return signatures


def _statistics(results, units, failed_files, meta, decision, drop_counts, shards) -> dict:
    per_source: dict[str, dict] = defaultdict(lambda: {"read": 0, "kept": 0, "dropped": Counter(), "sentences": 0, "characters": 0})
    for r in results:
        unit = units[r.unit]
        if unit.file_index in failed_files:
            continue
        entry = per_source[unit.source]
        entry["read"] += r.read
        entry["dropped"].update(r.dropped)
    source_of_unit = {u.index: u.source for u in units}
    for reason, mask in drop_counts.items():
        for i in np.flatnonzero(mask):
            per_source[source_of_unit[int(meta["unit"][i])]]["dropped"][reason] += 1
    kept_rows = np.concatenate([decision[s] for s in SPLITS]) if len(meta["chars"]) else np.array([], dtype=np.int64)
    for i in kept_rows:
        entry = per_source[source_of_unit[int(meta["unit"][i])]]
        entry["kept"] += 1
        entry["sentences"] += int(meta["sentences"][i])
        entry["characters"] += int(meta["chars"][i])
    splits = {}
    for split in SPLITS:
        split_shards = [s for s in shards if s.path.startswith(split + "/")]
        splits[split] = {
            "documents": sum(s.rows for s in split_shards),
            "sentences": sum(s.extra["sentences"] for s in split_shards),
            "characters": sum(s.extra["chars"] for s in split_shards),
            "shards": len(split_shards),
        }
    dropped_total = Counter()
    for entry in per_source.values():
        dropped_total.update(entry["dropped"])
        entry["dropped"] = dict(sorted(entry["dropped"].items()))
    return {
        "documents_read": sum(e["read"] for e in per_source.values()),
        "documents_kept": sum(e["kept"] for e in per_source.values()),
        "dropped": dict(sorted(dropped_total.items())),
        "splits": splits,
        "sentences": sum(v["sentences"] for v in splits.values()),
        "characters": sum(v["characters"] for v in splits.values()),
        "per_source": dict(sorted(per_source.items())),
        "files": len({u.file_index for u in units}),
        "work_units": len(units),
    }


# The split hashes document ids; only MinHash near-deduplication draws from the seed.
STAGE = Stage(
    "corpus", CorpusConfig, run, code_version="2", identify=identify, seeded=lambda cfg: cfg.near_dedup,
    writes="cleaned, sentence-split documents: {train,validation}/part-NNNNN.arrow",
)
