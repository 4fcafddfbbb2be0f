"""Configuration of the corpus stage (`corpus:` in a run recipe)."""

from __future__ import annotations

import codecs
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from bertcore.section import DataFile, Name, Section
from bertcore.text.quality.config import QualityConfig

InputFormat = Literal["auto", "wikipedia", "book", "lines", "jsonl", "tsv", "csv", "parquet", "warc"]


class InputSpec(Section):
    """One input of the corpus: a URI or glob plus how to read it."""

    uri: DataFile
    """Local path, glob or fsspec URI (s3://bucket/prefix/*.jsonl); `{demo_data}` is the bundled sample data.
    Compression (.bz2, .gz, .xz, .zst) is inferred from the name."""
    name: Name | None = None
    """Source label stored with every document and used for per-source statistics; default: the file name of `uri`."""
    format: InputFormat = "auto"
    """wikipedia (MediaWiki pages-articles XML), book (one document per file: hard wraps undone, Project Gutenberg
    licence text removed), lines (one document per line), jsonl, tsv/csv (a header line names the columns), parquet;
    auto decides from the name and the first bytes."""
    language: str = "en"
    """ISO 639-1 code of the text, used by the sentence segmenter (en, ko, de, ...) and for a wiki's back-matter section
    titles."""
    encoding: str = "auto"
    """Text encoding of the file (utf-8, latin-1, cp1252, utf-16, ...); auto: UTF-8, or UTF-16/UTF-32 when the file
    starts with their byte-order mark."""
    text_column: str = "text"
    """jsonl/tsv/csv/parquet: the field or column holding the document text."""
    title_column: str | None = None
    """jsonl/tsv/csv/parquet: the field or column holding a title or key (part of the document id); None uses the
    record's byte offset (parquet: row number)."""
    index: DataFile | None = None
    """Multistream .bz2 dump: its index (offset:page_id:title lines, .txt or .txt.bz2), so tasks can seek to their
    streams; default: the `-index.txt.bz2` file beside the dump, where Wikimedia puts it."""
    include_hidden: bool = False
    """A folder input: also read files whose names start with `.` or `_` (ignored by default and listed under `skipped`
    in the manifest)."""
    quality_filters: bool | None = None
    """Apply `corpus.quality` to this input's documents; default: to web records (WARC/WET) only."""

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        if value != "auto":
            try:
                codecs.lookup(value)
            except LookupError:
                raise ValueError(
                    f"unknown text encoding {value!r} (use auto or a name Python knows: utf-8, latin-1, cp1252, utf-16)"
                ) from None
        return value


class CorpusConfig(Section):
    """Raw files to cleaned, sentence-split, deduplicated Arrow shards."""

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("near_dedup_rule",)

    inputs: list[InputSpec] = Field(min_length=1)
    """Input files; a plain string is shorthand for {uri: STRING}."""
    validation_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    """Share of documents held out, chosen by a hash of the document id (stable across seeds and runs)."""
    shard_chars: int = Field(50_000_000, gt=0)
    """Target characters of text per output shard; shards are balanced by characters."""
    split_bytes: int = Field(64 * 2**20, gt=0)
    """Input bytes per work unit: a larger file is read in ranges of about this size by several Ray tasks (plain XML and
    text by byte range, a multistream .bz2 dump by its streams, a single-stream .bz2 by the bzip2 blocks that start in
    each compressed range); a larger .gz/.xz/.zst (or csv, or non-UTF-8) file is decompressed once by one task that
    hands it to cleaning tasks in batches of this size (at most 4 MiB); small files are grouped up to this size."""
    min_sentences: int = Field(2, ge=1)
    """Documents with fewer sentences are dropped (reason: too_few_sentences)."""
    min_chars: int = Field(200, ge=0)
    """Documents with fewer characters of text are dropped (reason: too_few_chars)."""
    max_doc_chars: int = Field(20_000_000, gt=0)
    """Documents with more characters are dropped before sentence splitting (reason: too_long)."""
    max_sentence_chars: int = Field(1000, ge=50)
    """Sentences longer than this (a table of contents, verse without full stops) are cut at clause punctuation or
    spaces; counted as long_sentences_split in the manifest."""
    quote_split_chars: int = Field(300, ge=0)
    """A sentence segment longer than this is cut at the sentence ends inside its quotation marks (dialogue, which
    sentencex keeps whole); 0: never."""
    back_matter_sections: dict[str, list[str]] = Field(default_factory=dict)
    """Wikipedia: per language code, section titles dropped with their subsections (citations, link lists), replacing
    the built-in list for that language (built in: en, ko, vi, de, fr, ja, zh, bg; see bertcore/text/wikisite.py)."""
    drop_disambiguation: bool = True
    """Wikipedia: drop disambiguation pages."""
    near_dedup: bool = False
    """Remove near-duplicate documents: MinHash signatures of word shingles, LSH bands, candidates checked against the
    estimated Jaccard similarity, all in partitioned Ray tasks."""
    near_dedup_rule: Literal["first", "connected"] = "first"
    """Which near duplicates go. first: walking in input order, a document similar to an earlier kept document is
    removed (a chain A~B~C with A and C dissimilar keeps A and C); connected: every document of a connected group of
    similar documents but its first (the chain keeps A only; datatrove's and NeMo Curator's rule)."""
    minhash_threshold: float = Field(0.8, gt=0.0, le=1.0)
    """Estimated Jaccard similarity of word shingles at or above which two documents are near duplicates."""
    minhash_num_perm: int = Field(128, ge=16)
    """MinHash permutations per document."""
    shingle_words: int = Field(5, ge=1)
    """Words per shingle for MinHash."""
    detect_language: bool = False
    """Identify each document's language with lingua (stored as `language` and `language_score`, counted per language in
    the manifest); on whenever `languages` is set. Off, `language` is empty and sentences are split in the input's
    `language`: detection costs about a third more cleaning CPU on Wikipedia text."""
    languages: list[str] = Field(default_factory=list)
    """ISO 639-1 codes of the languages to keep (e.g. [ko]); documents detected in another language, or below
    `language_threshold`, are dropped (reason: language). Empty: keep every language."""
    language_threshold: float = Field(0.5, ge=0.0, le=1.0)
    """Lowest detection confidence (0-1) at which a document counts as being in its detected language."""
    quality: QualityConfig = Field(default_factory=QualityConfig)
    """Quality filters for web text (Gopher's quality and repetition rules, C4's line filters); see
    docs/stages/corpus.md."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a bad input file stops the stage with one line naming the file; skip: the file is listed under `skipped`
    in the manifest and the rest is processed."""

    @field_validator("inputs", mode="before")
    @classmethod
    def _strings_are_uris(cls, value):
        if isinstance(value, list):
            return [{"uri": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("languages")
    @classmethod
    def _known_languages(cls, value: list[str]) -> list[str]:
        from bertcore.text.langid import known

        unknown = [code for code in value if not known(code)]
        if unknown:
            raise ValueError(f"unknown language code(s) {', '.join(unknown)}: use ISO 639-1 codes such as ko, de, en")
        return value

    @model_validator(mode="after")
    def _limits_consistent(self):
        if self.min_chars > self.max_doc_chars:
            raise ValueError("min_chars must not exceed max_doc_chars")
        return self
