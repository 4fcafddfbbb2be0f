"""RoBERTa's byte-level BPE vocabulary (vocab.model: byte_level_bpe): trained as
tokenizers' own ByteLevelBPETokenizer trains, with RoBERTa's special tokens at 0-4; the
saved folder is what transformers' AutoTokenizer reads into the same ids; an existing
vocab.json + merges.txt is adopted entry for entry; a document's sentences encode as its
running text does."""

from __future__ import annotations

import json
import logging
import warnings

import numpy as np
import pytest
from tokenizers.implementations import ByteLevelBPETokenizer

from bertcore.errors import InputDataError
from bertcore.examples.masking import VocabTables
from bertcore.vocab.adopt import read_bpe_vocabulary, read_vocabulary
from bertcore.vocab.bpe import save_bpe, train_byte_level_bpe, with_space
from bertcore.vocab.config import BPE_FILES, BPE_SPECIAL_TOKENS, VocabConfig
from bertcore.vocab.encode import encode_sentences
from bertcore.vocab.tokenizer import load_tokenizer, read_entries, vocab_fingerprint, vocab_list
from test_vocab_adopt import lee_sentences

CFG = VocabConfig(model="byte_level_bpe", vocab_size=1200, min_frequency=2)


@pytest.fixture(scope="module")
def sentences(gensim_data) -> tuple[list[str], list[str]]:
    """(training sentences, held-out sentences): the first 250 news documents, then the rest."""
    everything = lee_sentences(gensim_data, documents=300)
    train = lee_sentences(gensim_data, documents=250)
    return train, everything[len(train) :]


@pytest.fixture(scope="module")
def trained(sentences):
    return train_byte_level_bpe(sentences[0], CFG)


