"""Corpus stage: raw files -> cleaned, sentence-split, deduplicated Arrow shards.

Ray shape: the inputs are planned into work units (pipelines/stages/corpus/units.py: small
files grouped, large ones cut into byte ranges or multistream-bz2 stream ranges, so every
input byte is decompressed once). One task per unit cleans and sentence-splits its
documents into `_work/` (clean.py), with each document's content hash and, for near
dedup, its MinHash signature; a file that can only be read front to back (single-stream
compression) is read by one `read_stream` task whose record batches `clean_batch` tasks
clean as they come. Then duplicates are removed by partitioned tasks (dedup.py), the
split and the shard plan are made per work file (plan.py), and one task per output shard
gathers the documents and writes `{train,validation}/part-NNNNN.arrow`. The driver holds
plans and counts, never per-document data.

Output order and boundaries depend only on the inputs and the config, never on the number
of workers or on how a file was cut: documents keep their input order (file, then a key
that is the same whichever task read the record: its byte offset, or for a multistream
dump its stream and offset inside it), every duplicate group keeps its first document in
that order, and shards are cut in that order at equal character counts.
"""

from __future__ import annotations

import logging
import posixpath
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass

import ray

from bertcore.errors import BertpipeError
from bertcore.text.config import CorpusConfig
from bertcore.text.dedup import MinHashSpec
from bertcore.text.encoding import sniff, splittable
from bertcore.text.reader import peek
from bertcore.text.records import (
    CHUNKABLE,
    Chunk,
    InputError,
    RawDocument,
    ReadStats,
    detect_format,
    iter_raw_documents,
    record_chunks,
)
from bertcore.text.tabular import header_columns
from bertcore.text.wikisite import SiteInfo
from pipelines.progress import Progress
from pipelines.ray_runtime import unwrap
from pipelines.stage import Output, StageRun
from pipelines.stage_dir import StageDir
from pipelines.stages.corpus.clean import USER_ERRORS, UnitResult, WorkFile, clean_records, count_read, user_error
from pipelines.stages.corpus.dropped import top_filters
from pipelines.stages.corpus.pieces import open_piece, reading_arguments
from pipelines.stages.corpus.plan import write_corpus
from pipelines.stages.corpus.stats import statistics
from pipelines.stages.corpus.units import Piece, Unit, plan_units
from pipelines.stages.corpus.works import Works

log = logging.getLogger(__name__)

_BATCH_BYTES = 4 << 20
"""Bytes of decompressed input (or characters of raw text) in one batch of a streamed file."""


# -- cleaning ----------------------------------------------------------------------------------


@ray.remote(num_cpus=1, max_retries=3)
def clean_unit(unit: Unit, cfg: CorpusConfig, minhash: MinHashSpec | None, stage: StageDir, fp: str) -> UnitResult:
    """Read one work unit's pieces, clean and sentence-split their documents into `_work/`."""
    done = stage.done(unit.work_path, fp)
    if done is not None:
        return UnitResult.from_json(unit.index, done.result, rows=done.shards[0].rows)
    result = UnitResult(unit.index)
    with tempfile.TemporaryDirectory(prefix="bertpipe-corpus-") as tmp:
        work = WorkFile(tmp, cfg, minhash)
        for piece in unit.pieces:
            stats = ReadStats()
            try:
                with open_piece(stage.storage, piece) as opened:
                    records = iter_raw_documents(opened.stream, piece.fmt, stats=stats, **opened.arguments)
                    clean_records(
                        work,
                        records,
                        piece,
                        opened.key,
                        lambda: piece.header or stats.header,  # noqa: B023 - called within this iteration
                        cfg,
                        result,
                    )
                    compressed = opened.compressed_bytes
                    if opened.decoded is not None:
                        stats.decompressed_bytes = opened.decoded()
            except USER_ERRORS as exc:
                result.skipped[piece.file.index] = user_error(piece.file, exc, cfg)
                continue
            count_read(result, piece.file, stats, compressed)
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
                for chunk in record_chunks(
                    stream, fmt, batch_bytes, name=posixpath.basename(piece.file.uri), stats=stats
                ):
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
        count_read(result, piece.file, stats, compressed)
    except USER_ERRORS as exc:
        result.skipped[piece.file.index] = user_error(piece.file, exc, cfg)
    stage.complete(unit.read_marker, fp, [], {"batches": n, **result.to_json()})


