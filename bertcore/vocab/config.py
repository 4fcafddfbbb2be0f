"""The `vocab:` config section: train a WordPiece (BERT) or byte-level BPE (RoBERTa)
vocabulary on the corpus, or adopt an existing one; the special tokens, id layouts and
file names of both kinds.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from bertcore.errors import ConfigError
from bertcore.section import Section

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
PREFIX = "##"
# Google's BERT vocabularies: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101,
# [SEP]=102, [MASK]=103. Tools hard-code these ids, so the layout keeps them.
NUM_UNUSED = 99
BERT_LAYOUT = (PAD, *(f"[unused{i}]" for i in range(NUM_UNUSED)), UNK, CLS, SEP, MASK)
PLAIN_LAYOUT = SPECIAL_TOKENS

# RoBERTa's byte-level BPE: <s> (the sequence start, BERT's [CLS]), <pad>, </s> (the end and
# the separator, BERT's [SEP]), <unk>, <mask>. A trained vocabulary puts them at ids 0-4, in
# this order (RoBERTa itself has 0-3 and <mask> last; adopted vocabularies keep their ids).
BOS, BPE_PAD, EOS, BPE_UNK, BPE_MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
BPE_SPECIAL_TOKENS = (BOS, BPE_PAD, EOS, BPE_UNK, BPE_MASK)

BYTE_ALPHABET = 256
"""Pieces of one byte each that every byte-level BPE vocabulary holds, so any text is spellable."""

VocabModel = Literal["wordpiece", "byte_level_bpe"]


class AlphabetTooLargeError(ConfigError, ValueError):
    """vocab.vocab_size cannot hold the characters of the training text."""


VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TOKENIZER_FILES = (VOCAB_FILE, TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE)
"""The files of a WordPiece vocabulary folder (what bertcore.vocab.tokenizer.save_tokenizer writes)."""
VOCAB_JSON = "vocab.json"
MERGES_FILE = "merges.txt"
BPE_FILES = (VOCAB_JSON, MERGES_FILE, TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE)
"""The files of a byte-level BPE vocabulary folder (bertcore.vocab.bpe.save_bpe), as
transformers' RobertaTokenizer reads them."""
ALL_TOKENIZER_FILES = (VOCAB_FILE, VOCAB_JSON, MERGES_FILE, TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_FILE)
"""Every file either kind of vocabulary folder may hold."""


def write_transformers_files(directory: str, tokenizer_config: dict, special_tokens: dict) -> None:
    """The two JSON files transformers reads beside tokenizer.json, as both vocabularies
    write them (indented, UTF-8 kept, a final newline)."""
    for name, content in ((CONFIG_FILE, tokenizer_config), (SPECIAL_TOKENS_FILE, special_tokens)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2, ensure_ascii=False)
            f.write("\n")


def tokenizer_files(names) -> list[str]:
    """The vocabulary files among `names` (a folder's listing), in ALL_TOKENIZER_FILES order."""
    present = set(names)
    return [name for name in ALL_TOKENIZER_FILES if name in present]


def entries_file(names) -> str:
    """The file among `names` that lists the entries by id: vocab.json (byte-level BPE) or
    vocab.txt (WordPiece, also when neither is there)."""
    return VOCAB_JSON if VOCAB_JSON in set(names) else VOCAB_FILE


ADOPTED_OPTIONS = ("lowercase", "strip_accents", "tokenize_chinese_chars", "max_input_chars_per_word", "recompose_nfc")
"""The fields an adopted vocabulary brings from its own files (source: pretrained)."""
WORDPIECE_ONLY = (
    "strip_accents",
    "tokenize_chinese_chars",
    "limit_alphabet",
    "max_input_chars_per_word",
    "bert_layout",
    "recompose_nfc",
    "pre_tokenizer",
)
"""Fields a byte-level BPE vocabulary has no use for (its alphabet is the 256 bytes, it
never makes [UNK], its specials are RoBERTa's); setting one to another value than its
default with it is an error."""

