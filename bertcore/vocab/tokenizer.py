"""BERT WordPiece vocabulary: train, lay out, save, load, measure (encoding a corpus's
sentences with it is bertcore/vocab/encode.py; the byte-level BPE is bpe.py).

The output is what Google's BERT and `transformers` expect: a `vocab.txt` (one entry per
line, line number = id) and a `tokenizer.json` whose pieces equal those of the reference
BasicTokenizer + WordpieceTokenizer over that `vocab.txt`, except in two classes of text
(tests/unit/test_tokenizer_fidelity.py pins both):

- Hangul and other letters that NFD splits without producing a mark. Google's uncased
  normalizer lowercases, applies NFD and drops every nonspacing mark (Mn); NFD turns each
  Hangul syllable into conjoining jamo (U+1100-U+11FF, category Lo), so Google's tokenizer
  sees Korean as jamo. Here the same BertNormalizer runs and is followed by NFC: Latin
  accents are gone by then (café -> cafe), and NFC only recomposes what survived, i.e.
  the jamo into syllables (and the two-part vowel signs of some Indic scripts, Mc). The
  cased path gets the same NFC, which the reference also applies.
- A capital sigma at the end of a word, uncased: Python's str.lower() gives "ς", the
  tokenizers library lowercases character by character ("σ"), as every Hugging Face fast
  BERT tokenizer does.

Training uses Hugging Face's WordPiece trainer (BPE-style merges with `##`
continuations). That trainer numbers the `##x` symbols in hash-map order and breaks ties
between equally frequent merges (and characters at the alphabet limit) by those numbers,
so two processes given the same text order, and near the size limit choose, pieces
differently. `train_wordpiece` chooses the alphabet itself and hands the trainer every
starting symbol with a fixed id, which makes it deterministic.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertcore.errors import InputDataError
from bertcore.vocab import bpe, morphemes
from bertcore.vocab.config import (  # noqa: F401 - re-exported; the names live with the section, without tokenizers
    BPE_UNK,
    CLS,
    CONFIG_FILE,
    MASK,
    PAD,
    PREFIX,
    SEP,
    SPECIAL_TOKENS,
    SPECIAL_TOKENS_FILE,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    UNK,
    VOCAB_FILE,
    VOCAB_JSON,
    WHITESPACE,
    VocabConfig,
    write_transformers_files,
)

# Text handed to the trainer in strings of about this many characters: one Rust call per
# chunk instead of one per sentence, and enough chunks to keep its threads busy.
_CHUNK_CHARS = 1 << 20


class VocabFilesMismatchError(InputDataError, ValueError):
    """vocab.txt and tokenizer.json in one directory describe different vocabularies."""


# -- pipeline pieces -------------------------------------------------------------------


def build_normalizer(cfg: VocabConfig) -> normalizers.Normalizer:
    """BERT's normalizer (clean text, space CJK, strip accents, lowercase), then NFC so
    that what NFD split apart without a mark to drop (Hangul jamo) is whole again (unless
    cfg.recompose_nfc is off: then exactly BERT's)."""
    bert = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=cfg.tokenize_chinese_chars,
        strip_accents=cfg.strip_accents_effective,
        lowercase=cfg.lowercase,
    )
    return normalizers.Sequence([bert, normalizers.NFC()] if cfg.recompose_nfc else [bert])


def tokenizer_from_vocab(vocab: list[str], cfg: VocabConfig) -> Tokenizer:
    """The complete BERT tokenizer over `vocab` (index = id): normalizer, BasicTokenizer-
    style pre-tokenizer, WordPiece, `[CLS] A [SEP] B [SEP]` with type ids 0/1, decoder."""
    ids = {piece: i for i, piece in enumerate(vocab)}
    if len(ids) != len(vocab):
        dupes = sorted(p for p, n in Counter(vocab).items() if n > 1)
        raise ValueError(f"vocabulary has duplicate entries: {dupes[:5]}")
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    if missing:
        raise ValueError(f"vocabulary lacks the special tokens {missing}")
    tok = Tokenizer(
        models.WordPiece(
            ids,
            unk_token=UNK,
            continuing_subword_prefix=PREFIX,
            max_input_chars_per_word=cfg.max_input_chars_per_word,
        )
    )
    tok.normalizer = build_normalizer(cfg)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, ids[CLS]), (SEP, ids[SEP])],
    )
    tok.decoder = decoders.WordPiece(prefix=PREFIX)
    # Special tokens are matched in raw text before normalization and never split; the
    # ids they already have in the vocabulary are kept.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def layout_vocab(learned: Iterable[str], cfg: VocabConfig) -> list[str]:
    """Final id order: the reserved entries (Google's or 0-4), then the learned pieces in
    the order given; a learned piece equal to a reserved entry is dropped."""
    reserved = cfg.reserved_tokens
    taken = set(reserved)
    return [*reserved, *(p for p in learned if p not in taken)]


