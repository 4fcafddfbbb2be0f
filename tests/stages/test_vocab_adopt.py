"""Adopting an existing BERT vocabulary (vocab.source: pretrained): a Google-style
vocab.txt with its tokenizer_config.json, or a tokenizer.json, is kept entry for entry and
tokenizes as its own tokenizer does (checked against transformers' pure-Python BERT
tokenizer, Google's algorithm); the vocab stage adopts it from a folder, a file or S3,
fingerprints its content, and the examples stage accepts what it writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertcore.config import StorageConfig
from bertcore.errors import ConfigError, InputDataError
from bertcore.vocab.adopt import read_vocabulary
from bertcore.vocab.config import VocabConfig
from bertcore.vocab.tokenizer import (
    load_tokenizer,
    read_vocab,
    save_tokenizer,
    tokenizer_from_vocab,
    train_wordpiece,
    vocab_fingerprint,
    vocab_list,
)
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline
from pipelines.storage import Storage, join

KOREAN = "한국어 문장을 읽는다."
# entries Google's multilingual vocabulary has for Korean: jamo pieces (its normalizer
# decomposes syllables), plus the syllables a tokenizer that recomposes would look for
KOREAN_ENTRIES = ["ᄒ", "##ᅡ", "##ᆫ", "##ᄀ", "##ᅮ", "##ᆨ", "##ᄋ", "##ᅥ", "한국", "##어", "문장", "##을"]
SENTENCES = [
    "The Prime Minister said on Tuesday that Canberra's fires were contained.",
    "Café in Zürich, NAÏVE résumé!",
    KOREAN,
]
ADOPT = VocabConfig(source="pretrained", pretrained="unused")


def lee_sentences(gensim_data: Path, documents: int = 300) -> list[str]:
    lines = (gensim_data / "lee_background.cor").read_text(encoding="utf-8", errors="replace").splitlines()[:documents]
    return [s.strip() for line in lines for s in line.split(". ") if s.strip()]


def google_folder(folder: Path, tokens: list[str], do_lower_case: bool) -> Path:
    """What a Google/Hugging Face BERT folder holds for its tokenizer: vocab.txt and the
    tokenizer_config.json transformers reads the casing from."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case})
    )
    return folder


@pytest.fixture(scope="module")
def google_tokens(gensim_data) -> dict[bool, list[str]]:
    """An uncased and a cased vocabulary in Google's layout, Korean entries appended."""
    out = {}
    for lowercase in (True, False):
        cfg = VocabConfig(vocab_size=900, lowercase=lowercase, limit_alphabet=150)
        out[lowercase] = [*vocab_list(train_wordpiece(lee_sentences(gensim_data), cfg)), *KOREAN_ENTRIES]
    return out


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_a_google_vocab_txt_is_kept_entry_for_entry_and_tokenizes_as_googles_tokenizer(
    google_tokens, tmp_path, lowercase
):
    folder = google_folder(tmp_path / "model", google_tokens[lowercase], do_lower_case=lowercase)
    adopted = read_vocabulary(
        vocab_txt=str(folder / "vocab.txt"), tokenizer_config=str(folder / "tokenizer_config.json")
    )
    tokenizer = adopted.tokenizer(ADOPT)
    effective = adopted.config(ADOPT)
    assert (effective.lowercase, effective.strip_accents_effective, effective.recompose_nfc) == (
        lowercase,
        lowercase,
        False,
    )
    save_tokenizer(tokenizer, effective, str(tmp_path / "adopted"))
    assert read_vocab(str(tmp_path / "adopted" / "vocab.txt")) == google_tokens[lowercase]  # one for one, in order

    reference = BertTokenizerLegacy(vocab_file=str(folder / "vocab.txt"), do_lower_case=lowercase)
    for sentence in SENTENCES:
        assert tokenizer.encode(sentence, add_special_tokens=False).tokens == reference.tokenize(sentence), sentence
    if lowercase:  # Korean goes to jamo, as Google's does; a recomposing tokenizer would find other entries
        recomposing = tokenizer_from_vocab(
            google_tokens[lowercase], effective.model_copy(update={"recompose_nfc": True})
        )
        assert (
            recomposing.encode(KOREAN, add_special_tokens=False).tokens
            != tokenizer.encode(KOREAN, add_special_tokens=False).tokens
        )


