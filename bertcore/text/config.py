"""Configuration of the corpus stage (`corpus:` in a run recipe)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from bertcore.section import DataFile, Name, Section

InputFormat = Literal["auto", "wikipedia", "book", "lines", "jsonl", "parquet"]


class InputSpec(Section):
    """One input of the corpus: a URI or glob plus how to read it."""

    uri: DataFile
    """Local path, glob or fsspec URI (s3://bucket/prefix/*.jsonl); `{demo_data}` is the bundled sample data. Compression (.bz2, .gz, .xz, .zst) is inferred from the name."""
    name: Name | None = None
    """Source label stored with every document and used for per-source statistics; default: the file name of `uri`."""
    format: InputFormat = "auto"
    """wikipedia (MediaWiki pages-articles XML), book (one document per file, blank lines separate paragraphs), lines (one document per line), jsonl, parquet; auto decides from the name and the first bytes."""
    language: str = "en"
    """ISO 639-1 code of the text, used by the sentence segmenter (en, ko, de, ...)."""
    text_column: str = "text"
    """jsonl/parquet: the field holding the document text."""
    title_column: str | None = None
    """jsonl/parquet: the field holding a title or key (part of the document id); None uses the record number."""


class CorpusConfig(Section):
    """Raw files to cleaned, sentence-split, deduplicated Arrow shards."""

    inputs: list[InputSpec] = Field(min_length=1)
    """Input files; a plain string is shorthand for {uri: STRING}."""
    validation_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    """Share of documents held out, chosen by a hash of the document id (stable across seeds and runs)."""
    shard_chars: int = Field(50_000_000, gt=0)
    """Target characters of text per output shard; shards are balanced by characters."""
    split_bytes: int = Field(64 * 2**20, gt=0)
    """Input bytes per work unit: a file larger than this is shared by ceil(size / split_bytes) Ray tasks."""
    min_sentences: int = Field(2, ge=1)
    """Documents with fewer sentences are dropped (reason: too_few_sentences)."""
    min_chars: int = Field(200, ge=0)
    """Documents with fewer characters of text are dropped (reason: too_few_chars)."""
    max_doc_chars: int = Field(20_000_000, gt=0)
    """Documents with more characters are dropped before sentence splitting (reason: too_long)."""
    drop_disambiguation: bool = True
    """Wikipedia: drop disambiguation pages."""
    near_dedup: bool = False
    """Remove near-duplicate documents with MinHash LSH (datasketch)."""
    minhash_threshold: float = Field(0.8, gt=0.0, le=1.0)
    """Estimated Jaccard similarity of word shingles at or above which two documents are near duplicates."""
    minhash_num_perm: int = Field(128, ge=16)
    """MinHash permutations per document."""
    shingle_words: int = Field(5, ge=1)
    """Words per shingle for MinHash."""
    on_error: Literal["raise", "skip"] = "raise"
    """raise: a bad input file stops the stage with one line naming the file; skip: the file is listed under `skipped` in the manifest and the rest is processed."""

    @field_validator("inputs", mode="before")
    @classmethod
    def _strings_are_uris(cls, value):
        if isinstance(value, list):
            return [{"uri": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _limits_consistent(self):
        if self.min_chars > self.max_doc_chars:
            raise ValueError("min_chars must not exceed max_doc_chars")
        return self