@pytest.fixture(scope="module")
def folder(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    save_bpe(trained, str(out))
    return out


def test_the_trained_vocabulary_is_tokenizers_own_byte_level_bpe(sentences, trained, folder):
    train, held_out = sentences
    reference = ByteLevelBPETokenizer(add_prefix_space=False)
    # trained the same way: the same sentences, each as it stands in running text (after a space)
    reference.train_from_iterator(
        [with_space(s) for s in train],
        vocab_size=1200,
        min_frequency=2,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        show_progress=False,
    )
    assert vocab_list(trained) == vocab_list(reference._tokenizer)
    assert vocab_list(trained)[:5] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert len(vocab_list(trained)) == 1200
    ours = [e.ids for e in trained.encode_batch(held_out, add_special_tokens=False)]
    theirs = [e.ids for e in reference.encode_batch(held_out, add_special_tokens=False)]
    assert ours == theirs and len(held_out) > 100
    # what ByteLevelBPETokenizer(add_prefix_space=True) makes of the bare sentence
    spaced = ByteLevelBPETokenizer.from_file(
        str(folder / "vocab.json"), str(folder / "merges.txt"), add_prefix_space=True
    )
    assert [e.ids for e in trained.encode_batch([with_space(s) for s in held_out], add_special_tokens=False)] == [
        e.ids for e in spaced.encode_batch(held_out, add_special_tokens=False)
    ]
    assert "Ġthe" in trained.get_vocab() and trained.token_to_id("<unk>") == 3
    assert vocab_list(train_byte_level_bpe(train, CFG)) == vocab_list(trained)  # deterministic


def test_the_folder_loads_in_transformers_with_the_same_ids_and_no_warnings(sentences, trained, folder):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    assert sorted(p.name for p in folder.iterdir()) == sorted(BPE_FILES)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "RobertaTokenizer" and config["add_prefix_space"] is False
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    hf_logging.get_logger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs = AutoTokenizer.from_pretrained(str(folder))
    finally:
        hf_logging.get_logger().removeHandler(handler)
    assert [str(w.message) for w in caught] == [] and [r.getMessage() for r in records] == []
    assert (theirs.cls_token, theirs.sep_token, theirs.pad_token, theirs.mask_token) == (
        "<s>",
        "</s>",
        "<pad>",
        "<mask>",
    )
    held_out = sentences[1][:200]
    assert theirs(held_out)["input_ids"] == [e.ids for e in trained.encode_batch(held_out)]
    pairs = list(zip(held_out[::2], held_out[1::2]))
    assert theirs([a for a, _ in pairs], [b for _, b in pairs])["input_ids"] == [
        e.ids for e in trained.encode_batch(pairs)
    ]
    first = trained.encode(pairs[0][0], pairs[0][1]).tokens
    assert first[0] == "<s>" and first.count("</s>") == 3  # <s> A </s></s> B </s>
    # <mask> takes the space before it, as RoBERTa's: the word it hides is a Ġ word
    masked = theirs("The capital of France is <mask>.")["input_ids"]
    assert theirs.convert_ids_to_tokens(masked)[-4:] == ["Ġis", "<mask>", ".", "</s>"]


def test_files_agree_and_fingerprint_covers_the_merges(trained, folder, tmp_path):
    assert vocab_list(load_tokenizer(str(folder))) == vocab_list(trained)
    assert read_entries(str(folder / "vocab.json")) == vocab_list(trained)
    assert vocab_fingerprint(str(folder)) == vocab_fingerprint(trained)
    # the same entries with one merge fewer tokenize differently: another vocabulary
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.json").write_text((folder / "vocab.json").read_text(encoding="utf-8"), encoding="utf-8")
    (other / "merges.txt").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    fewer = read_bpe_vocabulary(vocab_json=str(other / "vocab.json"), merges_txt=str(other / "merges.txt"))
    assert vocab_list(fewer) == vocab_list(trained) and vocab_fingerprint(fewer) != vocab_fingerprint(trained)


def test_an_existing_vocabulary_is_adopted_entry_for_entry_with_its_ids(trained, folder, tmp_path):
    # RoBERTa's own layout: <s> <pad> </s> <unk> first, <mask> last
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    pieces = [p for p in sorted(vocab, key=vocab.get) if p != "<mask>"]
    roberta = {p: i for i, p in enumerate([*pieces, "<mask>"])}
    source = tmp_path / "roberta"
    source.mkdir()
    (source / "vocab.json").write_text(json.dumps(roberta), encoding="utf-8")
    (source / "merges.txt").write_text((folder / "merges.txt").read_text(encoding="utf-8"), encoding="utf-8")
    adopted = read_bpe_vocabulary(vocab_json=str(source / "vocab.json"), merges_txt=str(source / "merges.txt"))
    assert adopted.get_vocab() == roberta and adopted.token_to_id("<mask>") == len(roberta) - 1
    text = "The Prime Minister said on Tuesday that Canberra's fires were contained."
    assert [adopted.id_to_token(i) for i in adopted.encode(text).ids] == trained.encode(text).tokens
    assert VocabTables.from_tokens(vocab_list(adopted)).special.mask == len(roberta) - 1
    # with a tokenizer.json beside them, the three must agree
    both = read_bpe_vocabulary(
        vocab_json=str(folder / "vocab.json"),
        merges_txt=str(folder / "merges.txt"),
        tokenizer_json=str(folder / "tokenizer.json"),
    )
    assert vocab_fingerprint(both) == vocab_fingerprint(trained)
    with pytest.raises(InputDataError, match="different entries"):
        read_bpe_vocabulary(
            vocab_json=str(source / "vocab.json"),
            merges_txt=str(source / "merges.txt"),
            tokenizer_json=str(folder / "tokenizer.json"),
        )
    with pytest.raises(InputDataError, match="merges.txt is missing"):
        read_bpe_vocabulary(vocab_json=str(source / "vocab.json"))
    # a WordPiece recipe pointed at it says what to set
    with pytest.raises(InputDataError, match="vocab.model: byte_level_bpe"):
        read_vocabulary(tokenizer_json=str(folder / "tokenizer.json"))


def test_a_documents_sentences_encode_as_its_running_text(trained):
    documents = [["The fires were contained.", "Police said so on Tuesday."], ["Canberra was quiet."]]
    sentences = [s for d in documents for s in d]
    values, lengths = encode_sentences(trained, sentences, np.array([0, 2, 3]))
    for document, (start, end) in zip(documents, [(0, 2), (2, 3)]):
        begin, stop = int(lengths[:start].sum()), int(lengths[:end].sum())
        assert values[begin:stop].tolist() == trained.encode(" ".join(document), add_special_tokens=False).ids
    firsts = [trained.id_to_token(int(values[i])) for i in np.cumsum([0, *lengths[:-1]])]
    assert [first.startswith("Ġ") for first in firsts] == [False, True, False]  # only inside a document


def test_byte_level_bpe_settings_are_checked():
    assert VocabConfig(model="byte_level_bpe").lowercase is False  # cased, as RoBERTa
    with pytest.raises(ValueError, match="vocab.lowercase: byte_level_bpe is cased"):
        VocabConfig(model="byte_level_bpe", lowercase=True)
    with pytest.raises(ValueError, match="vocab.strip_accents applies to WordPiece only"):
        VocabConfig(model="byte_level_bpe", strip_accents=False)
    with pytest.raises(ValueError, match="smaller than the byte alphabet: 256 bytes"):
        VocabConfig(model="byte_level_bpe", vocab_size=260)
    assert VocabConfig(model="byte_level_bpe", vocab_size=261).reserved_tokens == BPE_SPECIAL_TOKENS
