"""What the examples need to know about a vocabulary, as token ids: its special tokens and
their layout (BERT's [CLS] A [SEP] B [SEP], or RoBERTa's <s> A </s></s> B </s> in a
byte-level BPE vocabulary), which pieces continue the word before them (`##` pieces, or
pieces without the `Ġ` word start), and which ids may stand in as random replacements.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ROBERTA_SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
"""RoBERTa's tokens in the roles of SPECIAL_TOKENS (pad, unk, cls, sep, mask), in that order."""
WORD_START = "\u0120"
"""`Ġ`: a byte-level BPE piece that begins with it begins a word."""
_UNUSED = re.compile(r"\[unused\d+\]")

Layout = Literal["bert", "roberta"]


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int
    layout: Layout = "bert"
    """bert: [CLS] A [SEP] B [SEP] with `##` continuations; roberta: <s> A </s></s> B </s>
    with `Ġ` word starts (a byte-level BPE vocabulary)."""

    @classmethod
    def from_vocab(cls, tokens: Sequence[str]) -> SpecialIds:
        """The ids of BERT's [PAD] [UNK] [CLS] [SEP] [MASK], or, in a vocabulary without
        them, RoBERTa's <pad> <unk> <s> </s> <mask>."""
        index = {token: i for i, token in enumerate(tokens)}
        names, layout = SPECIAL_TOKENS, "bert"
        if not any(t in index for t in SPECIAL_TOKENS) and any(t in index for t in ROBERTA_SPECIAL_TOKENS):
            names, layout = ROBERTA_SPECIAL_TOKENS, "roberta"
        missing = [t for t in names if t not in index]
        if missing:
            raise ValueError(f"the vocabulary lacks the special token(s) {', '.join(missing)}")
        return cls(*(index[t] for t in names), layout=layout)

    @property
    def separators(self) -> int:
        """Separator tokens between segments A and B: [SEP], or RoBERTa's </s></s>."""
        return 2 if self.layout == "roberta" else 1

    @property
    def names(self) -> tuple[str, ...]:
        """The tokens of (pad, unk, cls, sep, mask) in this layout."""
        return ROBERTA_SPECIAL_TOKENS if self.layout == "roberta" else SPECIAL_TOKENS

    @property
    def never_masked(self) -> frozenset[int]:
        """Ids that are never prediction targets. [UNK] stays maskable, as in Google's code."""
        return frozenset({self.pad, self.cls, self.sep, self.mask})


@dataclass(frozen=True, eq=False)
class VocabTables:
    """What masking needs to know about a vocabulary (WordPiece or byte-level BPE), as
    id-indexed arrays."""

    special: SpecialIds
    is_continuation: np.ndarray
    """(V,) bool: the token continues the word before it: a `##` piece (WordPiece), or a
    piece without the `Ġ` word start (byte-level BPE; special tokens excepted)."""
    replacement_ids: np.ndarray
    """(R,) int64: ids eligible as random replacements (everything but specials and [unused*])."""

    @property
    def vocab_size(self) -> int:
        return len(self.is_continuation)

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], extra_special: Sequence[str] = ()) -> VocabTables:
        """From the vocabulary in id order (the lines of vocab.txt, or vocab.json's pieces
        by id); the layout (BERT's or RoBERTa's) follows its special tokens."""
        special = SpecialIds.from_vocab(tokens)
        excluded = set(special.names) | set(extra_special)
        if special.layout == "roberta":
            continues = (not t.startswith(WORD_START) and t not in excluded for t in tokens)
        else:
            continues = (t.startswith("##") for t in tokens)
        is_continuation = np.fromiter(continues, dtype=bool, count=len(tokens))
        eligible = [i for i, t in enumerate(tokens) if t not in excluded and not _UNUSED.fullmatch(t)]
        if not eligible:
            raise ValueError("the vocabulary has no ordinary tokens to use as random replacements")
        return cls(special, is_continuation, np.asarray(eligible, dtype=np.int64))
