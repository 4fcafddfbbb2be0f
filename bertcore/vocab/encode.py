"""The token ids of a corpus's sentences, for the examples stage: what
`Tokenizer.encode_batch_fast(sentences, add_special_tokens=False)` gives, for less CPU
(a document's sentences encoded as one text cut at [SEP], ASCII sentences normalised in
Python). WordPiece here; a byte-level BPE goes to bertcore.vocab.bpe.encode_sentences."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer

from bertcore.vocab import bpe, morphemes
from bertcore.vocab.config import SEP

# What BERT's normaliser does to ASCII text: clean_text drops these control characters and
# turns tab, newline and carriage return into spaces; lowercase maps A-Z to a-z; accents,
# Chinese characters and NFC leave ASCII alone.
_ASCII_DROPPED = [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]
_ASCII_CLEAN = {**dict.fromkeys(_ASCII_DROPPED), 0x09: " ", 0x0A: " ", 0x0D: " "}


@dataclass(frozen=True)
class _AsciiPath:
    """ASCII sentences normalised here (a C-level translate and lower) and tokenized by the
    same tokenizer without its normaliser: the same ids for about half the CPU, since the
    library's normaliser tracks every character's alignment. Only for BERT's normaliser
    (optionally followed by NFC), and only for sentences that hold no character an added
    token matched on the raw text starts with (such as `[` of [SEP]), whose matching the
    lowercasing could change."""

    tokenizer: Tokenizer
    table: dict
    lowercase: bool
    marks: str

    def takes(self, sentence: str) -> bool:
        return sentence.isascii() and not any(mark in sentence for mark in self.marks)

    def normalize(self, sentence: str) -> str:
        sentence = sentence.translate(self.table) if self.table else sentence
        return sentence.lower() if self.lowercase else sentence


_ascii_paths: dict[int, tuple[Tokenizer, _AsciiPath | None]] = {}


def _ascii_path(tok: Tokenizer) -> _AsciiPath | None:
    known = _ascii_paths.get(id(tok))
    if known is not None and known[0] is tok:
        return known[1]
    if morphemes.splits_morphemes(tok):
        return None  # a morpheme split (a Python pre-tokenizer, which cannot be serialized) has no shortcut
    state = json.loads(tok.to_str())
    normalizer = state.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    marks = "".join(
        sorted({t["content"][0] for t in state.get("added_tokens", []) if t["content"] and not t.get("normalized")})
    )
    path = None
    if (
        steps
        and steps[0].get("type") == "BertNormalizer"
        and all(s.get("type") == "NFC" for s in steps[1:])
        and not any(m.isalpha() for m in marks)
    ):
        bare = Tokenizer.from_str(json.dumps({**state, "normalizer": None}))
        path = _AsciiPath(
            bare, _ASCII_CLEAN if steps[0].get("clean_text", True) else {}, bool(steps[0].get("lowercase", True)), marks
        )
    if len(_ascii_paths) >= 8:
        _ascii_paths.clear()
    _ascii_paths[id(tok)] = (tok, path)
    return path


def _encode_groups(tok: Tokenizer, groups: list[list[str]], sep: int) -> list[tuple]:
    """(values, lengths) per group of sentences, each group encoded as one text joined by
    [SEP] and cut at the [SEP] ids; a group whose text holds [SEP] itself is encoded
    sentence by sentence."""
    import numpy as np

    out = []
    for group, encoding in zip(
        groups, tok.encode_batch_fast([f" {SEP} ".join(g) for g in groups], add_special_tokens=False)
    ):
        ids = np.asarray(encoding.ids, dtype=np.int64)
        cuts = np.flatnonzero(ids == sep)
        if len(cuts) == len(group) - 1:
            out.append((np.delete(ids, cuts), np.diff(cuts, prepend=-1, append=len(ids)) - 1))
        else:  # a sentence holds [SEP] itself
            each = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch_fast(group, add_special_tokens=False)]
            out.append((np.concatenate(each), np.fromiter(map(len, each), dtype=np.int64, count=len(each))))
    return out


def encode_sentences(tok: Tokenizer, sentences: list[str], bounds) -> tuple:
    """The token ids of every sentence, without special tokens, as (values, lengths): what
    `tok.encode_batch_fast(sentences, add_special_tokens=False)` gives, for less CPU.

    `bounds` (n+1 ints) cut `sentences` into documents. A document's sentences are encoded
    as one text, joined by [SEP]: an added token, which the tokenizer splits off before it
    normalises or pre-tokenizes anything, so each sentence is still normalised and split into
    words on its own; the ids are then cut at the [SEP] ids (about 10% less CPU than one
    encoding per sentence). A document's ASCII sentences go the `_AsciiPath` (about half
    the CPU again). Everything is encoded sentence by sentence when the tokenizer truncates
    or pads. A byte-level BPE (RoBERTa) encodes each sentence after a space but a document's
    first (bertcore.vocab.bpe.encode_sentences)."""
    import numpy as np

    if bpe.is_byte_level(tok):
        return bpe.encode_sentences(tok, sentences, bounds)
    sep = tok.token_to_id(SEP)
    if sep is None or tok.truncation is not None or tok.padding is not None:
        each = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch_fast(sentences, add_special_tokens=False)]
        lengths = np.fromiter(map(len, each), dtype=np.int64, count=len(each))
        return (np.concatenate(each) if each else np.zeros(0, dtype=np.int64)), lengths
    path = _ascii_path(tok)
    fast: tuple[list, list] = ([], [])  # (groups of normalised sentences, their sentence numbers)
    full: tuple[list, list] = ([], [])
    for a, b in zip(np.asarray(bounds[:-1]).tolist(), np.asarray(bounds[1:]).tolist()):
        quick = [i for i in range(a, b) if path is not None and path.takes(sentences[i])]
        slow = [i for i in range(a, b) if path is None or not path.takes(sentences[i])] if len(quick) < b - a else []
        if quick:
            fast[0].append([path.normalize(sentences[i]) for i in quick])
            fast[1].append(quick)
        if slow:
            full[0].append([sentences[i] for i in slow])
            full[1].append(slow)
    parts = []
    if fast[0]:
        parts += zip(fast[1], _encode_groups(path.tokenizer, fast[0], sep))
    if full[0]:
        parts += zip(full[1], _encode_groups(tok, full[0], sep))
    return _in_sentence_order(parts, len(sentences))


def _in_sentence_order(parts: list, n: int) -> tuple:
    """(values, lengths) of n sentences from parts (sentence numbers, (values, lengths))."""
    import numpy as np

    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(n, dtype=np.int64)
    numbers = np.concatenate([np.asarray(number, dtype=np.int64) for number, _ in parts])
    values = np.concatenate([v for _, (v, _) in parts])
    part_lengths = np.concatenate([lengths for _, (_, lengths) in parts])
    lengths = np.zeros(n, dtype=np.int64)
    lengths[numbers] = part_lengths
    starts = np.concatenate([[0], np.cumsum(lengths)])[numbers]  # where each part sentence goes
    part_starts = np.concatenate([[0], np.cumsum(part_lengths)])[:-1]
    out = np.empty(len(values), dtype=np.int64)
    out[np.repeat(starts - part_starts, part_lengths) + np.arange(len(values))] = values
    return out, lengths
