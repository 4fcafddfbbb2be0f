"""Korean: a vocabulary trained on real Korean text (konlpy's constitution and bills)
keeps Hangul syllables whole, even uncased with accent stripping, where Google's and
Hugging Face's BERT normalizers turn every syllable into conjoining jamo."""

from __future__ import annotations

import os
import unicodedata

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import transformers
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertcore.sample_data import konlpy_corpus_dir
from bertcore.vocab.tokenizer import (
    VocabConfig,
    load_tokenizer,
    save_tokenizer,
    tokenization_stats,
    train_wordpiece,
    vocab_list,
)

# Written for this test (not in the corpus): law-style and everyday sentences.
SENTENCES = [
    "국민은 누구나 법률이 정하는 바에 따라 교육을 받을 권리가 있다.",
    "이 위원회는 매년 국회에 활동 결과를 보고하여야 한다.",
    "정부는 지방자치단체와 협의하여 필요한 예산을 지원할 수 있다.",
    "위원회는 위원장 1명을 포함한 9명의 위원으로 구성한다.",
    "이 법에서 사용하는 용어의 뜻은 다음과 같다.",
    "국회의원은 국가의 이익을 우선하여 양심에 따라 직무를 행한다.",
    "모든 국민은 근로의 권리와 의무를 함께 가진다.",
    "법원은 재판의 결과를 공개하여야 하며, 그 이유를 설명하여야 한다.",
    "대통령은 법률에서 정한 범위 안에서 대통령령을 발할 수 있다.",
    "개정안은 공포 후 6개월이 경과한 날부터 시행하도록 한다.",
]


def has_jamo(text: str) -> bool:
    """Any Hangul jamo: conjoining (what NFD makes of a syllable, incl. extended A/B)
    or compatibility jamo."""
    return any(
        0x1100 <= ord(c) <= 0x11FF
        or 0xA960 <= ord(c) <= 0xA97F
        or 0xD7B0 <= ord(c) <= 0xD7FF
        or 0x3130 <= ord(c) <= 0x318F
        for c in text
    )


@pytest.fixture(scope="module")
def korean_lines() -> list[str]:
    root = konlpy_corpus_dir()
    paths = sorted([*root.glob("kolaw/*.txt"), *root.glob("kobill/*.txt")])
    lines = [ln.strip() for p in paths for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    assert len(paths) == 11 and len(lines) > 2000
    text = "\n".join(lines)
    assert not any(s in text for s in SENTENCES)
    return lines


@pytest.fixture(scope="module")
def uncased(korean_lines, gensim_data, tmp_path_factory):
    """Default (uncased, accent-stripping) vocabulary; some English reviews are mixed in
    so that Latin words are in it too."""
    english = [
        ln.split(" ", 1)[1] for ln in (gensim_data / "pang_lee_polarity.cor").read_text(encoding="cp1252").splitlines()
    ]
    cfg = VocabConfig(vocab_size=3000)
    tok = train_wordpiece([*korean_lines, *english, "Café", "café au lait"], cfg)
    directory = tmp_path_factory.mktemp("ko-uncased")
    save_tokenizer(tok, cfg, str(directory))
    return tok, cfg, directory


def test_vocabulary_holds_syllables_not_jamo(uncased, korean_lines):
    tok, _, directory = uncased
    vocab = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert not any(0x1100 <= ord(c) <= 0x11FF for p in vocab for c in p)  # no decomposed syllables
    # The only compatibility jamo is one the corpus itself uses as a middle dot (U+318D).
    in_corpus = {c for ln in korean_lines for c in ln if has_jamo(c)}
    assert in_corpus == {"\u318d"}
    assert {c for p in vocab for c in p if has_jamo(c)} <= in_corpus
    syllables = [
        p
        for p in vocab
        if len(p.removeprefix("##")) > 1 and all("\uac00" <= c <= "\ud7a3" for c in p.removeprefix("##"))
    ]
    assert len(syllables) > 1000  # multi-syllable Korean pieces were learned


def test_korean_sentences_tokenize_to_syllable_pieces(uncased):
    tok, _, _ = uncased
    for enc in tok.encode_batch(SENTENCES, add_special_tokens=False):
        assert enc.tokens and not any(has_jamo(t) for t in enc.tokens)
        assert all(unicodedata.is_normalized("NFC", t) for t in enc.tokens)
    stats = tokenization_stats(tok, SENTENCES)
    assert stats["unk_rate"] < 0.01
    assert stats["pieces_per_word"] < 3.0
    # Pieces spell the sentence back (decode joins ## pieces, spaces words).
    first = tok.encode(SENTENCES[0], add_special_tokens=False)
    assert "".join(t.removeprefix("##") for t in first.tokens) == SENTENCES[0].replace(" ", "")


def test_accents_are_still_stripped(uncased):
    tok, _, _ = uncased
    assert tok.normalizer.normalize_str("Café Ünïcode 한국어") == "cafe unicode 한국어"
    pieces = tok.encode("Café", add_special_tokens=False).tokens
    assert "".join(p.removeprefix("##") for p in pieces) == "cafe" and "[UNK]" not in pieces


def test_transformers_auto_tokenizer_keeps_the_syllables(uncased):
    tok, _, directory = uncased
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    ours = [e.tokens for e in tok.encode_batch([*SENTENCES, "Café"], add_special_tokens=False)]
    assert [hf.tokenize(s) for s in [*SENTENCES, "Café"]] == ours
    assert load_tokenizer(str(directory)).encode(SENTENCES[0]).tokens == tok.encode(SENTENCES[0]).tokens


def test_reference_uncased_tokenizer_would_lose_korean(uncased):
    # Why bertpipe's normalizer differs: Google's uncased BasicTokenizer over the same
    # vocabulary decomposes every syllable, finds no jamo in the vocabulary and gives [UNK].
    _, _, directory = uncased
    ref = BertTokenizerLegacy(vocab_file=str(directory / "vocab.txt"))
    pieces = [t for s in SENTENCES for t in ref.tokenize(s)]
    assert sum(t == "[UNK]" for t in pieces) > 0.5 * sum(t != "." and t != "," for t in pieces)


def test_cased_korean_matches_the_reference_everywhere(korean_lines, tmp_path):
    # Without accent stripping nothing is decomposed, so the reference agrees line by line.
    cfg = VocabConfig(vocab_size=3000, lowercase=False)
    tok = train_wordpiece(korean_lines, cfg)
    save_tokenizer(tok, cfg, str(tmp_path))
    ref = BertTokenizerLegacy(vocab_file=str(tmp_path / "vocab.txt"), do_lower_case=False)
    texts = [*korean_lines, *SENTENCES]
    ours = [e.tokens for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert [ref.tokenize(s) for s in texts] == ours
    assert {c for p in vocab_list(tok) for c in p if has_jamo(c)} == {"\u318d"}  # the corpus's own middle dot
