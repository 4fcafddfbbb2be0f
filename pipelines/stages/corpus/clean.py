"""What one cleaning task does with its records: each is cleaned, sentence-split and
written as a row of the task's work file (WORK_SCHEMA: the document with its id, split,
content hash and MinHash signature), and what was read and dropped is counted in a
`UnitResult`. The Ray tasks that call it are in work.py.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.ipc as ipc

from bertcore.errors import InputDataError
from bertcore.rng import stable_fraction
from bertcore.text.clean import Cleaned, Wiki, clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.dedup import MinHashSpec, content_hash
from bertcore.text.lengths import Lengths
from bertcore.text.records import InputError, ReadStats
from bertcore.text.screen import Screen
from pipelines.stage_dir import StageDir
from pipelines.stages.corpus.dropped import Samples, record_outcome
from pipelines.stages.corpus.inputs import InputFile
from pipelines.stages.corpus.units import Piece
from pipelines.stages.corpus.works import WORK_SCHEMA

_FLUSH_CHARS = 1 << 20
"""Characters of cleaned text a task holds before it writes them out as one record batch."""


def doc_id(source: str, uri: str, title: str) -> str:
    """Stable id: hash of the source label, the file name and the title (or record key)."""
    key = "\x1f".join([source, posixpath.basename(uri), title])
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


# -- what tasks report -----------------------------------------------------------------------


@dataclass
class UnitResult:
    """What cleaning one unit (or one batch of a streamed unit) found."""

    unit: int
    works: list[str] = field(default_factory=list)
    rows: int = 0
    """Documents in its work file (recorded as the work file's row count in its marker)."""
    read: Counter = field(default_factory=Counter)  # per file index
    dropped: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    files: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    """Per file: compressed_bytes_read, decompressed_bytes, truncated_records, truncated_bytes,
    long_sentences_split, boilerplate_chars."""
    chars: Lengths = field(default_factory=Lengths)
    words: Lengths = field(default_factory=lambda: Lengths(1024))
    skipped: dict[int, str] = field(default_factory=dict)
    filters: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    """Per file: what each filter removed (pipelines/stages/corpus/dropped.py, `record_outcome`)."""
    languages: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    """Per file: documents per detected language ("de/read", "de/kept")."""
    samples: Samples = field(default_factory=Samples)

    def to_json(self) -> dict:
        return {
            "works": self.works,
            "read": dict(self.read),
            "dropped": {k: dict(v) for k, v in self.dropped.items()},
            "files": {k: dict(v) for k, v in self.files.items()},
            "chars": self.chars.to_json(),
            "words": self.words.to_json(),
            "skipped": self.skipped,
            "filters": {k: dict(v) for k, v in self.filters.items()},
            "languages": {k: dict(v) for k, v in self.languages.items()},
            "samples": self.samples.to_json(),
        }

    @classmethod
    def from_json(cls, unit: int, data: dict, rows: int = 0) -> UnitResult:
        out = cls(
            unit,
            works=data["works"],
            rows=rows,
            read=Counter({int(k): v for k, v in data["read"].items()}),
            chars=Lengths.from_json(data["chars"]),
            words=Lengths.from_json(data["words"]),
            skipped={int(k): v for k, v in data["skipped"].items()},
            samples=Samples.from_json(data.get("samples", {})),
        )
        for name in ("dropped", "files", "filters", "languages"):
            for k, v in data.get(name, {}).items():
                getattr(out, name)[int(k)].update(v)
        return out


class WorkFile:
    """The cleaned documents of one task, as WORK_SCHEMA record batches written to a local
    file every `_FLUSH_CHARS` characters, so a task holds at most that much cleaned text
    however large its share of the input."""

    def __init__(self, directory: str, cfg: CorpusConfig, minhash: MinHashSpec | None):
        self.path = os.path.join(directory, "work.arrow")
        self.validation_fraction = cfg.validation_fraction
        self.minhash = minhash
        self.rows = 0
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = ipc.new_file(self._sink, WORK_SCHEMA)
        self._clear()

    def _clear(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in WORK_SCHEMA.names}
        self._chars = 0

    def add(self, file: InputFile, key: tuple[int, int], seq: int, cleaned: Cleaned) -> None:
        c = self.columns
        identity = doc_id(file.source, file.uri, cleaned.title)
        c["doc_id"].append(identity)
        c["validation"].append(stable_fraction("split", identity) < self.validation_fraction)
        c["source"].append(file.source)
        c["title"].append(cleaned.title)
        c["sentences"].append(cleaned.sentences)
        for name in ("url", "crawl_date", "content_type", "language", "language_score"):
            c[name].append(getattr(cleaned, name))
        c["file"].append(file.index)
        c["major"].append(key[0])
        c["minor"].append(key[1])
        c["seq"].append(seq)
        c["chars"].append(cleaned.chars)
        c["n_sentences"].append(len(cleaned.sentences))
        c["content_hash"].append(content_hash(cleaned.sentences))
        c["signature"].append(
            None if self.minhash is None else self.minhash.signature(cleaned.sentences).astype("<u4").tobytes()
        )
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
        result.works, result.rows = [path], self.rows
        stage.complete(path, fp, [work], result.to_json())
        return result


# -- cleaning ----------------------------------------------------------------------------------


USER_ERRORS = (InputError, EOFError, OSError, UnicodeDecodeError, ValueError)


def user_error(file: InputFile, exc: BaseException, cfg: CorpusConfig) -> str:
    """The one-line reason a file cannot be read; raised as InputDataError unless skipping."""
    text = " ".join((str(exc) or type(exc).__name__).split())
    reason = f"{file.uri}: {text.removeprefix(posixpath.basename(file.uri) + ': ')}"
    if cfg.on_error == "raise":
        raise InputDataError(
            f"{reason} (or set corpus.on_error: skip to list the file in the manifest and go on)"
        ) from None
    return reason


def clean_records(work: WorkFile, records, piece: Piece, key, header, cfg: CorpusConfig, result: UnitResult) -> None:
    """Clean records of one piece into `work`, counting what was read and dropped."""
    file = piece.file
    language = file.spec.language
    wiki = None
    screen = Screen.of(cfg, file.spec.quality_filters)
    for seq, raw in enumerate(records):
        result.read[file.index] += 1
        if raw.markup == "wikitext" and wiki is None:
            wiki = Wiki.of(cfg, language, header())
        try:
            outcome = clean_document(raw, cfg, language, wiki, screen)
        except Exception as exc:  # a record that breaks the cleaner must not become a retried crash
            raise InputError(
                f"cleaning the record at byte {raw.offset} ({raw.title[:80]!r}) failed ({type(exc).__name__}: {exc}); "
                "this is a bertpipe bug, please report it with that record",
                raw.offset,
            ) from exc
        identity = doc_id(file.source, file.uri, raw.title)
        counts = result.filters[file.index], result.languages[file.index]
        record_outcome(outcome, identity, file.index, raw, *counts, result.samples)
        if not isinstance(outcome, Cleaned):
            result.dropped[file.index][outcome.reason] += 1
            continue
        work.add(file, key(raw.offset), seq, outcome)
        result.chars.add(len(s) for s in outcome.sentences)
        result.words.add(s.count(" ") + 1 for s in outcome.sentences)
        counts = result.files[file.index]
        counts["long_sentences_split"] += outcome.long_sentences_split
        counts["boilerplate_chars"] += outcome.boilerplate_chars


def count_read(
    result: UnitResult, file: InputFile, stats: ReadStats, compressed: int, decompressed: bool = True
) -> None:
    counts = result.files[file.index]
    counts["compressed_bytes_read"] += compressed
    if decompressed:
        counts["decompressed_bytes"] += stats.decompressed_bytes
    counts["truncated_bytes"] += stats.truncated_bytes
    warc = stats.extra.get("warc", {})
    for kind, n in warc.items():
        counts[f"warc_{kind}"] += n
    if warc.get("malformed"):  # a malformed record is a document read and dropped
        result.read[file.index] += warc["malformed"]
        result.dropped[file.index]["malformed"] += warc["malformed"]
        result.filters[file.index]["malformed/documents"] += warc["malformed"]
    if stats.truncated_records:
        counts["truncated_records"] += stats.truncated_records
        result.read[file.index] += stats.truncated_records
        result.dropped[file.index]["truncated"] += stats.truncated_records
        result.filters[file.index]["truncated/documents"] += stats.truncated_records
