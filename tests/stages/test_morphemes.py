"""Korean morphemes before WordPiece (vocab.pre_tokenizer: kiwi | mecab): the split, the
vocabulary trained on it, the one recorded setting that the vocab, examples and evaluate
stages all read, whole-eojeol masking, and the one-line error for a missing analyser."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pyarrow as pa
import pytest
import torch

from bertcore.errors import ConfigError
from bertcore.examples.masking import MaskConfig, MaskDraws, mask_batch, mask_sequences, mask_tokens
from bertcore.examples.vocab_tables import VocabTables
from bertcore.vocab import morphemes
from bertcore.vocab.encode import encode_sentences
from bertcore.vocab.tokenizer import (
    VocabConfig,
    build_normalizer,
    load_tokenizer,
    save_tokenizer,
    tokenization_stats,
    train_wordpiece,
    vocab_fingerprint,
    vocab_list,
)

# Written for this test: a few nouns (국민, 정부, 학교, 과일, ...) with many particles and endings.
TRAIN = [
    "국민은 누구나 법률이 정하는 바에 따라 교육을 받을 권리가 있다.",
    "국민의 권리는 법률로 보호된다.",
    "정부는 국민의 의견을 듣고 새 정책을 발표했다.",
    "정부가 발표한 정책은 국민에게 큰 도움이 되었다.",
    "위원회는 정부에 보고서를 제출했다.",
    "위원회의 보고서는 국회에서 논의되었다.",
    "국회는 정부의 예산을 심사한다.",
    "학생들은 아침마다 학교에 가서 선생님의 이야기를 들었다.",
    "학교의 도서관은 학생들에게 열려 있다.",
    "선생님은 학생들과 함께 도서관에서 책을 읽었다.",
    "우리 동네 도서관에서 새 책을 빌려 읽었다.",
    "어제 친구와 함께 시장에 가서 과일을 샀다.",
    "친구는 시장에서 산 과일을 동생에게 주었다.",
    "동생은 과일을 좋아해서 매일 과일을 먹는다.",
    "법률은 국민의 자유와 권리를 보장한다.",
    "국회의원은 국민을 대표하여 법률을 만든다.",
    "대통령은 국회에 정책을 설명하였다.",
    "학생은 학교에서 법률과 정책을 배운다.",
    "위원회는 학교의 교육 정책을 검토하였다.",
    "시장은 아침마다 사람들로 붐빈다.",
]
# The same nouns with other particles and verbs: text the vocabularies have not seen.
HELD_OUT = [
    "국민이 정부를 믿는다.",
    "학생이 도서관을 좋아한다.",
    "위원회가 국회의 의견을 들었다.",
    "친구의 동생이 학교에 간다.",
    "정부와 국회가 법률을 바꾸었다.",
    "선생님이 과일을 샀다.",
]
FIRST = [
    "국민",
    "##은",
    "누구",
    "##나",
    "법률",
    "##이",
    "정하",
    "##는",
    "바",
    "##에",
    "따라",
    "교육",
    "##을",
    "받",
    "##을",
    "권리",
    "##가",
    "있",
    "##다",
    ".",
]
"""TRAIN[0] as both analysers split it: 따라 (따르 + 어, overlapping in the text) stays whole."""


def normalized(texts):
    norm = build_normalizer(VocabConfig())
    return [norm.normalize_str(t) for t in texts]


def config(pre_tokenizer: str) -> VocabConfig:
    return VocabConfig(vocab_size=400, bert_layout=False, pre_tokenizer=pre_tokenizer)


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory) -> dict:
    """name -> folder of a vocabulary trained on TRAIN with that split."""
    out = {}
    for name in ("whitespace", "kiwi"):
        folder = tmp_path_factory.mktemp(name)
        save_tokenizer(train_wordpiece(TRAIN, config(name)), config(name), str(folder))
        out[name] = str(folder)
    return out


def test_kiwi_cuts_each_eojeol_at_its_morphemes():
    words = morphemes.split_words(normalized(TRAIN[:3] + ["발표했다"]), "kiwi")
    assert words[0] == FIRST
    assert words[1][:2] == ["국민", "##의"]  # the noun is one word whatever its particle
    assert words[3] == ["발표", "##했", "##다"]  # 했 = 하 + 었 share a character: no cut inside it
    for text, split in zip(normalized(TRAIN[:3]), words):
        assert "".join(w.removeprefix("##") for w in split) == text.replace(" ", "")  # nothing lost or added
    # One noun, four eojeols; one morpheme.
    eojeols = {w for t in normalized(TRAIN) for w in t.replace(".", " ").split()}
    split = {w for words in morphemes.split_words(normalized(TRAIN), "kiwi") for w in words}
    assert {w for w in eojeols if w.startswith("국민")} == {"국민은", "국민의", "국민에게", "국민을"}
    assert {w for w in split if w.startswith("국민")} == {"국민"}


def test_mecab_splits_the_same_sentence_the_same_way():
    assert morphemes.split_words(normalized(TRAIN[:1]), "mecab") == [FIRST]


def test_offsets_point_into_the_original_text(vocabularies):
    tok = load_tokenizer(vocabularies["kiwi"])
    text = "ÉCOLE 국민은  정부의"  # the normalizer changes the length of the text before the split
    enc = tok.encode(text, add_special_tokens=False)
    assert enc.tokens[-4:] == ["국민", "##은", "정부", "##의"]
    assert [text[a:b] for a, b in enc.offsets][-4:] == ["국민", "은", "정부", "의"]


def test_the_morpheme_vocabulary_learns_stems_and_endings_and_loses_less_to_unk(vocabularies):
    kiwi, whitespace = (load_tokenizer(vocabularies[n]) for n in ("kiwi", "whitespace"))
    entries = set(vocab_list(kiwi))
    assert {"국민", "정부", "학교", "과일", "##은", "##의", "##을", "##에서"} <= entries
    # WordPiece on eojeols learns pieces across a morpheme boundary; on morphemes it cannot.
    assert "과일을" in vocab_list(whitespace) and "과일을" not in entries
    for sentence, split in zip(TRAIN, morphemes.split_words(normalized(TRAIN), "kiwi")):
        enc = kiwi.encode(sentence, add_special_tokens=False)
        by_word: dict[int, str] = {}
        for word, token in zip(enc.word_ids, enc.tokens):
            by_word[word] = by_word.get(word, "") + (token if word not in by_word else token.removeprefix("##"))
        assert list(by_word.values()) == split  # every piece lies inside one morpheme; the training text has no [UNK]

    # Unseen text: an unknown stem costs the morpheme, not the whole eojeol (믿는다 -> [UNK] ##는 ##다).
    def unknown_chars(tok) -> int:
        lost = 0
        for sentence in HELD_OUT:
            enc = tok.encode(sentence, add_special_tokens=False)
            lost += sum(b - a for (a, b), t in zip(enc.offsets, enc.tokens) if t == "[UNK]")
        return lost

    assert 0 < unknown_chars(kiwi) < unknown_chars(whitespace)
    ours, theirs = tokenization_stats(kiwi, HELD_OUT), tokenization_stats(whitespace, HELD_OUT)
    assert ours["words"] == theirs["words"]  # pieces per word counts BERT's words for both
    assert ours["unk_rate"] < theirs["unk_rate"]


def test_vocab_examples_and_evaluate_split_alike(vocabularies):
    """One recorded setting: the vocabulary's own tokenizer_config.json; every reader splits as it says."""
    from bertcore.eval.encoder import load_tokenizer as evaluate_tokenizer
    from bertcore.text.lengths import Lengths
    from pipelines.stages.examples.work import _tokenize, _vocabulary

    folder = vocabularies["kiwi"]
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as handle:
        recorded = json.load(handle)
    assert recorded[morphemes.PRE_TOKENIZER_KEY] == "kiwi"
    assert recorded[morphemes.ANALYZER_KEY].startswith("kiwipiepy ")
    assert (
        "does not split Korean morphemes" in recorded[morphemes.NOTE_KEY]
        and "split_as_recorded" in recorded[morphemes.NOTE_KEY]
    )

    tok = load_tokenizer(folder)  # what the vocab stage measures with, and what examples and export load
    first = tok.encode(TRAIN[0], add_special_tokens=False)
    expected = first.ids
    spelled: dict[int, str] = {}
    for word, token in zip(first.word_ids, first.tokens):
        spelled[word] = spelled.get(word, "") + (token if word not in spelled else token.removeprefix("##"))
    assert list(spelled.values()) == FIRST  # the morphemes, each spelled by one or more pieces

    # examples stage: its worker's tokenizer and its batch tokenization, on a corpus record batch
    tokenizer, tables = _vocabulary(folder)
    batch = pa.RecordBatch.from_pydict({"doc_id": ["d0"], "sentences": [[TRAIN[0], TRAIN[1]]]})
    documents = _tokenize(tokenizer, batch, pa.uint16(), Lengths(4096))
    assert documents.to_pylist()[0][0] == expected
    assert encode_sentences(tok, [TRAIN[0]], [0, 1])[0].tolist() == expected
    starts = [not t.startswith("##") for t in first.tokens]
    assert (~tables.is_continuation[expected]).tolist() == starts and sum(
        starts
    ) == 11  # 11 BERT words: 10 eojeols and "."

    # evaluate: the transformers tokenizer fine-tuning and the report use
    hf = evaluate_tokenizer(folder)
    assert hf(TRAIN[0])["input_ids"] == [tok.token_to_id("[CLS]"), *expected, tok.token_to_id("[SEP]")]
    pair = hf(TRAIN[0], TRAIN[1], return_offsets_mapping=True)
    assert pair["input_ids"] == tok.encode(TRAIN[0], TRAIN[1]).ids

    # vocab stage statistics read the saved folder the same way; a copy of the folder (a model
    # folder, an export) carries the setting with it
    assert tokenization_stats(tok, [TRAIN[0]])["words"] == 11
    copy = shutil.copytree(folder, os.path.join(folder + "-copy"))
    assert evaluate_tokenizer(copy).tokenize(TRAIN[0]) == first.tokens

    # the setting is part of the vocabulary's identity
    plain = {k: v for k, v in recorded.items() if not k.startswith("bertpipe_")}
    with open(os.path.join(copy, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump(plain, handle)
    assert vocab_fingerprint(copy) != vocab_fingerprint(folder)
    assert vocab_fingerprint(folder) == vocab_fingerprint(train_wordpiece(TRAIN, config("kiwi")), "kiwi")
    assert type(load_tokenizer(copy).pre_tokenizer).__name__ == "BertPreTokenizer"  # unrecorded: BERT's words


def test_whitespace_writes_the_files_it_wrote_before(vocabularies):
    with open(os.path.join(vocabularies["whitespace"], "tokenizer_config.json"), encoding="utf-8") as handle:
        assert not any(key.startswith("bertpipe_") for key in json.load(handle))
    tok = load_tokenizer(vocabularies["whitespace"])
    assert type(tok.pre_tokenizer).__name__ == "BertPreTokenizer"


def test_the_korean_recipe_with_kiwi_through_the_vocab_and_examples_stages(tmp_path, ray_cluster):
    """The stages on local Ray: the vocab stage records kiwi, and the examples stage's token
    shards hold, for every corpus sentence, the ids its vocabulary's reader gives (a
    sample of the corpus keeps it quick; every sentence is tokenized)."""
    from pathlib import Path

    import pyarrow.ipc as ipc

    from pipelines.registry import load_config
    from pipelines.runner import Pipeline

    recipe = Path(__file__).resolve().parents[2] / "configs" / "korean.yaml"
    cfg = load_config(
        recipe,
        [
            f"run.root={tmp_path}",
            "run.keep_scratch=true",
            "vocab.pre_tokenizer=kiwi",
            "vocab.max_sentences=600",
            "examples.dupe_factor=1",
        ],
    )
    pipeline = Pipeline(cfg)
    manifests = {name: pipeline.run(name)[0] for name in ("corpus", "vocab", "examples")}
    stats = manifests["vocab"].stats
    assert stats[morphemes.PRE_TOKENIZER_KEY] == "kiwi" and manifests["vocab"].headline["split"] == "kiwi morphemes"
    assert stats["unk_rate"] < 0.02

    tok = load_tokenizer(str(tmp_path / "vocab"))
    checked = 0
    for corpus_shard in sorted((tmp_path / "corpus" / "validation").glob("*.arrow")):
        tokens = tmp_path / "examples" / "_tokens" / "validation" / corpus_shard.name
        with ipc.open_file(corpus_shard) as corpus, ipc.open_file(tokens) as stored:
            documents = corpus.read_all().column("sentences").to_pylist()
            segments = stored.read_all().column("segments").to_pylist()
        for sentences, ids in zip(documents, segments):
            expected = [e.ids for e in tok.encode_batch(sentences, add_special_tokens=False) if e.ids]
            assert ids == expected
            checked += len(expected)
    assert checked > 100
    vocab = vocab_list(tok)
    pieces = [vocab[i] for ids in segments for sentence in ids for i in sentence]
    assert sum(p.startswith("##") for p in pieces) > 0.3 * len(pieces)  # particles and endings continue their eojeol


# -- whole-eojeol masking (in the style of tests/unit/test_masking.py) -------------------------


def eojeols(sentence: str, offsets) -> list[int]:
    """The whitespace-delimited word each token's text lies in."""
    return [sentence[:a].count(" ") for a, _ in offsets]


def test_whole_word_masking_masks_the_morphemes_of_one_eojeol_together(vocabularies):
    tok = load_tokenizer(vocabularies["kiwi"])
    tables = VocabTables.from_tokens(vocab_list(tok))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    # Sentences without punctuation: BERT makes a punctuation mark a word of its own.
    texts = [s.rstrip(".") for s in TRAIN]
    sequences, groups = [], []
    for a, b in zip(texts, texts[1:] + texts[:1]):
        ea, eb = (tok.encode(t, add_special_tokens=False) for t in (a, b))
        sequences.append([cls, *ea.ids, sep, *eb.ids, sep])
        groups.append([-1, *eojeols(a, ea.offsets), -1, *(1000 + g for g in eojeols(b, eb.offsets)), -1])
    assert any(len(set(g)) < len(g) - 3 for g in groups)  # eojeols of several morphemes are there to split

    def check(masked_positions, group, whole) -> bool:
        """True when every eojeol is masked whole or not at all."""
        chosen = set(masked_positions)
        split = False
        for g in set(group) - {-1}:
            members = {i for i, x in enumerate(group) if x == g}
            split |= bool(members & chosen) and not members <= chosen
        assert not (whole and split), "an eojeol was masked in part"
        return split

    def static(cfg, rng):
        for tokens, group in zip(sequences, groups):
            yield (
                mask_tokens(tokens, tables.is_continuation[np.asarray(tokens)].tolist(), rng, cfg).masked_positions,
                group,
            )

    rng = random.Random(0)
    words = MaskConfig(vocab=tables, masked_lm_prob=0.3, max_predictions_per_seq=40, whole_word_mask=True)
    tokens = MaskConfig(vocab=tables, masked_lm_prob=0.3, max_predictions_per_seq=40)
    for _ in range(30):
        for positions, group in static(words, rng):
            check(positions, group, whole=True)
    # the check can fail: token-level masking does mask parts of eojeols
    assert any(check(positions, group, whole=False) for _ in range(30) for positions, group in static(tokens, rng))

    # the shards' batched static masking and the loader's dynamic masking follow the same rule
    flat = np.concatenate([np.asarray(s) for s in sequences])
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])])
    width = max(map(len, sequences))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])  # [PAD] is id 0 (bert_layout off)
    special = (ids == 0) | (ids == cls) | (ids == sep)
    for seed in range(30):
        masked = mask_sequences(flat, offsets, MaskDraws.draw(np.random.default_rng(seed), len(flat), tables), words)
        starts = np.concatenate([[0], np.cumsum(masked.counts)])
        _, labels = mask_batch(
            ids,
            special,
            torch.from_numpy(tables.is_continuation[ids.numpy()]),
            torch.Generator().manual_seed(seed),
            words,
        )
        for b, group in enumerate(groups):
            check(masked.positions[starts[b] : starts[b + 1]].tolist(), group, whole=True)
            check(torch.nonzero(labels[b] != -100).flatten().tolist(), group, whole=True)


