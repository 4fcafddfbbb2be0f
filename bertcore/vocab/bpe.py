"""RoBERTa's byte-level BPE vocabulary (`vocab.model: byte_level_bpe`): train, build, save,
read, and encode a document's sentences.

The tokenizer is RoBERTa's (Liu et al. 2019, GPT-2's byte-level BPE): no normalizer, cased;
tokenizers' ByteLevel pre-tokenizer (GPT-2's splitting regex, every byte shown as a
printable character, a space as `Ġ`) with add_prefix_space off, as RoBERTa has it; BPE
merges; `<s> A </s>` and `<s> A </s></s> B </s>` around the pieces (RobertaProcessing).
The folder holds what transformers' RobertaTokenizer reads: vocab.json (piece -> id),
merges.txt (one merge per line, in the order learned), tokenizer.json, tokenizer_config.json
(add_prefix_space false, model_max_length) and special_tokens_map.json. `<mask>` strips the
space before it (lstrip), so "is <mask>." masks the word with its `Ġ`, as in RoBERTa.

Spaces between sentences. RoBERTa encodes running text, so every word but a document's
first carries the `Ġ` of the space before it. bertpipe's corpus stores sentences; the
examples stage encodes each one with that space in front, except the first sentence of a
document (`encode_sentences`), which gives the pieces that encoding the document's text,
its sentences joined by spaces, would give. Training sees every sentence with the space in
front (`with_space`): sentence-initial words are learned in the form they take inside a
document. This is what tokenizers' ByteLevelBPETokenizer(add_prefix_space=True) trains on
the bare sentences; the saved tokenizer itself adds no space, as RoBERTa's does not.

Training is tokenizers' BpeTrainer as ByteLevelBPETokenizer drives it: the 256 byte
characters as the initial alphabet, the five special tokens first (ids 0-4: <s> <pad> </s>
<unk> <mask>), min_frequency and vocab_size as configured (vocab_size counts the specials and
the bytes). The trainer breaks ties between equally frequent merges by the ids of the
pieces, which are fixed by the alphabet and the merges before them, so the same sentences
give the same vocabulary in any process.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from bertcore.vocab.config import (
    BOS,
    BPE_FILES,
    BPE_MASK,
    BPE_PAD,
    BPE_SPECIAL_TOKENS,
    BPE_UNK,
    EOS,
    MERGES_FILE,
    TOKENIZER_FILE,
    VOCAB_JSON,
    VocabConfig,
    write_transformers_files,
)

_BATCH = 1000
"""Sentences handed to the trainer per batch (one Rust call each)."""

SPECIAL_TOKENS_MAP = {
    "bos_token": BOS,
    "eos_token": EOS,
    "unk_token": BPE_UNK,
    "sep_token": EOS,
    "pad_token": BPE_PAD,
    "cls_token": BOS,
    "mask_token": BPE_MASK,
}
"""RoBERTa's roles of the special tokens, as transformers names them."""


def is_byte_level(tok: Tokenizer) -> bool:
    """Whether `tok` is a byte-level BPE tokenizer (this module's kind)."""
    return isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel)


def with_space(sentence: str) -> str:
    """The sentence as it stands inside running text: after a space (unless it is empty or
    already starts with whitespace)."""
    return sentence if not sentence or sentence[0].isspace() else " " + sentence


# -- the tokenizer -----------------------------------------------------------------------------


