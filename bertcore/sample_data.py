"""Where the bundled sample data lives: real text shipped inside PyPI wheels (see README).

gensim ships an English Wikipedia pages-articles dump, news text and a sentiment file under
gensim/test/test_data/; konlpy ships Korean law and bill text under konlpy/data/corpus/.
Both are installed by the `demo` extra. bertpipe ships a few small evaluation task files of
its own in bertcore/task_data/ (see the README there). Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertcore.errors import BertpipeError

ENWIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NEWS_TEXT = "lee_background.cor"
SENTIMENT = "pang_lee_polarity.cor"


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BertpipeError(
            f"the sample data needs the `{package}` package: pip install 'bertpipe[demo]'"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def gensim_data_dir() -> Path:
    """Folder with the English Wikipedia sample dump, news text and sentiment file."""
    return _package_dir("gensim") / "test" / "test_data"


def konlpy_corpus_dir() -> Path:
    """Folder with Korean text (kolaw/, kobill/)."""
    return _package_dir("konlpy") / "data" / "corpus"



TASK_DATA = Path(__file__).resolve().parent / "task_data"
"""bertpipe's own small evaluation task files (`{task_data}` in recipes)."""


def expand_placeholders(uri: str) -> str:
    """`{demo_data}`, `{korean_data}` and `{task_data}` in a path or URI become the folders
    of the bundled sample data (a package is looked up only when its placeholder is there)."""
    if "{demo_data}" in uri:
        uri = uri.replace("{demo_data}", str(gensim_data_dir()))
    if "{korean_data}" in uri:
        uri = uri.replace("{korean_data}", str(konlpy_corpus_dir()))
    return uri.replace("{task_data}", str(TASK_DATA))