def test_a_tokenizer_json_brings_its_own_options(gensim_data, tmp_path):
    # bertcore's own files (NFC after BERT's normalizer): adopting them changes nothing
    trained_cfg = VocabConfig(vocab_size=700, lowercase=False, limit_alphabet=150)
    save_tokenizer(train_wordpiece(lee_sentences(gensim_data, 100), trained_cfg), trained_cfg, str(tmp_path / "ours"))
    adopted = read_vocabulary(tokenizer_json=str(tmp_path / "ours" / "tokenizer.json"))
    assert adopted.found == {
        "lowercase": False,
        "strip_accents": False,
        "tokenize_chinese_chars": True,
        "max_input_chars_per_word": 100,
        "recompose_nfc": True,
    }
    save_tokenizer(adopted.tokenizer(ADOPT), adopted.config(ADOPT), str(tmp_path / "again"))
    assert vocab_fingerprint(str(tmp_path / "again")) == vocab_fingerprint(str(tmp_path / "ours"))

    # a tokenizer.json as Hugging Face converts BERT's: BertNormalizer alone, accents kept, 200-character words
    tokens = vocab_list(load_tokenizer(str(tmp_path / "ours")))
    hf = Tokenizer(
        models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]", max_input_chars_per_word=200)
    )
    hf.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.save(str(tmp_path / "hf.json"))
    found = read_vocabulary(tokenizer_json=str(tmp_path / "hf.json")).found
    assert found == {
        "lowercase": True,
        "strip_accents": False,
        "tokenize_chinese_chars": True,
        "max_input_chars_per_word": 200,
        "recompose_nfc": False,
    }