def bpe_tokenizer(vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> Tokenizer:
    """RoBERTa's complete tokenizer over `vocab` (piece -> id, contiguous from 0) and
    `merges` (in priority order): see the module docstring."""
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise ValueError("vocabulary ids are not contiguous from 0")
    missing = [t for t in BPE_SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise ValueError(f"vocabulary lacks the special tokens {missing}")
    unknown = sorted({piece for pair in merges for piece in pair if piece not in vocab})
    if unknown:
        raise ValueError(f"merges name pieces the vocabulary lacks: {unknown[:5]}")
    tok = Tokenizer(models.BPE(vocab, list(merges), dropout=None, unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.RobertaProcessing(
        (EOS, vocab[EOS]), (BOS, vocab[BOS]), trim_offsets=True, add_prefix_space=False
    )
    # matched in the raw text and never split; <mask> takes the space before it along
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, lstrip=t == BPE_MASK) for t in BPE_SPECIAL_TOKENS]
    )
    return tok


def vocab_and_merges(tok: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE model's vocabulary (piece -> id) and merges (in priority order)."""
    model = json.loads(tok.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"a {model.get('type')} model, not BPE")
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    return dict(model["vocab"]), merges  # type: ignore[return-value]


def _batches(sentences: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for s in sentences:
        batch.append(with_space(s))
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def train_byte_level_bpe(sentences: Iterable[str], cfg: VocabConfig) -> Tokenizer:
    """Train a byte-level BPE of cfg.vocab_size entries on the first cfg.max_sentences
    sentences (each after a space, `with_space`) and return the finished tokenizer."""
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    work = Tokenizer(models.BPE())
    work.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    work.train_from_iterator(_batches(itertools.islice(sentences, cfg.max_sentences)), trainer=trainer)
    vocab, merges = vocab_and_merges(work)
    return bpe_tokenizer(vocab, merges)


# -- files -------------------------------------------------------------------------------------


def save_bpe(tok: Tokenizer, directory: str, *, model_max_length: int = 512) -> list[str]:
    """Write vocab.json, merges.txt, tokenizer.json, tokenizer_config.json and
    special_tokens_map.json into `directory` (created if missing); return the file names.

    tokenizer_config.json names RobertaTokenizer (transformers 5 rebuilds it from vocab.json,
    merges.txt and the flags here, which say what tokenizer.json does; transformers 4 reads
    tokenizer.json through RobertaTokenizerFast)."""
    if not is_byte_level(tok):
        raise ValueError("not a byte-level BPE tokenizer")
    vocab, merges = vocab_and_merges(tok)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, VOCAB_JSON), "w", encoding="utf-8") as f:
        json.dump(dict(sorted(vocab.items(), key=lambda kv: kv[1])), f, ensure_ascii=False)
    with open(os.path.join(directory, MERGES_FILE), "w", encoding="utf-8", newline="\n") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    tok.save(os.path.join(directory, TOKENIZER_FILE))
    tokenizer_config = {
        "tokenizer_class": "RobertaTokenizer",
        "add_prefix_space": False,
        "trim_offsets": True,
        "errors": "replace",
        "model_max_length": model_max_length,
        "model_input_names": ["input_ids", "attention_mask"],
        "clean_up_tokenization_spaces": False,
        **SPECIAL_TOKENS_MAP,
    }
    write_transformers_files(directory, tokenizer_config, SPECIAL_TOKENS_MAP)
    return list(BPE_FILES)


def read_vocab_json(path: str) -> dict[str, int]:
    """piece -> id of a vocab.json; ValueError unless the ids are contiguous from 0."""
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError("not a JSON object of piece -> id")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("its ids are not contiguous from 0")
    return vocab


def read_merges(path: str) -> list[tuple[str, str]]:
    """The merges of a merges.txt, in order (a `#version` first line is skipped)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = []
    for number, line in enumerate(lines, 1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"line {number} is not two pieces separated by one space")
        merges.append((parts[0], parts[1]))
    return merges


def entries(vocab: dict[str, int]) -> list[str]:
    """The pieces in id order."""
    return sorted(vocab, key=vocab.__getitem__)


# -- encoding ----------------------------------------------------------------------------------


def encode_sentences(tok: Tokenizer, sentences: list[str], bounds) -> tuple:
    """The ids of every sentence, without special tokens, as (values, lengths): each
    sentence after a space except the first of its document (`bounds`, n+1 ints, cut
    `sentences` into documents), as the document's running text would be encoded."""
    import numpy as np

    firsts = set(np.asarray(bounds[:-1]).tolist())
    texts = [s if i in firsts else with_space(s) for i, s in enumerate(sentences)]
    each = [np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]
    lengths = np.fromiter(map(len, each), dtype=np.int64, count=len(each))
    return (np.concatenate(each) if each else np.zeros(0, dtype=np.int64)), lengths
