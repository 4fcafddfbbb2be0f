"""Raw text in, clean sentences out: the corpus stage's library.

Owns: the readers (`reader.py` and one module per format: MediaWiki XML in `wikitext.py`
with `wikisite.py` and `wikitemplates.py`, `books.py`, `records.py` for JSONL and Parquet,
`tabular.py`, `warc.py` for WARC/WET), compressed and multistream inputs (`compressed.py`,
`multistream.py`, `gzmembers.py` for per-record gzip), encodings, HTML extraction
(`html.py`), cleaning and normalisation (`encoding.py`, `clean.py`, `normalize.py`),
language identification (`langid.py`) and the quality filters (`quality/`), which
`screen.py` applies, sentence splitting (`sentences.py`), lengths, near-duplicate removal
(`dedup.py`) and the `corpus:` section (`config.py`; pydantic only).

May import: mwparserfromhell, sentencex, datasketch, warcio, resiliparse, lingua, the
compression libraries, and bertcore's top-level helpers (section, errors). Must not import: torch, ray, prefect, or
any other bertcore component.
"""
