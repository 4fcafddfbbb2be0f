# Over 500 lines on purpose: the corpus stage's Ray tasks (readers, cleaners, dedup, shard writers) hand work units to one another; its planning and statistics already live in corpus_inputs.py and corpus_stats.py.
"""Corpus stage: raw files -> cleaned, sentence-split, deduplicated Arrow shards.

Ray shape: the inputs are planned into work units (pipelines/stages/corpus/inputs.py: small
files grouped, large ones cut into byte ranges or multistream-bz2 stream ranges, so every
input byte is decompressed once). One task per unit cleans and sentence-splits its
documents into `_work/`; a file that can only be read front to back (single-stream
compression) is read by one `read_stream` task whose record batches `clean_batch` tasks
clean as they come. The driver then decides duplicates, the train/validation split and
the shard boundaries from small per-document metadata, and one task per output shard
gathers the documents and writes `{train,validation}/part-NNNNN.arrow`.

Output order and boundaries depend only on the inputs and the config, never on the number
of workers or on how a file was cut: documents keep their input order (file, then a key
that is the same whichever task read the record: its byte offset, or for a multistream
dump its stream and offset inside it), exact duplicates keep the first occurrence, and
shards are cut in that order at equal character counts. (About 600 lines: cleaning,
deduplication and cutting share the record order; input planning is in corpus_inputs.py.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import tempfile
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import ray

from bertcore.errors import BertpipeError, InputDataError
from bertcore.rng import stable_fraction
from bertcore.text.clean import Cleaned, Wiki, clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.dedup import content_hash, minhash_signature, near_duplicates
from bertcore.text.lengths import Lengths
from bertcore.text.encoding import sniff, splittable
from bertcore.text.reader import peek
from bertcore.text.records import CHUNKABLE, Chunk, InputError, RawDocument, ReadStats, detect_format, iter_raw_documents, record_chunks
from bertcore.text.tabular import header_columns
from bertcore.text.wikisite import SiteInfo
from pipelines.stages.corpus.inputs import (
    InputFile,
    Piece,
    Unit,
    open_piece,
    plan_units,
    reading_arguments,
)
from pipelines.stages.corpus.stats import statistics
from pipelines.progress import Progress
from pipelines.ray_runtime import run_tasks, unwrap
from pipelines.shards import read_table, take_rows, write_table
from pipelines.stage import Output, StageRun
from pipelines.stage_dir import ShardInfo, StageDir

log = logging.getLogger(__name__)

SPLITS = ("train", "validation")
_BATCH_BYTES = 4 << 20
"""Bytes of decompressed input (or characters of raw text) in one batch of a streamed file."""
_FLUSH_CHARS = 1 << 20
"""Characters of cleaned text a task holds before it writes them out as one record batch."""

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
    + [("file", pa.int64()), ("major", pa.int64()), ("minor", pa.int64()), ("seq", pa.int64()),
       ("chars", pa.int64()), ("n_sentences", pa.int64()), ("content_hash", pa.binary(16))]
)


def doc_id(source: str, uri: str, title: str) -> str:
    """Stable id: hash of the source label, the file name and the title (or record key)."""
    key = "\x1f".join([source, posixpath.basename(uri), title])
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


def cut_shards(chars: np.ndarray, shard_chars: int) -> list[tuple[int, int]]:
    """Contiguous, non-empty [start, end) ranges covering the documents in order, each
    holding about the same number of characters: n = round(total / shard_chars) shards
    (at least one, at most one per document), boundary k placed where the running total
    is nearest to k * total / n."""
    if len(chars) == 0:
        return []
    total = int(chars.sum())
    n = min(len(chars), max(1, round(total / shard_chars)))
    cumulative = np.cumsum(chars)
    bounds = [0]
    for k in range(1, n):
        target = k * total / n
        cut = int(np.searchsorted(cumulative, target))
        # choose the side of document `cut` whose running total is nearer the target
        if cut < len(chars) and abs(cumulative[cut] - target) < abs(cumulative[cut] - chars[cut] - target):
            cut += 1
        # leave at least one document for this shard and each one after it
        bounds.append(min(max(cut, bounds[-1] + 1), len(chars) - (n - k)))
    bounds.append(len(chars))
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


# -- what tasks report -----------------------------------------------------------------------


@dataclass
class UnitResult:
    """What cleaning one unit (or one batch of a streamed unit) found."""

    unit: int
    works: list[str] = field(default_factory=list)
    read: Counter = field(default_factory=Counter)  # per file index
    dropped: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    files: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    """Per file: compressed_bytes_read, decompressed_bytes, truncated_records, truncated_bytes,
    long_sentences_split, boilerplate_chars."""
    chars: Lengths = field(default_factory=Lengths)
    words: Lengths = field(default_factory=lambda: Lengths(1024))
    skipped: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "works": self.works, "read": dict(self.read), "dropped": {k: dict(v) for k, v in self.dropped.items()},
            "files": {k: dict(v) for k, v in self.files.items()}, "chars": self.chars.to_json(), "words": self.words.to_json(),
            "skipped": self.skipped,
        }

    @classmethod
    def from_json(cls, unit: int, data: dict) -> UnitResult:
        out = cls(unit, works=data["works"], read=Counter({int(k): v for k, v in data["read"].items()}),
                  chars=Lengths.from_json(data["chars"]), words=Lengths.from_json(data["words"]),
                  skipped={int(k): v for k, v in data["skipped"].items()})
        for name in ("dropped", "files"):
            for k, v in data[name].items():
                getattr(out, name)[int(k)].update(v)
        return out


class _Work:
    """The cleaned documents of one task, as WORK_SCHEMA record batches written to a local
    file every `_FLUSH_CHARS` characters, so a task holds at most that much cleaned text
    however large its share of the input."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "work.arrow")
        self.rows = 0
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = ipc.new_file(self._sink, WORK_SCHEMA)
        self._clear()

    def _clear(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in WORK_SCHEMA.names}
        self._chars = 0

    def add(self, file: InputFile, key: tuple[int, int], seq: int, cleaned: Cleaned) -> None:
        c = self.columns
        c["doc_id"].append(doc_id(file.source, file.uri, cleaned.title))
        c["source"].append(file.source)
        c["title"].append(cleaned.title)
        c["sentences"].append(cleaned.sentences)
        c["file"].append(file.index)
        c["major"].append(key[0])
        c["minor"].append(key[1])
        c["seq"].append(seq)
        c["chars"].append(cleaned.chars)
        c["n_sentences"].append(len(cleaned.sentences))
        c["content_hash"].append(content_hash(cleaned.sentences))
        self._chars += cleaned.chars
        if self._chars >= _FLUSH_CHARS:
            self._flush()

    def _flush(self) -> None:
        if self.columns["doc_id"]:
            batch = pa.record_batch(self.columns, schema=WORK_SCHEMA)
            self._writer.write_batch(batch)
            self.rows += batch.num_rows
        self._clear()

    def publish(self, stage: StageDir, path: str, fp: str, result: UnitResult) -> UnitResult:
        self._flush()
        self._writer.close()
        self._sink.close()
        work = stage.publish_copy(path, self.path, rows=self.rows)
        result.works = [path]
        stage.complete(path, fp, [work], result.to_json())
        return result


