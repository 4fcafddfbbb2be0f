"""Korean morphemes before WordPiece (`vocab.pre_tokenizer: kiwi | mecab`).

Korean attaches particles and endings to the word they follow: 국민은, 국민이, 국민의 are
one noun and three particles, written as three whitespace-delimited words (eojeols). Split
on whitespace only, as BERT does, a vocabulary spends entries on every inflected form.
Here a morphological analyser (kiwipiepy's Kiwi, or MeCab-ko through python-mecab-ko) cuts
each word at its morpheme boundaries first, and every morpheme after the first of a word is
handed to WordPiece as a continuation: 국민은 -> 국민 ##은. So

- WordPiece never learns a piece that crosses a morpheme boundary;
- the ids still say where an eojeol starts (a `##` piece continues the word before it), so
  whole-word masking masks whole eojeols with no change to the masking code;
- pieces spell the text back, and offsets point into the original text.

Everything else is BERT's rule (bertcore/vocab/tokenizer.py): the normalizer runs first,
punctuation is a word of its own and a piece after it starts a new word, CJK ideographs
are spaced out by the normalizer. The cut points are the analyser's morpheme starts within
a run of word characters, except where morphemes overlap (했 = 하 + 었 is one piece).

The split is a Python pre-tokenizer attached to a loaded tokenizer (`with_morphemes`); the
tokenizer.json file keeps BERT's pre-tokenizer, since tokenizers cannot call an analyser.
Which split a vocabulary was trained with is recorded in its tokenizer_config.json
(`PRE_TOKENIZER_KEY`), and every reader goes through `split_as_recorded`, so the vocab,
examples and evaluate stages split text the same way. transformers' AutoTokenizer alone
does not: `HOW_TO_LOAD` is the call, written into tokenizer_config.json as well.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from tokenizers import NormalizedString, PreTokenizedString, pre_tokenizers

from bertcore.errors import ConfigError, InputDataError
from bertcore.vocab.config import CONFIG_FILE, PRE_TOKENIZERS, PREFIX, WHITESPACE

log = logging.getLogger(__name__)

PRE_TOKENIZER_KEY = "bertpipe_pre_tokenizer"
"""tokenizer_config.json: the split the vocabulary was trained with (absent: whitespace)."""
ANALYZER_KEY = "bertpipe_morpheme_analyzer"
"""tokenizer_config.json: the analyser's packages and versions at training time."""
NOTE_KEY = "bertpipe_note"
"""tokenizer_config.json: what a transformers user must do (HOW_TO_LOAD)."""

HOW_TO_LOAD = (
    "transformers' tokenizer alone does not split Korean morphemes; this vocabulary was trained on text "
    "split by {name} ({package}). "
    "Tokenize as bertpipe did with: {call}  (folder: this folder; needs bertpipe and {package})"
)


def run_note(name: str, folder: str) -> str:
    """The line a run or an export prints under a model folder whose vocabulary splits morphemes."""
    return (
        f"its tokenizer splits {name} morphemes, which AutoTokenizer alone does not; tokenize as in training "
        f"with: {load_call(folder)}"
    )


def load_call(folder: str = "folder") -> str:
    """The exact Python that loads a morpheme vocabulary's tokenizer splitting as in training."""
    where = folder if folder == "folder" else json.dumps(folder)
    return (
        "from transformers import AutoTokenizer; from bertcore.vocab.morphemes import split_as_recorded; "
        f"tokenizer = split_as_recorded(AutoTokenizer.from_pretrained({where}), {where})"
    )


PACKAGES = {
    "kiwi": ("kiwipiepy", "kiwipiepy", ("kiwipiepy", "kiwipiepy_model")),
    "mecab": ("mecab", "python-mecab-ko", ("python-mecab-ko", "python-mecab-ko-dic")),
}
"""pre_tokenizer -> (module to import, package to pip install, distributions whose versions are recorded)."""

TRAINING_MARK = "\x00"
"""Put before a continuation morpheme when training instead of `##`: the trainer spells a
word's first character without `##`, but drops a character outside the alphabet, so
"\\x00은" becomes the single symbol `##은`. The normalizer removes NUL from text, so the mark
is never a character of the alphabet."""


class MorphemeAnalyzerMissing(ConfigError):
    """vocab.pre_tokenizer names an analyser whose package is not installed."""


# -- analysers ----------------------------------------------------------------------------------