# -- training --------------------------------------------------------------------------


@dataclass
class AlphabetCounts:
    """The characters a training sample holds, as the trainer will see them (normalized,
    inside words). Counts of disjoint samples add up with `merge`, so shards can be
    counted in parallel and merged before `train_wordpiece`."""

    chars: Counter = field(default_factory=Counter)
    """normalized character -> occurrences in words (whitespace excluded, punctuation included)"""
    continuation: set[str] = field(default_factory=set)
    """characters seen inside a word after another character: they get a `##` entry"""

    def merge(self, other: AlphabetCounts) -> AlphabetCounts:
        return AlphabetCounts(self.chars + other.chars, self.continuation | other.continuation)

    def alphabet(self, limit: int | None) -> list[str]:
        """The `limit` most frequent characters (ties by code point), in code point order."""
        ranked = sorted(self.chars, key=lambda c: (-self.chars[c], ord(c)))
        return sorted(ranked[:limit] if limit else ranked, key=ord)


def _chunks(sentences: Iterable[str]) -> Iterator[str]:
    """Sentences joined by "\n" into strings of about _CHUNK_CHARS characters. A newline
    is whitespace to the normalizer and pre-tokenizer, so a chunk has exactly the words of
    its sentences (and composes nothing across the boundary)."""
    buf: list[str] = []
    size = 0
    for s in sentences:
        buf.append(s)
        size += len(s) + 1
        if size >= _CHUNK_CHARS:
            yield "\n".join(buf)
            buf, size = [], 0
    if buf:
        yield "\n".join(buf)


def count_alphabet(sentences: Iterable[str], cfg: VocabConfig) -> AlphabetCounts:
    """Count the characters of `sentences` after cfg's normalization, split as
    BertPreTokenizer splits (single-threaded, about 2 MB of text per second), or with a
    morpheme pre_tokenizer, as the trainer will see them (`_training_pre_tokenizer`)."""
    norm = build_normalizer(cfg)
    out = AlphabetCounts()
    if cfg.pre_tokenizer != WHITESPACE:
        pre = _training_pre_tokenizer(cfg)
        for sentence in sentences:
            for word, _ in pre.pre_tokenize_str(norm.normalize_str(sentence)):
                out.chars.update(c for c in word if c != morphemes.TRAINING_MARK)
                out.continuation.update(word[1:])  # a marked morpheme continues from its first character
        return out
    kinds: dict[str, str] = {}
    # Every space and punctuation char -> " ", so str.split() yields the words minus
    # punctuation (a punctuation char is a word of its own and never continues one).
    to_space: dict[int, str] = {}
    for chunk in _chunks(sentences):
        text = norm.normalize_str(chunk)
        counts = Counter(text)
        for c in counts.keys() - kinds.keys():
            kinds[c] = morphemes.char_kind(c)
            if kinds[c] != "word":
                to_space[ord(c)] = " "
        out.chars.update({c: n for c, n in counts.items() if kinds[c] != "space"})
        out.continuation.update("".join(w[1:] for w in set(text.translate(to_space).split())))
    return out