# -- cleaning ----------------------------------------------------------------------------------


_USER_ERRORS = (InputError, EOFError, OSError, UnicodeDecodeError, ValueError)


def _user_error(file: InputFile, exc: BaseException, cfg: CorpusConfig) -> str:
    """The one-line reason a file cannot be read; raised as InputDataError unless skipping."""
    text = " ".join((str(exc) or type(exc).__name__).split())
    reason = f"{file.uri}: {text.removeprefix(posixpath.basename(file.uri) + ': ')}"
    if cfg.on_error == "raise":
        raise InputDataError(f"{reason} (or set corpus.on_error: skip to list the file in the manifest and go on)") from None
    return reason


def _clean_records(work: _Work, records, piece: Piece, key, header, cfg: CorpusConfig, result: UnitResult) -> None:
    """Clean records of one piece into `work`, counting what was read and dropped."""
    file = piece.file
    language = file.spec.language
    wiki = None
    for seq, raw in enumerate(records):
        result.read[file.index] += 1
        if raw.markup == "wikitext" and wiki is None:
            wiki = Wiki.of(cfg, language, header())
        try:
            outcome = clean_document(raw, cfg, language, wiki)
        except Exception as exc:  # a record that breaks the cleaner must not become a retried crash
            raise InputError(
                f"cleaning the record at byte {raw.offset} ({raw.title[:80]!r}) failed ({type(exc).__name__}: {exc}); "
                "this is a bertpipe bug, please report it with that record",
                raw.offset,
            ) from exc
        if not isinstance(outcome, Cleaned):
            result.dropped[file.index][outcome.reason] += 1
            continue
        work.add(file, key(raw.offset), seq, outcome)
        result.chars.add(len(s) for s in outcome.sentences)
        result.words.add(s.count(" ") + 1 for s in outcome.sentences)
        counts = result.files[file.index]
        counts["long_sentences_split"] += outcome.long_sentences_split
        counts["boilerplate_chars"] += outcome.boilerplate_chars


