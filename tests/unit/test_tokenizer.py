"""bertcore.vocab.tokenizer: config validation, BERT id layout, determinism across processes,
the saved files (and what transformers makes of them), fingerprints and statistics.

Fidelity against the reference tokenizer is in test_tokenizer_fidelity.py, Korean in
test_tokenizer_korean.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pydantic
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from bertcore.errors import ConfigError
from bertcore.sample_data import NEWS_TEXT
from bertcore.vocab.encode import encode_sentences
from bertcore.vocab.tokenizer import (
    SPECIAL_TOKENS,
    VocabConfig,
    VocabFilesMismatchError,
    count_alphabet,
    load_tokenizer,
    read_vocab,
    save_tokenizer,
    tokenization_stats,
    tokenizer_from_vocab,
    train_wordpiece,
    vocab_fingerprint,
    vocab_list,
)


@pytest.fixture(scope="module")
def news(gensim_data) -> list[str]:
    """300 real news documents (one per line), split crudely into sentences."""
    text = (gensim_data / NEWS_TEXT).read_text(encoding="utf-8")
    return [s.strip() for line in text.splitlines() for s in line.split(". ") if s.strip()]


@pytest.fixture(scope="module")
def news_tok(news) -> tuple[Tokenizer, VocabConfig]:
    cfg = VocabConfig(vocab_size=1500)
    return train_wordpiece(news, cfg), cfg


@pytest.mark.parametrize("lowercase", [True, False])
def test_sentences_encoded_a_document_at_a_time_get_their_own_ids(news, lowercase):
    """encode_sentences joins a document's sentences with [SEP]: the ids must be those of
    each sentence encoded alone, also at awkward joins (combining marks, Hangul, an empty
    or blank sentence, special tokens and [SEP] itself inside the text)."""
    import numpy as np

    from bertcore.vocab.encode import _ascii_path

    tok = train_wordpiece(news, VocabConfig(vocab_size=1500, lowercase=lowercase))
    assert _ascii_path(tok) is not None  # BERT's normaliser: ASCII sentences take the fast path
    awkward = [
        "\u0301accent first",
        "ends with a\u0301",
        "",
        "   ",
        "Hangul 한국어 문장",
        "has [SEP] inside",
        "[CLS] and [MASK] too",
        "x" * 300,
        "tab\tand\nnewline",
        "Ωμέγα ΣΊΣΥΦΟΣ",
    ]
    every_ascii = [f"Word{chr(c)}word and{chr(c)}" for c in range(128)]  # ASCII: the fast path
    sentences = news[:400] + awkward + news[400:450] + every_ascii
    bounds = np.array([0, 3, 3, 120, 400, 403, 405, 410, 460, len(sentences)])  # one empty document
    values, lengths = encode_sentences(tok, sentences, bounds)
    expected = [e.ids for e in tok.encode_batch_fast(sentences, add_special_tokens=False)]
    assert lengths.tolist() == [len(ids) for ids in expected]
    assert values.tolist() == [t for ids in expected for t in ids]


@pytest.fixture(scope="module")
def cased_and_uncased(news):
    return {lower: train_wordpiece(news, VocabConfig(vocab_size=1500, lowercase=lower)) for lower in (True, False)}


_PIECES = st.one_of(
    st.text(alphabet=[chr(c) for c in range(128)] + list("éÅ한글Ωß\u0301\u00a0\u3000\u200b"), max_size=12),
    st.sampled_from(["[SEP]", "[MASK]", "[sep]", "[CLS]", "[UNK]", " [SEP] ", "Word", "##ing"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.lists(_PIECES, max_size=5).map("".join), max_size=5), max_size=5), st.booleans())
def test_encode_sentences_gives_encode_batch_fasts_ids_for_any_text(cased_and_uncased, documents, lowercase):
    """Control characters, brackets, special tokens in any case, non-ASCII letters: the
    ASCII path and the [SEP] joins change no id."""
    import numpy as np

    tok = cased_and_uncased[lowercase]
    sentences = [s for doc in documents for s in doc]
    bounds = np.concatenate([[0], np.cumsum([len(doc) for doc in documents])]).astype(np.int64)
    values, lengths = encode_sentences(tok, sentences, bounds)
    expected = [e.ids for e in tok.encode_batch_fast(sentences, add_special_tokens=False)]
    assert lengths.tolist() == [len(ids) for ids in expected]
    assert values.tolist() == [t for ids in expected for t in ids]


# -- config ----------------------------------------------------------------------------


def test_defaults_are_bert_base():
    cfg = VocabConfig()
    assert cfg.vocab_size == 30522 and cfg.lowercase and cfg.strip_accents is None
    assert cfg.strip_accents_effective is True
    assert VocabConfig(lowercase=False).strip_accents_effective is False
    assert VocabConfig(lowercase=False, strip_accents=True).strip_accents_effective is True


@pytest.mark.parametrize(
    ("kwargs", "needed"),
    [({"vocab_size": 104}, "104"), ({"vocab_size": 5, "bert_layout": False}, "5")],
)
def test_vocab_smaller_than_reserved_entries_names_the_key(kwargs, needed):
    with pytest.raises(pydantic.ValidationError) as err:
        VocabConfig(**kwargs)
    assert "vocab.vocab_size" in str(err.value) and needed in str(err.value)
    # One more entry than the reserved ones is allowed.
    VocabConfig(**{**kwargs, "vocab_size": kwargs["vocab_size"] + 1})


def test_unknown_key_and_bad_values_name_the_key():
    with pytest.raises(pydantic.ValidationError, match="vocab_sise"):
        VocabConfig(vocab_sise=100)
    with pytest.raises(pydantic.ValidationError, match="min_frequency"):
        VocabConfig(min_frequency=0)
    with pytest.raises(pydantic.ValidationError, match="max_input_chars_per_word"):
        VocabConfig(max_input_chars_per_word="long")


def test_alphabet_larger_than_vocab_is_a_config_error(news):
    cfg = VocabConfig(vocab_size=140)
    alphabet = count_alphabet(news, cfg)
    assert 36 < len(alphabet.chars) < 200  # letters, digits, punctuation of English news
    with pytest.raises(ValueError, match=r"vocab\.vocab_size=140") as err:
        train_wordpiece(news, cfg)
    assert isinstance(err.value, ConfigError)
    with pytest.raises(ValueError, match="vocab.vocab_size"):
        VocabConfig(vocab_size=200).check_alphabet(alphabet_size=90, continuation_size=10)
    VocabConfig(vocab_size=204).check_alphabet(alphabet_size=90, continuation_size=10)


# -- layout ----------------------------------------------------------------------------


def test_bert_layout_puts_specials_at_google_ids(news_tok, tmp_path):
    tok, cfg = news_tok
    vocab = vocab_list(tok)
    assert len(vocab) == cfg.vocab_size
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 100, 101, 102, 103]
    assert vocab[1:100] == [f"[unused{i}]" for i in range(99)]
    save_tokenizer(tok, cfg, str(tmp_path))
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and lines[:-1] == vocab
    assert lines[0] == "[PAD]" and lines[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_plain_layout_puts_specials_first(news):
    tok = train_wordpiece(news[:400], VocabConfig(vocab_size=400, bert_layout=False))
    assert vocab_list(tok)[:5] == list(SPECIAL_TOKENS)
    assert not any(p.startswith("[unused") for p in vocab_list(tok))


def test_learned_pieces_are_characters_then_continuations_then_merges(news_tok):
    tok, _ = news_tok
    learned = vocab_list(tok)[104:]
    kinds = [0 if len(p) == 1 else 1 if p.startswith("##") and len(p) == 3 else 2 for p in learned]
    assert kinds == sorted(kinds)
    chars = [p for p, k in zip(learned, kinds) if k == 0]
    assert chars == sorted(chars) and {"a", "z", "0", "."} <= set(chars)
    # Punctuation is always a word of its own, so it never gets a ## form.
    assert "##a" in learned and "##." not in learned and "##," not in learned


def test_pair_encoding_has_bert_segments(news_tok):
    tok, _ = news_tok
    enc = tok.encode("The fire spread quickly.", "Crews arrived.")
    assert enc.ids[0] == 101 and enc.ids.count(102) == 2 and enc.ids[-1] == 102
    first_sep = enc.ids.index(102)
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert tok.decode(enc.ids) == "the fire spread quickly. crews arrived."


# -- determinism -----------------------------------------------------------------------

_TRAIN_IN_CHILD = """
import sys
from bertcore.sample_data import gensim_data_dir, NEWS_TEXT
from bertcore.vocab.tokenizer import VocabConfig, train_wordpiece, vocab_list
text = (gensim_data_dir() / NEWS_TEXT).read_text(encoding="utf-8")
sents = [s.strip() for line in text.splitlines() for s in line.split(". ") if s.strip()]
cfg = VocabConfig(vocab_size=int(sys.argv[1]), limit_alphabet=int(sys.argv[2]))
sys.stdout.write("\\n".join(vocab_list(train_wordpiece(sents, cfg))))
"""


def _train_in_child(threads: str, vocab_size: int, limit_alphabet: int) -> str:
    env = {**os.environ, "RAYON_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "true"}
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_IN_CHILD, str(vocab_size), str(limit_alphabet)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout


@pytest.mark.parametrize(("vocab_size", "limit_alphabet"), [(1500, 1000), (3000, 40)])
def test_training_is_identical_across_processes_and_threads(news, vocab_size, limit_alphabet):
    # Each process has its own hash-map seeds; one uses 1 thread, the other 2. The raw
    # Hugging Face trainer orders (and near the limit, picks) pieces differently here.
    # limit_alphabet=40 cuts the alphabet inside a run of equally frequent characters.
    a = _train_in_child("1", vocab_size, limit_alphabet)
    b = _train_in_child("2", vocab_size, limit_alphabet)
    here = vocab_list(train_wordpiece(news, VocabConfig(vocab_size=vocab_size, limit_alphabet=limit_alphabet)))
    assert a == b == "\n".join(here)
    assert len(here) == vocab_size


def test_precounted_alphabet_gives_the_same_vocabulary(news):
    # The stage may count shards in parallel and merge the counts.
    cfg = VocabConfig(vocab_size=1500)
    half = len(news) // 2
    counts = count_alphabet(news[:half], cfg).merge(count_alphabet(news[half:], cfg))
    assert counts == count_alphabet(news, cfg)
    streamed = train_wordpiece(iter(news), cfg, alphabet=counts)
    assert vocab_list(streamed) == vocab_list(train_wordpiece(news, cfg))


def test_max_sentences_caps_the_sample(news):
    capped = train_wordpiece(news, VocabConfig(vocab_size=800, max_sentences=50))
    uncapped = VocabConfig(vocab_size=800)
    assert vocab_list(capped) == vocab_list(train_wordpiece(news[:50], uncapped))
    assert vocab_list(capped) != vocab_list(train_wordpiece(news, uncapped))


# -- files -----------------------------------------------------------------------------


def test_saved_directory_round_trips(news_tok, news, tmp_path):
    tok, cfg = news_tok
    names = save_tokenizer(tok, cfg, str(tmp_path / "vocab"), model_max_length=128)
    assert sorted(names) == sorted(os.listdir(tmp_path / "vocab"))
    assert set(names) == {"vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    loaded = load_tokenizer(str(tmp_path / "vocab"))
    assert read_vocab(str(tmp_path / "vocab" / "vocab.txt")) == vocab_list(tok)
    plain = Tokenizer.from_file(str(tmp_path / "vocab" / "tokenizer.json"))
    for other in (loaded, plain):
        assert [e.ids for e in other.encode_batch(news[:200])] == [e.ids for e in tok.encode_batch(news[:200])]
    config = json.loads((tmp_path / "vocab" / "tokenizer_config.json").read_text())
    assert config["do_lower_case"] is True and config["strip_accents"] is True
    assert config["tokenize_chinese_chars"] is True and config["model_max_length"] == 128
    assert config["never_split"] == list(SPECIAL_TOKENS)
    special = json.loads((tmp_path / "vocab" / "special_tokens_map.json").read_text())
    assert special == {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }


def test_save_refuses_a_config_the_tokenizer_was_not_built_with(news_tok, tmp_path):
    tok, cfg = news_tok
    with pytest.raises(ValueError, match="vocab.lowercase"):
        save_tokenizer(tok, VocabConfig(vocab_size=cfg.vocab_size, lowercase=False), str(tmp_path))


def test_load_refuses_vocab_txt_that_disagrees_with_tokenizer_json(news_tok, tmp_path):
    tok, cfg = news_tok
    save_tokenizer(tok, cfg, str(tmp_path))
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    lines[500], lines[501] = lines[501], lines[500]
    (tmp_path / "vocab.txt").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(VocabFilesMismatchError, match="line 501"):
        load_tokenizer(str(tmp_path))


def test_read_vocab_keeps_every_entry_but_no_phantom_last_one(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("[PAD]\n##a\n\u00e9\n".encode())
    assert read_vocab(str(path)) == ["[PAD]", "##a", "\u00e9"]
    path.write_bytes(b"[PAD]\n##a")  # no final newline: the last entry is still read
    assert read_vocab(str(path)) == ["[PAD]", "##a"]


@pytest.mark.parametrize("loader", [transformers.AutoTokenizer, transformers.BertTokenizerFast])
def test_transformers_loads_the_directory_as_bert(news_tok, news, tmp_path, loader):
    tok, cfg = news_tok
    save_tokenizer(tok, cfg, str(tmp_path))
    hf = loader.from_pretrained(str(tmp_path))
    enc = hf("Café owners fled the fire.", "Rain came later.")
    ours = tok.encode("Café owners fled the fire.", "Rain came later.")
    assert enc["input_ids"] == ours.ids and enc["token_type_ids"] == ours.type_ids
    assert enc["input_ids"][0] == 101 and enc["token_type_ids"][-1] == 1
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (
        0,
        100,
        101,
        102,
        103,
    )
    assert hf.model_max_length == 512
    assert [hf.tokenize(s) for s in news[:300]] == [
        e.tokens for e in tok.encode_batch(news[:300], add_special_tokens=False)
    ]


# -- fingerprint and statistics --------------------------------------------------------


def test_fingerprint_tracks_vocabulary_and_casing(news_tok, tmp_path):
    tok, cfg = news_tok
    save_tokenizer(tok, cfg, str(tmp_path))
    fp = vocab_fingerprint(tok)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert vocab_fingerprint(str(tmp_path)) == fp
    vocab = vocab_list(tok)
    cased = VocabConfig(vocab_size=cfg.vocab_size, lowercase=False)
    assert vocab_fingerprint(tokenizer_from_vocab(vocab, cfg)) == fp
    assert vocab_fingerprint(tokenizer_from_vocab(vocab, cased)) != fp
    for option in ({"strip_accents": False}, {"tokenize_chinese_chars": False}):
        other = VocabConfig(vocab_size=cfg.vocab_size, **option)
        assert vocab_fingerprint(tokenizer_from_vocab(vocab, other)) != fp
    # Spelling out the default (strip_accents=None means True when lowercasing) is the same vocabulary.
    explicit = VocabConfig(vocab_size=cfg.vocab_size, strip_accents=True)
    assert vocab_fingerprint(tokenizer_from_vocab(vocab, explicit)) == fp
    swapped = vocab[:-2] + [vocab[-1], vocab[-2]]
    assert vocab_fingerprint(tokenizer_from_vocab(swapped, cfg)) != fp
    longer_words = VocabConfig(vocab_size=cfg.vocab_size, max_input_chars_per_word=200)
    assert vocab_fingerprint(tokenizer_from_vocab(vocab, longer_words)) != fp


def test_stats_on_a_hand_made_vocabulary():
    cfg = VocabConfig(vocab_size=20, bert_layout=False)
    tok = tokenizer_from_vocab([*SPECIAL_TOKENS, "the", "cat", "##s", "sat", ".", "a", "t"], cfg)
    stats = tokenization_stats(tok, ["The cats sat.", "The dog sat."], top_k=3)
    # words: the cats sat . / the dog sat .   pieces: the cat ##s sat . / the [UNK] sat .
    assert stats["sentences"] == 2 and stats["words"] == 8 and stats["pieces"] == 9
    assert stats["unk_rate"] == pytest.approx(1 / 9)
    assert stats["pieces_per_word"] == pytest.approx(9 / 8)
    assert stats["vocab_used_fraction"] == pytest.approx(6 / 12)
    assert stats["top_pieces"] == [["the", 2], ["sat", 2], [".", 2]]  # ties in id order
    assert stats["vocab_size"] == 12 and stats["alphabet_size"] == 3


def test_stats_of_a_trained_vocabulary_on_held_out_news(news):
    cfg = VocabConfig(vocab_size=2000)
    train, held_out = news[: len(news) // 2], news[len(news) // 2 :]
    tok = train_wordpiece(train, cfg)
    stats = tokenization_stats(tok, held_out)
    assert stats["vocab_size"] == 2000
    # Words as BERT's basic tokenizer splits the normalized text; pieces as encoded.
    words = sum(len(tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(s))) for s in held_out)
    pieces = sum(len(e.ids) for e in tok.encode_batch(held_out, add_special_tokens=False))
    assert stats["words"] == words and stats["pieces"] == pieces
    assert stats["pieces_per_word"] == pytest.approx(pieces / words)
    # A smaller vocabulary has to split more words.
    smaller = tokenization_stats(train_wordpiece(train, VocabConfig(vocab_size=500)), held_out)
    assert smaller["pieces_per_word"] > stats["pieces_per_word"] * 1.1
    assert stats["unk_rate"] < 0.01
    assert stats["top_pieces"][0][0] in {"the", ",", "."}
    assert 0.5 < stats["vocab_used_fraction"] <= 1.0