def test_files_that_disagree_or_are_not_bert_are_refused(google_tokens, tmp_path):
    folder = google_folder(tmp_path / "cased", google_tokens[False], do_lower_case=False)
    adopted = read_vocabulary(
        vocab_txt=str(folder / "vocab.txt"), tokenizer_config=str(folder / "tokenizer_config.json")
    )
    with pytest.raises(
        ConfigError, match=r"vocab\.lowercase is True but .*tokenizer_config\.json says False; remove vocab\.lowercase"
    ):
        adopted.config(VocabConfig(source="pretrained", pretrained="x", lowercase=True))
    assert (
        adopted.config(VocabConfig(source="pretrained", pretrained="x", lowercase=False)).lowercase is False
    )  # agreeing is fine

    save_tokenizer(adopted.tokenizer(ADOPT), adopted.config(ADOPT), str(tmp_path / "written"))
    shifted = google_tokens[False][:200] + google_tokens[False][201:] + ["extra"]
    (tmp_path / "written" / "vocab.txt").write_text("".join(t + "\n" for t in shifted))
    with pytest.raises(InputDataError, match=r"vocab\.txt line 201 is .* but .*tokenizer\.json has .* at id 200"):
        read_vocabulary(
            vocab_txt=str(tmp_path / "written" / "vocab.txt"),
            tokenizer_json=str(tmp_path / "written" / "tokenizer.json"),
        )
    (tmp_path / "uncased.json").write_text(json.dumps({"do_lower_case": True}))
    with pytest.raises(InputDataError, match=r"uncased\.json: lowercase is True but .*tokenizer\.json says False"):
        read_vocabulary(
            tokenizer_json=str(tmp_path / "written" / "tokenizer.json"), tokenizer_config=str(tmp_path / "uncased.json")
        )

    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    bpe.save(str(tmp_path / "bpe.json"))
    with pytest.raises(InputDataError, match=r"bpe\.json: a BPE model, not WordPiece"):
        read_vocabulary(tokenizer_json=str(tmp_path / "bpe.json"))
    (tmp_path / "nomask.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(InputDataError, match=r"nomask\.txt: vocabulary lacks the special tokens \['\[MASK\]'\]"):
        read_vocabulary(vocab_txt=str(tmp_path / "nomask.txt")).tokenizer(ADOPT)


# -- the vocab stage ---------------------------------------------------------------------------


def recipe(root: Path, gensim_data: Path, vocab: dict, **sections) -> PipelineConfig:
    sections.setdefault(
        "pretrain",
        {"model_size": "tiny", "num_workers": 1, "phases": [{"name": "seq64", "steps": 10, "batch_size": 8}]},
    )
    return PipelineConfig(
        run={"root": str(root), "seed": 7},
        corpus={
            "inputs": [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines"}],
            "min_sentences": 2,
            "min_chars": 100,
        },
        vocab=vocab,
        examples={
            "phases": [{"name": "seq64", "max_seq_length": 64, "max_predictions_per_seq": 10}],
            "dupe_factor": 1,
            "length_bins": [32, 64],
        },
        **sections,
    )


def test_the_vocab_stage_adopts_a_folder_and_the_examples_stage_accepts_it(
    ray_cluster, gensim_data, google_tokens, tmp_path
):
    folder = google_folder(tmp_path / "google", google_tokens[False], do_lower_case=False)
    cfg = recipe(tmp_path / "run", gensim_data, {"source": "pretrained", "pretrained": str(folder)})
    pipeline = Pipeline(cfg)
    pipeline.run("corpus")
    manifest, computed = pipeline.run("vocab")
    assert computed and read_vocab(str(tmp_path / "run" / "vocab" / "vocab.txt")) == google_tokens[False]
    adopted = manifest.stats["adopted"]
    assert adopted["from"] == str(folder) and adopted["files"] == ["vocab.txt", "tokenizer_config.json"]
    assert adopted["options"]["lowercase"] is False and adopted["options"]["recompose_nfc"] is False
    assert (
        manifest.stats["vocab_size"] == len(google_tokens[False])
        and manifest.stats["sentences"] > 0
        and manifest.stats["unk_rate"] < 0.01
    )
    examples, _ = pipeline.run("examples")
    assert examples.stats["vocab_fingerprint"] == manifest.stats["vocab_fingerprint"] and examples.rows > 0

    # the fingerprint follows the files' content, not their path: a moved copy is the same
    # vocabulary, an edited file another one
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    again = Pipeline(recipe(tmp_path / "run", gensim_data, {"source": "pretrained", "pretrained": str(moved)}))
    assert again.external("vocab").identity != pipeline.external("vocab").identity  # it names the files read...
    assert list(again.external("vocab").identity["pretrained"].values()) == list(
        pipeline.external("vocab").identity["pretrained"].values()
    )
    (moved / "vocab.txt").write_text("".join(t + "\n" for t in [*google_tokens[False], "extra"]))
    edited = Pipeline(recipe(tmp_path / "run", gensim_data, {"source": "pretrained", "pretrained": str(moved)}))
    assert edited.expected_fingerprint("vocab") != again.expected_fingerprint("vocab")
    assert edited.dir("vocab").state(edited.expected_fingerprint("vocab")) == "stale"


def test_the_vocab_stage_adopts_one_file_from_s3(ray_cluster, s3_bucket, gensim_data, google_tokens, tmp_path):
    endpoint, bucket = s3_bucket
    storage = Storage(StorageConfig(endpoint_url=endpoint))
    uri = join(f"s3://{bucket}", "models", "bert-base-cased-vocab.txt")
    storage.write_bytes(uri, "".join(t + "\n" for t in google_tokens[False]).encode())
    cfg = recipe(
        tmp_path / "run",
        gensim_data,
        {"source": "pretrained", "pretrained": uri, "lowercase": False},
        storage={"endpoint_url": endpoint},
    )
    pipeline = Pipeline(cfg, storage)
    pipeline.run("corpus")
    manifest, _ = pipeline.run("vocab")
    assert manifest.stats["adopted"]["files"] == ["bert-base-cased-vocab.txt"]
    assert manifest.inputs["pretrained"] == {uri: storage.signature(uri)}  # the object's ETag
    assert read_vocab(str(tmp_path / "run" / "vocab" / "vocab.txt")) == google_tokens[False]
    # no tokenizer_config.json: the recipe's casing holds
    assert manifest.stats["adopted"]["options"]["lowercase"] is False


def test_adopting_needs_a_source(tmp_path, gensim_data):
    with pytest.raises(
        ConfigError, match=r"vocab\.pretrained: .*nope is neither a vocab\.txt, a tokenizer\.json nor a folder"
    ):
        Pipeline(
            recipe(tmp_path, gensim_data, {"source": "pretrained", "pretrained": str(tmp_path / "nope")})
        ).external("vocab")
    with pytest.raises(ValueError, match=r"vocab\.pretrained is set but vocab\.source is train"):
        VocabConfig(pretrained=str(tmp_path))
