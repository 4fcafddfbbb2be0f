"""Language identification (lingua, models in its wheel) on held-out text in known languages:
the Korean law and bill text (konlpy), English news (gensim) and the web sample's pages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertcore.sample_data import WEB_DATA, gensim_data_dir, konlpy_corpus_dir
from bertcore.text.gzmembers import GzipMembers
from bertcore.text.html import main_text_lines
from bertcore.text.langid import detect
from bertcore.text.records import iter_raw_documents

BUILD = Path(__file__).resolve().parents[1] / "support" / "web_sample" / "build_sample.py"


def sample_build():
    """tests/support/web_sample/build_sample.py: each page's URL and language (pages.tsv)."""
    spec = importlib.util.spec_from_file_location("build_sample", BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def korean_documents() -> list[str]:
    """The konlpy Korean text (law and bills; hard-wrapped) in pieces of about 300 characters,
    each made of whole lines."""
    out = []
    for path in sorted(konlpy_corpus_dir().glob("*/*.txt")):
        piece: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            piece.append(line.strip())
            if sum(map(len, piece)) >= 300:
                out.append(" ".join(piece))
                piece = []
    return out


def english_documents() -> list[str]:
    """The 300 English news texts of gensim's lee_background.cor, one per line."""
    lines = (gensim_data_dir() / "lee_background.cor").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()]


def accuracy(documents: list[str], language: str) -> float:
    return sum(detect(d)[0] == language for d in documents) / len(documents)


def test_korean_and_english_text_is_identified():
    korean, english = korean_documents(), english_documents()
    assert len(korean) >= 100 and len(english) >= 290
    ko, en = accuracy(korean, "ko"), accuracy(english, "en")
    print(f"\nlanguage ID: Korean {ko:.1%} of {len(korean)}, English {en:.1%} of {len(english)}")
    assert ko > 0.95 and en > 0.95


def test_web_sample_pages_are_identified():
    """Every page of the web sample that has main text is identified as the language a reader
    gives it (tests/support/web_sample/pages.tsv): German, English, French, Spanish, Latvian,
    Norwegian, Portuguese, Japanese and Chinese."""
    language = {page.url: page.language for page in sample_build().table()}
    with open(WEB_DATA / "sample.warc.gz", "rb") as raw:
        pages = list(iter_raw_documents(GzipMembers(raw), "warc"))
    checked = set()
    for page in pages:
        text = "\n".join(main_text_lines(page.text))
        if not text:  # a login page and a page whose text the extractor removes: no text, no language
            assert detect(text) == ("", 0.0)
            continue
        assert detect(text)[0] == language[page.url], page.url
        checked.add(language[page.url])
    assert len(pages) == 82 and len(checked) == 9


def test_text_without_letters_has_no_language():
    assert detect("") == ("", 0.0)
    assert detect("12345 67 89 -- !!! ###") == ("", 0.0)