@ray.remote(num_cpus=1, max_retries=3)
def clean_batch(
    unit: Unit, batch: Batch, cfg: CorpusConfig, minhash: MinHashSpec | None, stage: StageDir, fp: str
) -> UnitResult:
    path = unit.batch_path(batch.index)
    done = stage.done(path, fp)
    if done is not None:
        return UnitResult.from_json(unit.index, done.result, rows=done.shards[0].rows)
    piece, result = unit.pieces[0], UnitResult(unit.index)
    with tempfile.TemporaryDirectory(prefix="bertpipe-corpus-") as tmp:
        work = WorkFile(tmp, cfg, minhash)
        try:
            if batch.chunk is not None:
                chunk, stats = batch.chunk, ReadStats()
                records = iter_raw_documents(
                    chunk.stream(),
                    batch.fmt,
                    start=chunk.offset,
                    first=chunk.offset == 0,
                    header=batch.header,
                    stats=stats,
                    **reading_arguments(piece.file),
                )
                clean_records(
                    work, records, piece, lambda offset: (offset, 0), lambda: batch.header or stats.header, cfg, result
                )
                count_read(result, piece.file, stats, 0, decompressed=False)  # the reader counted the bytes
            else:
                clean_records(work, batch.records, piece, lambda offset: (offset, 0), lambda: batch.header, cfg, result)
        except InputError as exc:
            result.skipped[piece.file.index] = user_error(piece.file, exc, cfg)
        return work.publish(stage, path, fp, result)


def _raise_failed(exc: ray.exceptions.RayTaskError, pending) -> None:
    """A task failed: cancel the others; a user's error comes out as itself (one line)."""
    for other in pending:
        ray.cancel(other)
    error = unwrap(exc)
    if isinstance(error, BertpipeError):
        raise error from None
    raise exc


def _clean_all(
    units: list[Unit], cfg: CorpusConfig, minhash: MinHashSpec | None, stage: StageDir, fp: str, parallelism: int | None
) -> list[UnitResult]:
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
                reader = read_stream.options(_generator_backpressure_num_objects=2).remote(
                    unit, cfg, stage, fp, min(cfg.split_bytes, _BATCH_BYTES)
                )
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
                    in_flight[clean_batch.remote(unit, ref, cfg, minhash, stage, fp)] = unit
                    batches_left[unit.index] += 1
            while plain and len(in_flight) < limit:
                unit = plain.popleft()
                in_flight[clean_unit.remote(unit, cfg, minhash, stage, fp)] = unit
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


# -- the stage ---------------------------------------------------------------------------------


def run(r: StageRun) -> Output:
    """Clean every work unit, remove duplicates, split, write the output shards."""
    corpus: CorpusConfig = r.section
    listing = r.external
    files = listing.files
    skipped = list(listing.skipped)
    minhash = None
    if corpus.near_dedup:
        minhash = MinHashSpec(
            corpus.minhash_num_perm, corpus.shingle_words, r.seed, corpus.minhash_threshold, corpus.near_dedup_rule
        )
    t0 = time.perf_counter()
    plan = plan_units(corpus, files, r.storage)
    log.info("corpus: %d files in %d work units", len(files), len(plan.units))
    results = _clean_all(plan.units, corpus, minhash, r.dir, r.fingerprint, r.parallelism)
    t_clean = time.perf_counter() - t0

    # A file with any failed piece is skipped whole: nothing of it reaches the shards.
    failed = {}
    for result in results:
        failed.update(result.skipped)
    for file_index, reason in sorted(failed.items()):
        skipped.append({"file": files[file_index].uri, "reason": reason})

    rows = {path: result.rows for result in results for path in result.works}
    works = Works(tuple(sorted(rows)), tuple(rows[p] for p in sorted(rows)), tuple(sorted(failed)))
    written = write_corpus(r.dir, works, corpus, minhash, r.fingerprint, r.parallelism)
    removals, plans, shards = written.removals, written.plans, written.shards

    stats = statistics(files, plan, results, failed, plans, shards)
    if minhash is not None:
        stats["near_dedup"] = {"candidate_pairs": removals.candidates, "similar_pairs": removals.similar_pairs}
    return Output(
        shards=shards,
        stats=stats,
        # the end line keeps only what fits in 110 columns: what was removed comes first
        headline={
            "documents": stats["documents_kept"],
            **(
                {"chars removed": top_filters(stats["filters"])}
                if any(e["characters"] for e in stats["filters"].values())
                else {}
            ),
            "duplicates": stats["dropped"].get("duplicate", 0),
            **({"near duplicates": stats["dropped"].get("near_duplicate", 0)} if minhash else {}),
            "dropped": sum(stats["dropped"].values()),
            "sentences": stats["sentences"],
        },
        timings={"clean_s": round(t_clean, 3), **written.timings},
        skipped=skipped,
        inputs={"files": {f.uri: {"size": f.size, "content": f.content} for f in files}},
    )