def train_wordpiece(sentences: Iterable[str], cfg: VocabConfig, alphabet: AlphabetCounts | None = None) -> Tokenizer:
    """Train a BERT WordPiece vocabulary on the first cfg.max_sentences sentences and
    return the finished tokenizer; its ids are the lines of the vocab.txt that
    `save_tokenizer` writes. With a morpheme cfg.pre_tokenizer the text is split into
    morphemes for training (bertcore/vocab/morphemes.py); the tokenizer returned is the
    files' form, with BERT's pre-tokenizer: `morphemes.with_morphemes(tok,
    cfg.pre_tokenizer)` (or `load_tokenizer` of the saved folder) splits as in training.

    `alphabet`: `count_alphabet` of exactly these sentences, if the caller has it (counted
    in parallel, say); then the sentences are streamed once. Without it they are held in
    memory and read twice.

    Deterministic: the same sentences in the same order give the same vocabulary in any
    process with any number of threads. Hugging Face's trainer alone is not: it numbers
    the `##x` symbols in hash-map order and breaks ties between equally frequent merges
    (and characters at the alphabet limit) by those numbers. Here the alphabet is chosen
    before training and every starting symbol gets a fixed id.
    """
    sample = itertools.islice(sentences, cfg.max_sentences)
    # A morpheme split is analysed sentence by sentence, as every later stage analyses it.
    group = _chunks if cfg.pre_tokenizer == WHITESPACE else iter
    if alphabet is None:
        chunks: Iterable[str] = list(group(sample))
        alphabet = count_alphabet(chunks, cfg)
    else:
        chunks = group(sample)
    if not alphabet.chars:
        raise ValueError("no text to train the vocabulary on (the sample has no non-space character)")
    chars = alphabet.alphabet(cfg.limit_alphabet)
    continuation = [PREFIX + c for c in chars if c in alphabet.continuation]
    cfg.check_alphabet(len(chars), len(continuation))

    # The `##x` symbols go in as special tokens so their ids are fixed (right after the
    # five specials); initial_alphabet + limit_alphabet=len(chars) make the trainer keep
    # exactly our characters (it gives initial ones an infinite count).
    trainer_specials = [*SPECIAL_TOKENS, *continuation]
    trainer = trainers.WordPieceTrainer(
        vocab_size=cfg.vocab_size - len(cfg.reserved_tokens) + len(SPECIAL_TOKENS),
        min_frequency=cfg.min_frequency,
        special_tokens=trainer_specials,
        limit_alphabet=len(chars),
        initial_alphabet=chars,
        continuing_subword_prefix=PREFIX,
        show_progress=False,
    )
    work = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix=PREFIX))
    work.normalizer = build_normalizer(cfg)
    work.pre_tokenizer = (
        pre_tokenizers.BertPreTokenizer() if cfg.pre_tokenizer == WHITESPACE else _training_pre_tokenizer(cfg)
    )
    work.train_from_iterator(chunks, trainer=trainer)

    trained = work.get_vocab(with_added_tokens=False)
    fixed = set(trainer_specials) | set(chars)
    merged = [p for p in sorted(trained, key=trained.__getitem__) if p not in fixed]
    # Learned order: characters, their ## forms, then merged pieces in the order learned
    # (a ## form the caller's counts missed lands among the merged ones).
    return tokenizer_from_vocab(layout_vocab([*chars, *continuation, *merged], cfg), cfg)


def _training_pre_tokenizer(cfg: VocabConfig) -> pre_tokenizers.PreTokenizer:
    """The morpheme split as the trainer must see it: a continuation morpheme marked with
    TRAINING_MARK, a character outside the alphabet, which the trainer drops, so that the
    morpheme's first character becomes a `##` symbol (morphemes.TRAINING_MARK)."""
    return morphemes.pre_tokenizer(cfg.pre_tokenizer, mark=morphemes.TRAINING_MARK)


# -- files -----------------------------------------------------------------------------


def vocab_list(tok: Tokenizer) -> list[str]:
    """The vocabulary in id order (= the lines of vocab.txt); ids must be 0..n-1."""
    ids = tok.get_vocab(with_added_tokens=True)
    order = sorted(ids, key=ids.__getitem__)
    if [ids[p] for p in order] != list(range(len(order))):
        raise ValueError("tokenizer ids are not contiguous from 0; it cannot be written as vocab.txt")
    return order