class _Kiwi:
    def __init__(self) -> None:
        from kiwipiepy import Kiwi

        self._kiwi = Kiwi(num_workers=1)  # one thread: a task holds one CPU

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(t.start, t.start + t.len) for t in self._kiwi.tokenize(text)]


class _Mecab:
    def __init__(self) -> None:
        import mecab

        self._mecab = mecab.MeCab()

    def spans(self, text: str) -> list[tuple[int, int]]:
        return [(m.span.start, m.span.end) for m in self._mecab.parse(text)]


def require(name: str) -> None:
    """Raise MorphemeAnalyzerMissing (one line) when `name`'s package cannot be imported."""
    if name == WHITESPACE:
        return
    module, package, _ = PACKAGES[name]
    try:
        __import__(module)
    except ImportError as exc:
        raise MorphemeAnalyzerMissing(
            f"vocab.pre_tokenizer is {name} but {package} is not installed ({exc}); "
            f"install it with `pip install {package}`, or set vocab.pre_tokenizer to "
            + " or ".join(n for n in PRE_TOKENIZERS if n != name)
        ) from None


@functools.cache
def analyzer(name: str) -> Analyzer:
    """The analyser of `name`, loaded once per process (Kiwi's model takes seconds)."""
    require(name)
    return Analyzer(name, _Kiwi() if name == "kiwi" else _Mecab())


def analyzer_versions(name: str) -> str:
    """ "kiwipiepy 0.24.1, kiwipiepy_model 0.24.0": what decides the split besides the text."""
    found = []
    for dist in PACKAGES[name][2]:
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


class Analyzer:
    """Morpheme cut points of a text, and the text's words as WordPiece gets them."""

    def __init__(self, name: str, backend: _Kiwi | _Mecab) -> None:
        self.name = name
        self._backend = backend
        self._lock = threading.Lock()  # tokenizers may call from several threads; MeCab's tagger is not shared safely

    def cuts(self, text: str) -> set[int]:
        """Character offsets in `text` where a morpheme starts after another has ended (an
        offset inside overlapping morphemes, 했 = 하 + 었, is no cut)."""
        stripped = text.strip()
        if not stripped:
            return set()
        shift = len(text) - len(text.lstrip())
        with self._lock:
            spans = sorted(self._backend.spans(stripped))
        out, end = set(), 0
        for start, stop in spans:
            if start >= end:
                out.add(start + shift)
            end = max(end, stop)
        return out

    def words(self, text: str) -> list[tuple[int, int, bool]]:
        """(start, end, continues) of each word of normalized `text`: BERT's words (split at
        whitespace, punctuation alone) cut again at morpheme starts; `continues` marks a
        morpheme that is not the first of its word."""
        cuts = self.cuts(text)
        out: list[tuple[int, int, bool]] = []
        run = piece = -1  # start of the current run of word characters, and of its current piece
        for i, c in enumerate(text):
            kind = char_kind(c)
            if kind == "word":
                if run < 0:
                    run = piece = i
                elif i in cuts:
                    out.append((piece, i, piece != run))
                    piece = i
                continue
            if run >= 0:
                out.append((piece, i, piece != run))
                run = -1
            if kind == "punct":
                out.append((i, i + 1, False))
        if run >= 0:
            out.append((piece, len(text), piece != run))
        return out


_BERT = pre_tokenizers.BertPreTokenizer()


@functools.lru_cache(maxsize=1 << 16)
def char_kind(c: str) -> str:
    """How BertPreTokenizer treats `c`: "space" (splits, dropped), "punct" (a word of its
    own) or "word". Asked of the pre-tokenizer itself, so the Unicode tables are its own."""
    pieces = [p for p, _ in _BERT.pre_tokenize_str(f"a{c}a")]
    if pieces == ["a", "a"]:
        return "space"
    if pieces == ["a", c, "a"]:
        return "punct"
    return "word"


# -- the pre-tokenizer --------------------------------------------------------------------------


class MorphemePreTokenizer:
    """A tokenizers custom pre-tokenizer: BERT's words cut at morpheme starts, each
    continuation morpheme prefixed with `mark` (`##` to encode, TRAINING_MARK to train)."""

    def __init__(self, analyzer: Analyzer, mark: str = PREFIX) -> None:
        self.analyzer = analyzer
        self.mark = mark

    def _split(self, _: int, normalized: NormalizedString) -> list[NormalizedString]:
        pieces = []
        for start, end, continues in self.analyzer.words(normalized.normalized):
            piece = normalized[start:end]
            if continues:
                piece.prepend(self.mark)  # aligned to the morpheme's first character: offsets stay in the text
            pieces.append(piece)
        return pieces

    def pre_tokenize(self, pretok: PreTokenizedString) -> None:
        pretok.split(self._split)


