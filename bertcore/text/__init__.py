"""Raw text in, clean sentences out: the corpus stage's library.

Owns: the readers (`reader.py` and one module per format: MediaWiki XML in `wikitext.py`
with `wikisite.py` and `wikitemplates.py`, `books.py`, `records.py` for JSONL and Parquet,
`tabular.py`), compressed and multistream inputs (`compressed.py`, `multistream.py`),
encodings, cleaning and normalisation (`encoding.py`, `clean.py`, `normalize.py`),
sentence splitting (`sentences.py`), lengths, near-duplicate removal (`dedup.py`) and the
`corpus:` section (`config.py`; pydantic only).

May import: mwparserfromhell, sentencex, datasketch, the compression libraries, and
bertcore's top-level helpers (section, errors). Must not import: torch, ray, prefect, or
any other bertcore component.
"""