def _count_read(result: UnitResult, file: InputFile, stats: ReadStats, compressed: int, decompressed: bool = True) -> None:
    counts = result.files[file.index]
    counts["compressed_bytes_read"] += compressed
    if decompressed:
        counts["decompressed_bytes"] += stats.decompressed_bytes
    counts["truncated_bytes"] += stats.truncated_bytes
    if stats.truncated_records:
        counts["truncated_records"] += stats.truncated_records
        result.read[file.index] += stats.truncated_records
        result.dropped[file.index]["truncated"] += stats.truncated_records


@ray.remote(num_cpus=1, max_retries=3)
def clean_unit(unit: Unit, cfg: CorpusConfig, stage: StageDir, fp: str) -> UnitResult:
    """Read one work unit's pieces, clean and sentence-split their documents into `_work/`."""
    done = stage.done(unit.work_path, fp)
    if done is not None:
        return UnitResult.from_json(unit.index, done.result)
    result = UnitResult(unit.index)
    with tempfile.TemporaryDirectory(prefix="bertpipe-corpus-") as tmp:
        work = _Work(tmp)
        for piece in unit.pieces:
            stats = ReadStats()
            try:
                with open_piece(stage.storage, piece) as opened:
                    records = iter_raw_documents(opened.stream, piece.fmt, stats=stats, **opened.arguments)
                    _clean_records(work, records, piece, opened.key, lambda: piece.header or stats.header, cfg, result)
                    compressed = opened.compressed_bytes
                    if opened.decoded is not None:
                        stats.decompressed_bytes = opened.decoded()
            except _USER_ERRORS as exc:
                result.skipped[piece.file.index] = _user_error(piece.file, exc, cfg)
                continue
            _count_read(result, piece.file, stats, compressed)
        return work.publish(stage, unit.work_path, fp, result)


@dataclass(frozen=True)
class Batch:
    """A batch of a streamed file: whole records as the file's bytes (`chunk`), which the
    cleaning task parses, or records parsed by the reader (`records`: formats and encodings
    whose record starts cannot be found from their bytes)."""

    index: int
    fmt: str
    header: object
    """The file's header (SiteInfo, tsv columns) for a chunk that does not start the file."""
    chunk: Chunk | None = None
    records: list[RawDocument] | None = None


def _stream_format(stream, piece: Piece) -> tuple[str, bool, object]:
    """(format, whether the file can go out in chunks of records, the stream from its
    first byte): from the file's first decompressed bytes."""
    head, stream = peek(stream, 4096)
    name = piece.file.uri
    fmt = piece.fmt if piece.fmt != "auto" else detect_format(name, head)
    chunked = fmt in CHUNKABLE and splittable(sniff(head, piece.file.spec.encoding))
    return fmt, chunked, stream


def _chunk_header(chunk: Chunk, fmt: str, name: str) -> object:
    """What the file's later chunks need from its first one: a dump's <siteinfo>, the
    columns of a tsv file."""
    if fmt == "wikipedia":
        first_page = chunk.data.find(b"<page>")
        return SiteInfo.from_xml(chunk.data if first_page < 0 else chunk.data[:first_page])
    if fmt == "tsv":
        return header_columns(fmt, chunk.data.split(b"\n", 1)[0], name)
    return None


