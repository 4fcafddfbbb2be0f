"""The vocab stage on local Ray: files transformers and tokenizers load, statistics,
determinism, Korean kept as syllables, and clear errors for impossible settings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest
from tokenizers import Tokenizer

from bertcore.errors import BertpipeError, ConfigError
from pipelines.registry import load_config
from pipelines.runner import Pipeline
from pipelines.stage_dir import StageDir
from pipelines.stages.vocab import work as vocab
from pipelines.storage import Storage, sha256_file

FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
KOREAN = Path(__file__).resolve().parents[2] / "configs" / "korean.yaml"


def test_vocab_files_load_in_transformers_and_tokenizers(demo_pipeline):
    from transformers import AutoTokenizer, BertTokenizerFast

    cfg, manifests = demo_pipeline
    directory = Path(cfg.run.root) / "vocab"
    assert sorted(s.path for s in manifests["vocab"].shards) == sorted(FILES)
    lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == cfg.vocab.vocab_size == 4000
    assert [lines[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    fast = Tokenizer.from_file(str(directory / "tokenizer.json"))
    for loaded in (BertTokenizerFast.from_pretrained(str(directory)), AutoTokenizer.from_pretrained(str(directory))):
        encoded = loaded("The river flows north.", "It floods in spring.")
        assert encoded["input_ids"][0] == 101 and encoded["input_ids"][-1] == 102
        assert set(encoded["token_type_ids"]) == {0, 1}
        assert encoded["input_ids"] == fast.encode("The river flows north.", "It floods in spring.").ids


def test_vocab_statistics(demo_pipeline):
    cfg, manifests = demo_pipeline
    stats = manifests["vocab"].stats
    assert 0 <= stats["unk_rate"] < 0.01
    # The manifest's figures are what the written tokenizer does on the held-out split.
    tok = Tokenizer.from_file(str(Path(cfg.run.root) / "vocab" / "tokenizer.json"))
    held_out = []
    for path in sorted((Path(cfg.run.root) / "corpus" / "validation").glob("part-*.arrow")):
        with pa.memory_map(str(path)) as source:
            held_out += pc.list_flatten(ipc.open_file(source).read_all().column("sentences")).to_pylist()
    held_out = held_out[: vocab.STATS_SENTENCES]
    assert stats["sentences"] == len(held_out) > 0
    words = sum(len(tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(s))) for s in held_out)
    pieces = sum(len(e.ids) for e in tok.encode_batch(held_out, add_special_tokens=False))
    assert stats["pieces_per_word"] == pytest.approx(pieces / words)
    assert 0 < stats["vocab_used_fraction"] <= 1
    assert stats["vocab_size"] == 4000 and stats["alphabet_size"] > 26
    assert stats["top_pieces"][0][1] >= stats["top_pieces"][-1][1]


def test_same_shards_and_seed_give_same_vocab(demo_pipeline, tmp_path):
    cfg, manifests = demo_pipeline
    shutil.copytree(Path(cfg.run.root) / "corpus", tmp_path / "corpus")
    again = cfg.model_copy(update={"run": cfg.run.model_copy(update={"root": str(tmp_path)})})
    manifest, computed = Pipeline(again).run("vocab", parallelism=1)
    assert computed
    assert sha256_file(str(tmp_path / "vocab" / "vocab.txt")) == sha256_file(
        str(Path(cfg.run.root) / "vocab" / "vocab.txt")
    )
    assert manifest.fingerprint == manifests["vocab"].fingerprint


def test_vocab_smaller_than_alphabet_is_refused(demo_pipeline, tmp_path):
    cfg, _ = demo_pipeline
    shutil.copytree(Path(cfg.run.root) / "corpus", tmp_path / "corpus")
    small = cfg.model_copy(
        update={
            "run": cfg.run.model_copy(update={"root": str(tmp_path)}),
            "vocab": cfg.vocab.model_copy(update={"vocab_size": 150}),
        }
    )
    with pytest.raises(ConfigError, match="vocab.vocab_size"):
        Pipeline(small).run("vocab")
    assert StageDir(Storage(small.storage), str(tmp_path), "vocab").manifest() is None


def test_empty_corpus_is_refused(tmp_path, ray_cluster):
    text = tmp_path / "tiny.txt"
    text.write_text("Too short.\n", encoding="utf-8")
    cfg = load_config(None, [f"run.root={tmp_path / 'run'}", f"corpus.inputs=[{{uri: '{text}', format: lines}}]"])
    storage = Storage(cfg.storage)
    Pipeline(cfg, storage).run("corpus")
    with pytest.raises(ConfigError, match="no training sentences"):
        Pipeline(cfg, storage).run("vocab")


def test_missing_corpus_names_the_stage(tmp_path, ray_cluster):
    cfg = load_config(None, [f"run.root={tmp_path}", "corpus.inputs=['x.txt']"])
    with pytest.raises(BertpipeError, match="corpus stage has no output"):
        Pipeline(cfg).run("vocab")


def test_unknown_vocab_option_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"vocab\.lowercaes: unknown key"):
        load_config(None, ["corpus.inputs=['x.txt']", "vocab.lowercaes=false"])


def test_korean_recipe_keeps_syllables(tmp_path, ray_cluster):
    cfg = load_config(KOREAN, [f"run.root={tmp_path}"])
    storage = Storage(cfg.storage)
    Pipeline(cfg, storage).run("corpus")
    manifest, _ = Pipeline(cfg, storage).run("vocab")
    pieces = (tmp_path / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    jamo = [p for p in pieces if any(0x1100 <= ord(c) <= 0x11FF for c in p)]
    assert jamo == []
    assert any("\uac00" <= c <= "\ud7a3" for p in pieces for c in p)  # Hangul syllables present
    assert manifest.stats["unk_rate"] < 0.01
    tokenizer = Tokenizer.from_file(str(tmp_path / "vocab" / "tokenizer.json"))
    tokens = tokenizer.encode("대한민국은 민주공화국이다. Café au lait.").tokens
    assert not any(0x1100 <= ord(c) <= 0x11FF for t in tokens for c in t)
    assert tokenizer.normalizer.normalize_str("Café 한국어") == "cafe 한국어"
