"""Share of sentences over 600 characters in novels, without and with the split inside
quotation marks (corpus.quote_split_chars), through the corpus stage's cleaning (`book`).

    python benchmarks/long_sentences.py NOVEL.txt [NOVEL.txt ...]

Measured on the six Project Gutenberg novels of Jane Austen that Debian's
r-cran-janeaustenr package holds (as R data: read them with the `rdata` package, one text
line per element; docs/stages/corpus.md has the figures). No Project Gutenberg text ships
in a package bertpipe depends on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bertcore.text.clean import clean_document
from bertcore.text.config import CorpusConfig
from bertcore.text.reader import RawDocument

LONG = 600


def measure(paths: list[Path], quote_split_chars: int) -> tuple[int, int, int]:
    """(sentences, sentences over LONG characters, the longest) over the books."""
    cfg = CorpusConfig(inputs=["x"], detect_language=False, quote_split_chars=quote_split_chars)
    total = over = longest = 0
    for path in paths:
        book = clean_document(RawDocument(path.name, path.read_text(encoding="utf-8"), "plain", 0), cfg, "en")
        total += len(book.sentences)
        over += sum(len(s) > LONG for s in book.sentences)
        longest = max(longest, *map(len, book.sentences))
    return total, over, longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("books", nargs="+", type=Path)
    args = parser.parse_args()
    print(f"{'book':<24} {'quotes split':>12} {'sentences':>10} {'over 600':>9} {'share':>7}")
    for paths in [[p] for p in args.books] + ([args.books] if len(args.books) > 1 else []):
        name = paths[0].stem if len(paths) == 1 else "all"
        for label, chars in (("no", 0), ("yes", CorpusConfig.model_fields["quote_split_chars"].default)):
            total, over, _ = measure(paths, chars)
            print(f"{name:<24} {label:>12} {total:>10} {over:>9} {over / total:>7.2%}")


if __name__ == "__main__":
    main()