@ray.remote(num_cpus=0, max_retries=3)
def read_stream(unit: Unit, cfg: CorpusConfig, stage: StageDir, fp: str, batch_bytes: int):
    """Decompress one file once, front to back, and hand it on in batches of about
    `batch_bytes`: chunks of whole records (bytes, which the cleaning tasks parse) when its
    records can be found from their bytes, else parsed records. What was read is recorded
    under `unit.read_marker`. Takes no CPU slot of its own, so it can never wait on the
    cleaning tasks it feeds."""
    piece = unit.pieces[0]
    stats, result = ReadStats(), UnitResult(unit.index)
    n = 0
    try:
        with open_piece(stage.storage, piece) as opened:
            fmt, chunked, stream = _stream_format(opened.stream, piece)
            if chunked:
                header = None
                for chunk in record_chunks(stream, fmt, batch_bytes, name=posixpath.basename(piece.file.uri), stats=stats):
                    header = _chunk_header(chunk, fmt, piece.file.uri) if n == 0 else header
                    yield Batch(n, fmt, header, chunk=chunk)
                    n += 1
            else:
                batch: list[RawDocument] = []
                size = 0
                arguments = {**opened.arguments, "stats": stats}
                for raw in iter_raw_documents(stream, fmt, **arguments):
                    batch.append(raw)
                    size += len(raw.text)
                    if size >= batch_bytes:
                        yield Batch(n, fmt, stats.header, records=batch)
                        batch, size, n = [], 0, n + 1
                if batch:
                    yield Batch(n, fmt, stats.header, records=batch)
                    n += 1
            compressed = opened.compressed_bytes
        _count_read(result, piece.file, stats, compressed)
    except _USER_ERRORS as exc:
        result.skipped[piece.file.index] = _user_error(piece.file, exc, cfg)
    stage.complete(unit.read_marker, fp, [], {"batches": n, **result.to_json()})


@ray.remote(num_cpus=1, max_retries=3)
def clean_batch(unit: Unit, batch: Batch, cfg: CorpusConfig, stage: StageDir, fp: str) -> UnitResult:
    path = unit.batch_path(batch.index)
    done = stage.done(path, fp)
    if done is not None:
        return UnitResult.from_json(unit.index, done.result)
    piece, result = unit.pieces[0], UnitResult(unit.index)
    with tempfile.TemporaryDirectory(prefix="bertpipe-corpus-") as tmp:
        work = _Work(tmp)
        try:
            if batch.chunk is not None:
                chunk, stats = batch.chunk, ReadStats()
                records = iter_raw_documents(chunk.stream(), batch.fmt, start=chunk.offset, first=chunk.offset == 0,
                                             header=batch.header, stats=stats, **reading_arguments(piece.file))
                _clean_records(work, records, piece, lambda offset: (offset, 0), lambda: batch.header or stats.header, cfg, result)
                _count_read(result, piece.file, stats, 0, decompressed=False)  # the reader counted the bytes
            else:
                _clean_records(work, batch.records, piece, lambda offset: (offset, 0), lambda: batch.header, cfg, result)
        except InputError as exc:
            result.skipped[piece.file.index] = _user_error(piece.file, exc, cfg)
        return work.publish(stage, path, fp, result)


def _raise_failed(exc: ray.exceptions.RayTaskError, pending) -> None:
    """A task failed: cancel the others; a user's error comes out as itself (one line)."""
    for other in pending:
        ray.cancel(other)
    error = unwrap(exc)
    if isinstance(error, BertpipeError):
        raise error from None
    raise exc