# -- a missing analyser -------------------------------------------------------------------------


def test_a_missing_analyser_is_one_line_naming_the_key_and_the_package(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mecab", None)  # what `import mecab` meets without python-mecab-ko
    with pytest.raises(ConfigError) as caught:
        morphemes.require("mecab")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("vocab.pre_tokenizer is mecab but python-mecab-ko is not installed")
    assert "pip install python-mecab-ko" in message
    # a folder whose vocabulary was split by mecab, read where mecab is missing: the same line
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({morphemes.PRE_TOKENIZER_KEY: "mecab"}), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="pip install python-mecab-ko"):
        morphemes.split_as_recorded(object(), str(tmp_path))


def test_the_run_says_how_to_load_a_morpheme_tokenizer():
    from flows import summary

    model = os.path.join("runs", "korean", "pretrain", "model")
    stages = [{"stage": "vocab", "state": "computed"}, {"stage": "pretrain", "state": "computed", "model": model}]
    plain = summary.next_commands(stages, "runs/korean", "configs/korean.yaml", [])
    stages[0]["morphemes"] = "kiwi"
    lines = summary.next_commands(stages, "runs/korean", "configs/korean.yaml", [])
    assert [line for line in lines if line not in plain] == [" " * 17 + morphemes.run_note("kiwi", model)]
    assert (
        "AutoTokenizer alone does not" in lines[1]
        and f'split_as_recorded(AutoTokenizer.from_pretrained("{model}"), "{model}")' in lines[1]
    )


def test_the_setting_at_its_default_leaves_runs_made_before_it_complete():
    """vocab.pre_tokenizer came after runs were made: a manifest recorded without it gives the
    fingerprint a whitespace section gives now; kiwi makes another; byte-level BPE refuses it."""
    from pydantic import ValidationError

    from pipelines.registry import REGISTRY
    from pipelines.stage import fingerprint

    stage = REGISTRY["vocab"]
    now = stage.section.model_validate({"vocab_size": 3000})
    recorded = {k: v for k, v in now.model_dump(mode="json").items() if k not in ("model", "pre_tokenizer")}
    before = fingerprint(stage.name, stage.code_version, stage.config_identity(recorded), {"corpus": "c", "seed": 1})
    assert stage.fingerprint(now, 1, {"corpus": "c"}, None) == before
    kiwi = stage.section.model_validate({"vocab_size": 3000, "pre_tokenizer": "kiwi"})
    assert stage.fingerprint(kiwi, 1, {"corpus": "c"}, None) != before
    with pytest.raises(ValidationError, match="vocab.pre_tokenizer applies to WordPiece only"):
        stage.section.model_validate({"model": "byte_level_bpe", "lowercase": False, "pre_tokenizer": "kiwi"})