def save_tokenizer(tok: Tokenizer, cfg: VocabConfig, directory: str, *, model_max_length: int = 512) -> list[str]:
    """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json
    into `directory` (created if missing); return the file names.

    tokenizer_config.json names the generic fast class (PreTrainedTokenizerFast), not
    BertTokenizer: transformers 5 rebuilds a BertTokenizer's normalizer from the flags and
    drops tokenizer.json's, which would turn Hangul back into jamo; the generic class
    loads tokenizer.json as written. The BERT flags are still recorded for other tools, and
    a morpheme cfg.pre_tokenizer with the analyser's versions and how to load the tokenizer
    so that it splits as in training (bertcore/vocab/morphemes.py). `tok` is the files'
    form (train_wordpiece's), not one `with_morphemes` changed.
    """
    if tok.normalizer is None or json.loads(tok.to_str())["normalizer"] != _normalizer_state(cfg):
        raise ValueError(
            "the tokenizer's normalizer does not match vocab.lowercase / vocab.strip_accents / "
            "vocab.tokenize_chinese_chars; save it with the config it was trained with"
        )
    vocab = vocab_list(tok)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, VOCAB_FILE), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(p + "\n" for p in vocab))
    tok.save(os.path.join(directory, TOKENIZER_FILE))
    specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "do_lower_case": cfg.lowercase,
        "strip_accents": cfg.strip_accents_effective,
        "tokenize_chinese_chars": cfg.tokenize_chinese_chars,
        "model_max_length": model_max_length,
        "never_split": list(SPECIAL_TOKENS),
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        "clean_up_tokenization_spaces": True,
        **specials,
        **morphemes.config_fields(cfg.pre_tokenizer),
    }
    write_transformers_files(directory, tokenizer_config, specials)
    return list(TOKENIZER_FILES)


def read_entries(path: str) -> list[str]:
    """The entries in id order of a vocab.txt, or of a byte-level BPE's vocab.json."""
    return bpe.entries(bpe.read_vocab_json(path)) if path.endswith(".json") else read_vocab(path)