def pre_tokenizer(name: str, mark: str = PREFIX) -> pre_tokenizers.PreTokenizer:
    """The morpheme pre-tokenizer of analyser `name` (not serializable: attach it after loading)."""
    return pre_tokenizers.PreTokenizer.custom(MorphemePreTokenizer(analyzer(name), mark))


def with_morphemes(tokenizer: Any, name: str) -> Any:
    """`tokenizer` (a tokenizers.Tokenizer or a transformers fast tokenizer) splitting
    morphemes with analyser `name` before WordPiece; whitespace leaves it as it is. The
    tokenizer is changed in place and returned; it can no longer be saved or pickled."""
    if name == WHITESPACE:
        return tokenizer
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"unknown pre-tokenizer {name!r}; one of {', '.join(PRE_TOKENIZERS)}")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    backend.pre_tokenizer = pre_tokenizer(name)
    return tokenizer


def splits_morphemes(tokenizer: Any) -> bool:
    """Whether `tokenizer` (a tokenizers.Tokenizer or a transformers fast tokenizer) has a
    morpheme pre-tokenizer attached (a custom one: the library's own have their own types)."""
    return type(getattr(tokenizer, "backend_tokenizer", tokenizer).pre_tokenizer) is pre_tokenizers.PreTokenizer


# -- what the vocabulary's files record ---------------------------------------------------------


def recorded(directory: str) -> dict[str, Any]:
    """The morpheme fields of `directory`'s tokenizer_config.json ({} for a whitespace
    vocabulary, or a folder without the file)."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputDataError(f"{path}: cannot read it ({exc})") from None
    name = data.get(PRE_TOKENIZER_KEY, WHITESPACE)
    if name not in PRE_TOKENIZERS:
        raise InputDataError(
            f"{path}: {PRE_TOKENIZER_KEY} is {name!r}, not one of {', '.join(PRE_TOKENIZERS)}; rerun the vocab stage"
        )
    if name == WHITESPACE:
        return {}
    return {key: data[key] for key in (PRE_TOKENIZER_KEY, ANALYZER_KEY, NOTE_KEY) if key in data}


def recorded_pre_tokenizer(directory: str) -> str:
    """The split `directory`'s vocabulary was trained with: whitespace, kiwi or mecab."""
    return recorded(directory).get(PRE_TOKENIZER_KEY, WHITESPACE)


def config_fields(name: str) -> dict[str, str]:
    """What save_tokenizer adds to tokenizer_config.json for pre-tokenizer `name` (nothing
    for whitespace, so a whitespace vocabulary's files stay as they were)."""
    if name == WHITESPACE:
        return {}
    return {
        PRE_TOKENIZER_KEY: name,
        ANALYZER_KEY: analyzer_versions(name),
        NOTE_KEY: HOW_TO_LOAD.format(name=name, package=PACKAGES[name][1], call=load_call()),
    }


def split_as_recorded(tokenizer: Any, directory: str) -> Any:
    """`tokenizer`, loaded from `directory`, splitting text as the vocabulary's own files
    say it was split for training: the one place every stage that reads a vocabulary (or a
    model folder holding one) goes through. Logs a warning when the installed analyser is
    not the version the vocabulary was trained with (its split may differ here and there)."""
    found = recorded(directory)
    name = found.get(PRE_TOKENIZER_KEY, WHITESPACE)
    if name != WHITESPACE:
        require(name)
        installed = analyzer_versions(name)
        if found.get(ANALYZER_KEY) not in (None, installed):
            log.warning(
                "%s: the vocabulary was split by %s; installed is %s", directory, found[ANALYZER_KEY], installed
            )
    return with_morphemes(tokenizer, name)


def split_words(texts: Sequence[str], name: str) -> list[list[str]]:
    """Each normalized text's words as the morpheme pre-tokenizer gives them (continuations
    with `##`), for reading and tests."""
    pre = pre_tokenizer(name)
    return [[w for w, _ in pre.pre_tokenize_str(t)] for t in texts]