def _clean_all(units: list[Unit], cfg: CorpusConfig, stage: StageDir, fp: str, parallelism: int | None) -> list[UnitResult]:
    """Run every unit: a clean_unit task each, and for a streamed unit its reader with a
    clean_batch task per batch, at most `limit` cleaning tasks in flight (the readers feed
    batches only into free slots, so their backlog stays bounded)."""
    limit = parallelism or max(1, int(ray.cluster_resources().get("CPU", 1)))
    plain = deque(u for u in units if not u.streamed)
    streamed = deque(u for u in units if u.streamed)
    in_flight: dict = {}
    readers: dict = {}
    results: list[UnitResult] = []
    total_bytes = sum(_unit_bytes(u) for u in units)
    # a streamed unit is done when its reader has ended and its last batch is cleaned
    batches_left: Counter[int] = Counter()
    ended: set[int] = set()
    with Progress("corpus: clean", len(units), total_bytes=total_bytes) as progress:
        while plain or streamed or in_flight or readers:
            while streamed and len(readers) < max(1, limit // 4):
                unit = streamed.popleft()
                reader = read_stream.options(_generator_backpressure_num_objects=2).remote(unit, cfg, stage, fp, min(cfg.split_bytes, _BATCH_BYTES))
                readers[reader] = unit
            for reader, unit in list(readers.items()):
                while len(in_flight) < limit and ray.wait([reader], timeout=0)[0]:
                    try:
                        ref = next(reader)
                    except StopIteration:
                        del readers[reader]
                        marker = stage.done(unit.read_marker, fp)
                        results.append(UnitResult.from_json(unit.index, marker.result))
                        ended.add(unit.index)
                        if not batches_left[unit.index]:
                            progress.advance(nbytes=_unit_bytes(unit))
                        break
                    except ray.exceptions.RayTaskError as exc:
                        _raise_failed(exc, in_flight)
                    in_flight[clean_batch.remote(unit, ref, cfg, stage, fp)] = unit
                    batches_left[unit.index] += 1
            while plain and len(in_flight) < limit:
                unit = plain.popleft()
                in_flight[clean_unit.remote(unit, cfg, stage, fp)] = unit
            waitables = list(in_flight) + (list(readers) if len(in_flight) < limit else [])
            if not waitables:
                continue
            ready, _ = ray.wait(waitables, num_returns=1)
            if ready[0] in in_flight:
                unit = in_flight.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    _raise_failed(exc, in_flight)
                results.append(result)
                rows = sum(result.read.values())
                if not unit.streamed:
                    progress.advance(rows=rows, nbytes=_unit_bytes(unit))
                    continue
                batches_left[unit.index] -= 1
                finished = unit.index in ended and not batches_left[unit.index]
                progress.advance(int(finished), rows=rows, nbytes=_unit_bytes(unit) if finished else 0)
    return results


def _unit_bytes(unit: Unit) -> int:
    """Input bytes of a unit (its ranges, or whole files)."""
    return sum((p.end if p.end is not None else p.file.size) - p.start for p in unit.pieces)


# -- output shards -----------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def write_output_shard(relative: str, pieces: list[tuple[str, np.ndarray]], stage: StageDir, fp: str) -> ShardInfo:
    """Gather rows (work file, row indices), in order, into one output shard."""
    done = stage.done(relative, fp)
    if done is not None:
        return done.shards[0]
    tables = [take_rows(stage.storage, stage.path(work), rows, DOCUMENT_SCHEMA.names) for work, rows in pieces]
    table = pa.concat_tables(tables).combine_chunks()
    chars = int(pc.sum(pc.utf8_length(pc.list_flatten(table.column("sentences")))).as_py() or 0)
    sentences = int(pc.sum(pc.list_value_length(table.column("sentences"))).as_py() or 0)
    return stage.write_shard(relative, fp, lambda path: write_table(path, table), rows=table.num_rows, extra={"chars": chars, "sentences": sentences})


# -- the stage ---------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Clean every work unit, decide duplicates and the split, write the output shards."""
    corpus: CorpusConfig = r.section
    listing = r.external
    files = listing.files
    skipped = list(listing.skipped)
    t0 = time.perf_counter()
    plan = plan_units(corpus, files, r.storage)
    log.info("corpus: %d files in %d work units", len(files), len(plan.units))
    results = _clean_all(plan.units, corpus, r.dir, r.fingerprint, r.parallelism)
    t_clean = time.perf_counter() - t0

    # A file with any failed piece is skipped whole: nothing of it reaches the shards.
    failed = {}
    for result in results:
        failed.update(result.skipped)
    for file_index, reason in sorted(failed.items()):
        skipped.append({"file": files[file_index].uri, "reason": reason})

    t0 = time.perf_counter()
    works = sorted({w for result in results for w in result.works})
    meta = _gather_metadata(r.dir, works, set(failed))
    decision, drop_counts = _decide(meta, corpus, r.seed, r.dir, works)
    t_plan = time.perf_counter() - t0

    t0 = time.perf_counter()
    jobs = _shard_jobs(meta, decision, works, corpus.shard_chars)
    shards: list[ShardInfo] = run_tasks(
        lambda job: write_output_shard.remote(job[0], job[1], r.dir, r.fingerprint),
        jobs,
        parallelism=r.parallelism,
        desc="corpus: shards",
        rows=lambda shard: shard.rows,
    )
    t_write = time.perf_counter() - t0
    r.dir.remove_except([*SPLITS, "_work"], {s.path for s in shards} | set(works))

    stats = statistics(files, plan, results, failed, meta, decision, drop_counts, shards)
    return Output(
        shards=shards,
        stats=stats,
        headline={"documents": stats["documents_kept"], "sentences": stats["sentences"], "dropped": sum(stats["dropped"].values())},
        timings={"clean_s": round(t_clean, 3), "plan_s": round(t_plan, 3), "write_s": round(t_write, 3)},
        skipped=skipped,
        inputs={"files": {f.uri: {"size": f.size, "content": f.content} for f in files}},
    )


def _shard_jobs(meta, decision, works: list[str], shard_chars: int) -> list[tuple[str, list[tuple[str, np.ndarray]]]]:
    """Per output shard: its path and its rows as (work file, row indices) pieces in order."""
    jobs = []
    for split in SPLITS:
        rows = decision[split]
        for shard_index, (start, end) in enumerate(cut_shards(meta["chars"][rows], shard_chars)):
            chosen = rows[start:end]
            pieces = []
            # consecutive rows of the same work file form one piece (keeps document order)
            boundaries = np.flatnonzero(np.diff(meta["work"][chosen])) + 1
            for block in np.split(chosen, boundaries):
                pieces.append((works[meta["work"][block[0]]], meta["row"][block]))
            jobs.append((f"{split}/part-{shard_index:05d}.arrow", pieces))
    return jobs


_META = ("work", "row", "file", "major", "minor", "seq", "chars", "sentences", "doc_id", "hash")


def _gather_metadata(stage: StageDir, works: list[str], failed_files: set[int]) -> dict[str, np.ndarray]:
    """Per kept document, in input order: work file, row in it, file, order key, chars,
    sentences, id and content hash. Documents of failed files are left out."""
    parts = defaultdict(list)
    for position, work in enumerate(works):
        table = read_table(stage.storage, stage.path(work), ["doc_id", "file", "major", "minor", "seq", "chars", "n_sentences", "content_hash"])
        n = table.num_rows
        parts["work"].append(np.full(n, position, dtype=np.int64))
        parts["row"].append(np.arange(n, dtype=np.int64))
        for column in ("file", "major", "minor", "seq", "chars"):
            parts[column].append(table.column(column).to_numpy())
        parts["sentences"].append(table.column("n_sentences").to_numpy())
        parts["doc_id"].append(np.array(table.column("doc_id").to_pylist(), dtype=object))
        parts["hash"].append(np.array(table.column("content_hash").to_pylist(), dtype=object))
    if not parts:
        return {k: np.array([], dtype=np.int64) for k in _META}
    meta = {k: np.concatenate(v) for k, v in parts.items()}
    keep = ~np.isin(meta["file"], list(failed_files)) if failed_files else np.ones(len(meta["file"]), dtype=bool)
    meta = {k: v[keep] for k, v in meta.items()}
    order = np.lexsort((meta["seq"], meta["minor"], meta["major"], meta["file"]))  # input order
    return {k: v[order] for k, v in meta.items()}


def _decide(meta, corpus: CorpusConfig, seed: int, stage: StageDir, works: list[str]):
    """Which documents survive deduplication, and their split. Returns index arrays into
    `meta` per split (in input order) and the drop masks per reason."""
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
        signatures = _signatures(stage, works, meta, candidates, corpus, seed)
        flagged = near_duplicates(list(range(len(candidates))), signatures, corpus.minhash_threshold, corpus.minhash_num_perm)
        near[candidates[sorted(flagged)]] = True
        keep &= ~near
    validation = np.array([stable_fraction("split", d) < corpus.validation_fraction for d in meta["doc_id"]], dtype=bool)
    decision = {"train": np.flatnonzero(keep & ~validation), "validation": np.flatnonzero(keep & validation)}
    return decision, {"duplicate": duplicate, "near_duplicate": near}


def _signatures(stage: StageDir, works: list[str], meta, candidates, corpus: CorpusConfig, seed: int) -> list:
    """MinHash signatures of the candidate documents (computed from the work files)."""
    signatures = []
    cache: dict[int, pa.Table] = {}
    for i in candidates:
        position = int(meta["work"][i])
        if position not in cache:
            cache.clear()
            cache[position] = read_table(stage.storage, stage.path(works[position]), ["sentences"])
        sentences = cache[position].column("sentences")[int(meta["row"][i])].as_py()
        signatures.append(minhash_signature(sentences, corpus.minhash_num_perm, corpus.shingle_words, seed))
    return signatures
