"""Adopting an existing BERT vocabulary instead of training one (`vocab.source: pretrained`).

What is read, from a model folder or the one file named:
- tokenizer.json (a fast tokenizer): the WordPiece entries in id order, and the options
  that decide how text maps to them, from its BertNormalizer (lowercase, strip_accents,
  handle_chinese_chars; NFC after it or not), its WordPiece model (the word length limit)
  and its BertPreTokenizer. Anything else (BPE, another normalizer) is refused.
- vocab.txt: one entry per line, line number = id. Its options come from the
  tokenizer_config.json beside it (do_lower_case, strip_accents, tokenize_chinese_chars,
  as transformers' BertTokenizer reads them); without one, from the vocab section. Google's
  tokenizer has no NFC step, so neither has the adopted one unless the section says so.
With both files, the entries must agree line for line and tokenizer_config.json's
do_lower_case must agree with tokenizer.json. A bertpipe vocabulary's tokenizer_config.json
also says whether its text was split into Korean morphemes (bertcore/vocab/morphemes.py);
the adopted vocabulary keeps that split. BERT's own files imply none, which the recipe may
override (vocab.pre_tokenizer).

The entries are kept as they are, one for one; the tokenizer is the one bertcore builds
for a trained vocabulary (bertcore.vocab.tokenizer.tokenizer_from_vocab) over them, with the
adopted options, so later stages read both kinds of vocabulary the same way. An option
the recipe sets explicitly and the files contradict is an error naming both.

A byte-level BPE (RoBERTa's, `vocab.model: byte_level_bpe`, `read_bpe_vocabulary`) is read
from vocab.json + merges.txt, or from a tokenizer.json whose model is a BPE under the
ByteLevel pre-tokenizer; with both, they must hold the same entries and merges. Entries
keep their ids (RoBERTa's <mask> is its last entry) and merges their order; the tokenizer
is bertcore.vocab.bpe's over them, so it splits text as a trained one does (no prefix
space, as RoBERTa's own).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from bertcore.errors import ConfigError, InputDataError
from bertcore.vocab import bpe
from bertcore.vocab.config import ADOPTED_OPTIONS, PRE_TOKENIZERS, WHITESPACE, VocabConfig
from bertcore.vocab.morphemes import PRE_TOKENIZER_KEY
from bertcore.vocab.tokenizer import read_vocab, tokenizer_from_vocab, tokenizer_options, vocab_list

GOOGLE_DEFAULTS = {"recompose_nfc": False, "max_input_chars_per_word": 100}
"""Options of a vocab.txt read without a tokenizer.json: what transformers' BertTokenizer
does (no NFC step, words over 100 characters are [UNK]); the recipe may set others."""


@dataclass
class AdoptedVocabulary:
    tokens: list[str]
    """The entries in id order."""
    found: dict[str, Any] = field(default_factory=dict)
    """Options the files state (they win over the section's defaults)."""
    assumed: dict[str, Any] = field(default_factory=dict)
    """Options the files imply without stating them (the section may override these)."""
    read_from: list[str] = field(default_factory=list)

    def config(self, section: VocabConfig) -> VocabConfig:
        """The section with the adopted options; one the recipe set otherwise is a ConfigError."""
        for key, value in self.found.items():
            if (
                key in section.model_fields_set
                and section.model_dump()[key] is not None
                and _effective(section, key) != value
            ):
                raise ConfigError(
                    f"vocab.{key} is {_effective(section, key)!r} but {', '.join(self.read_from)} says {value!r}; "
                    f"remove vocab.{key}: an adopted vocabulary keeps its own options"
                )
        assumed = {k: v for k, v in self.assumed.items() if k not in section.model_fields_set}
        return section.model_copy(update={**assumed, **self.found})

    def tokenizer(self, section: VocabConfig) -> Tokenizer:
        try:
            return tokenizer_from_vocab(self.tokens, self.config(section))
        except ValueError as exc:
            raise InputDataError(
                f"{self.read_from[0]}: {exc}; only BERT vocabularies with [PAD] [UNK] [CLS] [SEP] [MASK] can be adopted"
            ) from None


def _effective(section: VocabConfig, key: str) -> Any:
    return section.strip_accents_effective if key == "strip_accents" else getattr(section, key)


def read_vocabulary(
    *, vocab_txt: str | None = None, tokenizer_json: str | None = None, tokenizer_config: str | None = None
) -> AdoptedVocabulary:
    """The vocabulary of these local files (at least one of vocab_txt and tokenizer_json)."""
    if tokenizer_json is None and vocab_txt is None:
        raise ValueError("read_vocabulary needs a vocab.txt or a tokenizer.json")
    if tokenizer_json is not None:
        adopted = _from_tokenizer_json(tokenizer_json)
        if vocab_txt is not None:
            _same_entries(vocab_txt, read_vocab(vocab_txt), tokenizer_json, adopted.tokens)
            adopted.read_from.append(vocab_txt)
    else:
        adopted = AdoptedVocabulary(read_vocab(vocab_txt), assumed=dict(GOOGLE_DEFAULTS), read_from=[vocab_txt])
    if tokenizer_config is not None:
        flags = _config_flags(tokenizer_config)
        for key, value in flags.items():
            if key in adopted.found and adopted.found[key] != value:
                raise InputDataError(
                    f"{tokenizer_config}: {key} is {value!r} but {tokenizer_json} says "
                    f"{adopted.found[key]!r}; the files disagree"
                )
        adopted.found = {**flags, **adopted.found}
        adopted.read_from.append(tokenizer_config)
    if "pre_tokenizer" not in adopted.found:
        adopted.assumed["pre_tokenizer"] = WHITESPACE  # BERT's own files know no morpheme split
    return adopted


def _from_tokenizer_json(path: str) -> AdoptedVocabulary:
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        tokenizer = Tokenizer.from_file(path)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a plain Exception on a bad file
        raise InputDataError(f"{path}: not a tokenizers JSON file ({' '.join(str(exc).split())[:200]})") from None
    kind = (state.get("model") or {}).get("type")
    options = tokenizer_options(state)
    problems = [
        (kind != "WordPiece", f"a {kind} model, not WordPiece"),
        ("normalizer" in options, "a normalizer other than BERT's (BertNormalizer, optionally followed by NFC)"),
        (
            options.get("pre_tokenizer") != "BertPreTokenizer",
            f"the pre-tokenizer {options.get('pre_tokenizer')}, not BertPreTokenizer",
        ),
        (
            options.get("continuing_subword_prefix") not in (None, "##"),
            f"the continuation prefix {options.get('continuing_subword_prefix')!r}, not ##",
        ),
        (options.get("clean_text") is False, "clean_text off"),
    ]
    for bad, what in problems:
        if bad:
            hint = "; set vocab.model: byte_level_bpe to adopt a RoBERTa vocabulary" if kind == "BPE" else ""
            raise InputDataError(
                f"{path}: {what}; only BERT (WordPiece) vocabularies can be adopted with vocab.model wordpiece{hint}"
            )
    found = {key: options[key] for key in ADOPTED_OPTIONS if options.get(key) is not None}
    try:
        tokens = vocab_list(tokenizer)
    except ValueError as exc:
        raise InputDataError(f"{path}: {exc}") from None
    return AdoptedVocabulary(tokens, found=found, read_from=[path])


def _same_entries(vocab_path: str, lines: list[str], json_path: str, tokens: list[str]) -> None:
    for i, (a, b) in enumerate(itertools.zip_longest(lines, tokens)):
        if a != b:
            raise InputDataError(
                f"{vocab_path} line {i + 1} is {a!r} but {json_path} has {b!r} at id {i}; the two files are "
                "of different vocabularies"
            )


def _config_flags(path: str) -> dict[str, Any]:
    """Casing options in a tokenizer_config.json, as transformers' BertTokenizer reads them
    (do_lower_case defaults to true; strip_accents null follows it), and the morpheme split
    a bertpipe vocabulary records (bertcore/vocab/morphemes.py; none: whitespace)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputDataError(f"{path}: cannot read it ({exc})") from None
    lowercase = bool(data.get("do_lower_case", True))
    strip = data.get("strip_accents")
    flags = {
        "lowercase": lowercase,
        "strip_accents": lowercase if strip is None else bool(strip),
        "tokenize_chinese_chars": bool(data.get("tokenize_chinese_chars", True)),
    }
    if PRE_TOKENIZER_KEY in data:
        if data[PRE_TOKENIZER_KEY] not in PRE_TOKENIZERS:
            raise InputDataError(
                f"{path}: {PRE_TOKENIZER_KEY} is {data[PRE_TOKENIZER_KEY]!r}, not one of {', '.join(PRE_TOKENIZERS)}"
            )
        flags["pre_tokenizer"] = data[PRE_TOKENIZER_KEY]
    return flags


def read_bpe_vocabulary(
    *, vocab_json: str | None = None, merges_txt: str | None = None, tokenizer_json: str | None = None
) -> Tokenizer:
    """The byte-level BPE tokenizer of these local files: vocab.json + merges.txt, or a
    tokenizer.json, or all three (which must agree); see the module docstring."""
    if (vocab_json is None) != (merges_txt is None):
        have, lack = (vocab_json, "merges.txt") if merges_txt is None else (merges_txt, "vocab.json")
        raise InputDataError(
            f"{have}: a byte-level BPE needs vocab.json and merges.txt together; {lack} is missing beside it"
        )
    if vocab_json is None and tokenizer_json is None:
        raise ValueError("read_bpe_vocabulary needs vocab.json + merges.txt or a tokenizer.json")
    vocab = merges = None
    if vocab_json is not None:
        vocab = _read(vocab_json, bpe.read_vocab_json)
        merges = _read(merges_txt, bpe.read_merges)
    if tokenizer_json is not None:
        state = _read(tokenizer_json, _json_state)
        model, pre = state.get("model") or {}, state.get("pre_tokenizer") or {}
        if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
            raise InputDataError(
                f"{tokenizer_json}: a {model.get('type')} model under the {pre.get('type')} pre-tokenizer, "
                "not a byte-level BPE; "
                "vocab.model: byte_level_bpe adopts RoBERTa/GPT-2 vocabularies (use vocab.model: wordpiece "
                "for a BERT one)"
            )
        theirs = bpe.vocab_and_merges(Tokenizer.from_str(json.dumps(state)))
        if vocab is None:
            vocab, merges = theirs
        elif theirs != (vocab, merges):
            what = "entries" if theirs[0] != vocab else "merges"
            raise InputDataError(
                f"{tokenizer_json} and {vocab_json} + {merges_txt} hold different {what}; the files are of "
                "different vocabularies"
            )
    where = vocab_json or tokenizer_json
    try:
        return bpe.bpe_tokenizer(vocab, merges)
    except ValueError as exc:
        raise InputDataError(
            f"{where}: {exc}; only RoBERTa-style vocabularies with <s> <pad> </s> <unk> <mask> can be adopted"
        ) from None


def _read(path: str, reader):
    try:
        return reader(path)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputDataError(f"{path}: cannot read it ({' '.join(str(exc).split())[:200]})") from None


def _json_state(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    if not isinstance(state, dict):
        raise ValueError("not a tokenizers JSON object")
    return state