WHITESPACE = "whitespace"
PRE_TOKENIZERS = (WHITESPACE, "kiwi", "mecab")
"""vocab.pre_tokenizer: BERT's words, or Korean morphemes by kiwipiepy or python-mecab-ko
(bertcore/vocab/morphemes.py)."""


class VocabConfig(Section):
    """The vocabulary (`vocab:` in a run recipe): WordPiece (BERT) or byte-level BPE
    (RoBERTa), trained on a sample of the corpus or adopted from an existing model (source:
    pretrained)."""

    ADDED_LATER: ClassVar[tuple[str, ...]] = ("model", "pre_tokenizer")

    model: VocabModel = "wordpiece"
    """wordpiece: BERT's WordPiece with `##` continuations and [CLS] [SEP] [MASK]; byte_level_bpe: RoBERTa's byte-level
    BPE (tokenizers' ByteLevel, `Ġ` marks a word start) with <s> <pad> </s> <unk> <mask>, written as vocab.json +
    merges.txt. The examples, the model and the export follow it."""
    source: Literal["train", "pretrained"] = "train"
    """train: learn a vocabulary on the corpus; pretrained: adopt an existing BERT vocabulary (vocab.pretrained) entry
    for entry, with its own casing options, instead of training."""
    pretrained: str | None = None
    """source pretrained: a vocab.txt, a tokenizer.json, or a model folder holding them (local or s3://); a folder's
    tokenizer_config.json (do_lower_case, ...) is honoured. byte_level_bpe: a folder with vocab.json + merges.txt, a
    vocab.json with merges.txt beside it, or a BPE tokenizer.json. Default: the folder of pretrain.init_from."""
    vocab_size: int = Field(30522, gt=0)
    """Entries of the vocabulary, special tokens and [unusedN] included (BERT-base: 30522, RoBERTa: 50265). Training may
    stop short of it when no pair is frequent enough."""
    lowercase: bool = True
    """Lowercase text before WordPiece (an "uncased" model). byte_level_bpe is cased, as RoBERTa: false is its default
    and true an error."""
    strip_accents: bool | None = None
    """Drop combining accents (café -> cafe); None follows `lowercase`, as BERT does. Hangul syllables stay intact
    either way."""
    tokenize_chinese_chars: bool = True
    """Put spaces around every CJK ideograph so each one is a word of its own, as BERT does."""
    min_frequency: int = Field(2, ge=1)
    """A pair of pieces must occur at least this often in the sample to be merged into a new piece."""
    limit_alphabet: int | None = Field(1000, ge=1)
    """Keep at most this many distinct characters (the most frequent; ties by code point); words with any other
    character become [UNK]. None keeps all. Korean needs a few thousand (one per syllable)."""
    max_input_chars_per_word: int = Field(100, ge=1)
    """Words longer than this (in characters, after normalization) become a single [UNK]. Hugging Face uses 100,
    Google's original code 200."""
    bert_layout: bool = True
    """Put [PAD] [UNK] [CLS] [SEP] [MASK] at Google's ids 0/100/101/102/103 with [unused0]..[unused98] at 1-99; false
    puts them at 0-4."""
    max_sentences: int = Field(10_000_000, ge=1)
    """Sentences sampled from the corpus for training; train_wordpiece reads no more than this."""
    recompose_nfc: bool = True
    """After BERT's normalizer, recompose with NFC so Hangul stays as syllables (false: exactly Google's and
    transformers' normalization, Hangul as jamo). An adopted vocabulary follows its source: false for a vocab.txt, what
    its tokenizer.json says."""

    pre_tokenizer: Literal["whitespace", "kiwi", "mecab"] = WHITESPACE
    """How text is cut into words before WordPiece. whitespace: BERT's rule (whitespace, punctuation alone). kiwi /
    mecab: Korean morphemes, by kiwipiepy or python-mecab-ko (pip install either): every morpheme after the first of a
    word (eojeol) is a ## continuation (국민은 -> 국민 ##은), so pieces never cross a morpheme boundary and
    whole-word masking masks whole eojeols. Recorded in tokenizer_config.json; the examples and evaluate stages split
    text the same way; transformers' AutoTokenizer alone does not (docs/stages/vocab.md). An adopted vocabulary keeps
    what its files record."""

    @model_validator(mode="before")
    @classmethod
    def _cased_bpe(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("model") == "byte_level_bpe":
            data = {**data}
            data.setdefault("lowercase", False)
        return data

    @property
    def byte_level(self) -> bool:
        """Whether this is a byte-level BPE (RoBERTa) vocabulary."""
        return self.model == "byte_level_bpe"

    @property
    def strip_accents_effective(self) -> bool:
        """Whether accents are stripped once None is resolved against `lowercase`."""
        return self.lowercase if self.strip_accents is None else self.strip_accents

    @property
    def reserved_tokens(self) -> tuple[str, ...]:
        """The entries that precede every learned piece, in id order."""
        if self.byte_level:
            return BPE_SPECIAL_TOKENS
        return BERT_LAYOUT if self.bert_layout else PLAIN_LAYOUT

    @model_validator(mode="after")
    def _room_for_pieces(self):
        if self.pretrained is not None and self.source != "pretrained":
            raise ValueError(
                "vocab.pretrained is set but vocab.source is train; set vocab.source: pretrained to adopt it"
            )
        if self.byte_level:
            # a value other than the default (a manifest's dump of the section sets them all)
            wordpiece_only = [k for k in WORDPIECE_ONLY if getattr(self, k) != type(self).model_fields[k].default]
            if wordpiece_only:
                raise ValueError(
                    f"vocab.{wordpiece_only[0]} applies to WordPiece only; remove it (vocab.model is byte_level_bpe)"
                )
            if self.lowercase:
                raise ValueError(
                    "vocab.lowercase: byte_level_bpe is cased, as RoBERTa's; set vocab.lowercase: false or "
                    "use vocab.model: wordpiece"
                )
        if self.source == "pretrained":
            return self  # nothing is trained: the size is the adopted vocabulary's
        reserved = len(self.reserved_tokens)
        if self.byte_level and self.vocab_size < reserved + BYTE_ALPHABET:
            raise ValueError(
                f"vocab.vocab_size={self.vocab_size} is smaller than the byte alphabet: {BYTE_ALPHABET} bytes + "
                f"{reserved} special tokens = {reserved + BYTE_ALPHABET}; raise vocab.vocab_size"
            )
        if self.vocab_size <= reserved:
            what = (
                "5 special tokens and 99 [unusedN] entries"
                if self.bert_layout and not self.byte_level
                else "5 special tokens"
            )
            raise ValueError(
                f"vocab.vocab_size={self.vocab_size} leaves no room for learned pieces: "
                f"the {what} already take {reserved} entries; use a larger vocab.vocab_size"
                + (" or vocab.bert_layout=false" if self.bert_layout and not self.byte_level else "")
            )
        return self

    def check_alphabet(self, alphabet_size: int, continuation_size: int = 0) -> None:
        """Raise if the characters alone (`alphabet_size` plain and `continuation_size`
        `##` single-character entries, which WordPiece must all keep so that every word
        is spellable) do not fit in vocab_size beside the reserved entries."""
        needed = len(self.reserved_tokens) + alphabet_size + continuation_size
        if self.vocab_size < needed:
            raise AlphabetTooLargeError(
                f"vocab.vocab_size={self.vocab_size} is smaller than the alphabet: "
                f"{alphabet_size} characters + {continuation_size} '##' continuations + "
                f"{len(self.reserved_tokens)} reserved entries = {needed}; raise vocab.vocab_size "
                f"or lower vocab.limit_alphabet"
            )