def read_vocab(path: str) -> list[str]:
    """The entries of a vocab.txt, in id order: the file's final newline ends the last
    entry, it does not start an empty one."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def load_tokenizer(directory: str) -> Tokenizer:
    """Load tokenizer.json from `directory`, splitting text as the folder's
    tokenizer_config.json records (`morphemes.split_as_recorded`: BERT's words, or Korean
    morphemes); if vocab.txt (or a BPE's vocab.json) is there too, check that it holds the
    tokenizer's vocabulary in id order."""
    return morphemes.split_as_recorded(_load_files(directory), directory)


def _load_files(directory: str) -> Tokenizer:
    """tokenizer.json as written (checked against vocab.txt or vocab.json), with no morpheme split."""
    tok = Tokenizer.from_file(os.path.join(directory, TOKENIZER_FILE))
    path = os.path.join(directory, VOCAB_JSON)
    if os.path.exists(path) and bpe.read_vocab_json(path) != tok.get_vocab(with_added_tokens=True):
        raise VocabFilesMismatchError(f"{path} and {TOKENIZER_FILE} hold different vocabularies; rerun the vocab stage")
    path = os.path.join(directory, VOCAB_FILE)
    if os.path.exists(path):
        lines = read_vocab(path)
        vocab = vocab_list(tok)
        for i, (a, b) in enumerate(itertools.zip_longest(lines, vocab)):
            if a != b:
                raise VocabFilesMismatchError(
                    f"{path} line {i + 1} is {a!r} but {TOKENIZER_FILE} has {b!r} at id {i}; "
                    f"the two files come from different vocabularies, rerun the vocab stage"
                )
    return tok


def _normalizer_state(cfg: VocabConfig) -> dict:
    probe = Tokenizer(models.WordPiece({UNK: 0}, unk_token=UNK))
    probe.normalizer = build_normalizer(cfg)
    return json.loads(probe.to_str())["normalizer"]


def tokenizer_options(state: dict) -> dict:
    """What decides which entries a text maps to, from a tokenizer's JSON: the casing
    options when the normalizer is ours (named fields, so the value survives changes to
    the library's JSON), else the normalizer as serialized."""
    norm = state.get("normalizer") or {}
    parts = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    types = [p.get("type") for p in parts]
    if types in (["BertNormalizer", "NFC"], ["BertNormalizer"]):
        bert = parts[0]
        strip = bert["lowercase"] if bert["strip_accents"] is None else bert["strip_accents"]
        opts = {
            "lowercase": bert["lowercase"],
            "strip_accents": strip,
            "tokenize_chinese_chars": bert["handle_chinese_chars"],
            "clean_text": bert["clean_text"],
            "recompose_nfc": types[-1] == "NFC",
        }
    else:
        opts = {"normalizer": norm}
    model = state.get("model") or {}
    pre = state.get("pre_tokenizer") or {}
    opts.update(
        pre_tokenizer=pre.get("type"),
        max_input_chars_per_word=model.get("max_input_chars_per_word"),
        continuing_subword_prefix=model.get("continuing_subword_prefix"),
    )
    if pre.get("type") == "ByteLevel":
        opts["add_prefix_space"] = pre.get("add_prefix_space")
    return opts


def vocab_fingerprint(source: str | Tokenizer, pre_tokenizer: str = WHITESPACE) -> str:
    """16 hex digits identifying a vocabulary: its entries in id order (the bytes of
    vocab.txt) plus the options that decide which entry a text maps to (lowercase, accent
    stripping, CJK spacing, the word limit, a morpheme split; a BPE's merges). `source` is a
    vocabulary directory (its split as recorded) or a Tokenizer in the files' form (split
    by `pre_tokenizer`); both give the same value for the same vocabulary."""
    if isinstance(source, str):
        tok, pre_tokenizer = _load_files(source), morphemes.recorded_pre_tokenizer(source)
    else:
        tok = source
    state = json.loads(tok.to_str())
    options = tokenizer_options(state)
    if pre_tokenizer != WHITESPACE:  # a whitespace vocabulary keeps the value it had before the option existed
        options["morphemes"] = pre_tokenizer
    h = hashlib.sha256()
    h.update("".join(p + "\n" for p in vocab_list(tok)).encode())
    h.update(b"\x00")
    h.update(json.dumps(options, sort_keys=True).encode())
    if (state.get("model") or {}).get("type") == "BPE":
        h.update(b"\x00")
        h.update(json.dumps(state["model"].get("merges", []), ensure_ascii=False).encode())
    return h.hexdigest()[:16]


# -- statistics ------------------------------------------------------------------------


def tokenization_stats(tok: Tokenizer, sentences: Iterable[str], top_k: int = 20) -> dict:
    """How the vocabulary fits some text: [UNK] rate (UNK pieces / pieces), pieces per word
    (words as BERT's BasicTokenizer splits them, with a morpheme split too, so that both
    count the same words), share of the vocabulary used, the top_k
    most frequent pieces as [piece, count] (ties in id order), vocabulary size and
    alphabet size (single characters, no ##). Special tokens are not added."""
    vocab = vocab_list(tok)
    unk_id = tok.token_to_id(UNK) if tok.token_to_id(UNK) is not None else tok.token_to_id(BPE_UNK)
    bert = pre_tokenizers.BertPreTokenizer()
    morpheme_words = morphemes.splits_morphemes(tok)
    piece_counts: Counter = Counter()
    n_sentences = n_words = 0
    batch: list[str] = []

    def consume() -> None:
        nonlocal n_words
        encodings = tok.encode_batch(batch, add_special_tokens=False)
        for enc in encodings:
            piece_counts.update(enc.ids)
        if morpheme_words:  # the pre-tokenizer's words are morphemes: count BERT's words of the same text
            n_words += sum(len(bert.pre_tokenize_str(tok.normalizer.normalize_str(s))) for s in batch)
        else:  # every word yields at least one piece ([UNK] at worst): distinct word indices count the words
            n_words += sum(len({w for w in enc.word_ids if w is not None}) for enc in encodings)
        batch.clear()

    for s in sentences:
        n_sentences += 1
        batch.append(s)
        if len(batch) >= 1024:
            consume()
    consume()
    n_pieces = sum(piece_counts.values())
    top = sorted(piece_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
    return {
        "sentences": n_sentences,
        "words": n_words,
        "pieces": n_pieces,
        "unk_rate": piece_counts[unk_id] / n_pieces if n_pieces else 0.0,
        "pieces_per_word": n_pieces / n_words if n_words else 0.0,
        "vocab_used_fraction": len(piece_counts) / len(vocab),
        "top_pieces": [[vocab[i], n] for i, n in top],
        "vocab_size": len(vocab),
        "alphabet_size": sum(1 for p in vocab if len(p) == 1),
    }
