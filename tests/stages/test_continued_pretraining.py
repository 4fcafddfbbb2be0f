"""Continued pretraining end to end on local Ray: an existing model folder (random weights
saved by transformers, a vocabulary in Google's layout written here) is the starting point;
the vocab stage adopts its vocabulary, a RoBERTa-style objective (no NSP) trains it through
Ray Train and DeepSpeed, and the export is a BertForMaskedLM of the starting model's shape."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import safetensors.torch
import torch
import transformers

from bertcore.eval.intrinsic import load_pretraining_model
from bertcore.vocab.config import VocabConfig
from bertcore.vocab.tokenizer import read_vocab, train_wordpiece, vocab_list
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline
from test_vocab_adopt import google_folder, lee_sentences


def starting_model(folder, gensim_data) -> list[str]:
    tokens = vocab_list(train_wordpiece(lee_sentences(gensim_data), VocabConfig(vocab_size=900, limit_alphabet=150)))
    google_folder(folder, tokens, do_lower_case=True)
    config = transformers.BertConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=160,
        max_position_embeddings=96,
    )
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).save_pretrained(str(folder))
    return tokens


def recipe(root, gensim_data, start) -> PipelineConfig:
    return PipelineConfig(
        run={"root": str(root), "seed": 11},
        corpus={
            "inputs": [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines"}],
            "min_sentences": 2,
            "min_chars": 100,
        },
        vocab={"source": "pretrained"},  # vocab.pretrained defaults to pretrain.init_from
        examples={"objective": "roberta", "max_seq_length": 64, "length_bins": [32, 64]},
        pretrain={
            "init_from": str(start),
            "model_overrides": {"hidden_dropout_prob": 0.0},
            "num_workers": 1,
            "learning_rate": 1e-3,
            "warmup_steps": 3,
            "phases": [{"name": "seq64", "steps": 30, "batch_size": 16}],
            "eval_every": 10,
            "checkpoint_every": 15,
            "validation_batches": 2,
            "torch_threads": 1,
        },
    )


@pytest.mark.slow
def test_continued_pretraining_adopts_the_vocabulary_trains_the_weights_and_exports_a_masked_lm(
    ray_cluster, gensim_data, tmp_path
):
    start = tmp_path / "start"
    tokens = starting_model(start, gensim_data)
    cfg = recipe(tmp_path / "run", gensim_data, start)
    assert cfg.vocab.pretrained == str(start)
    pipeline = Pipeline(cfg)
    manifests = {name: pipeline.run(name)[0] for name in ("corpus", "vocab", "examples", "pretrain")}

    assert manifests["vocab"].stats["adopted"]["from"] == str(start)
    assert read_vocab(str(tmp_path / "run" / "vocab" / "vocab.txt")) == tokens
    stats = manifests["pretrain"].stats
    assert stats["steps"] == 30 and [v["step"] for v in stats["validation_curve"]] == [10, 20, 30]
    assert stats["init_from"]["uri"] == str(start)
    assert sorted(stats["init_from"]["fresh"]) == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
        "cls.seq_relationship.bias",
        "cls.seq_relationship.weight",
    ]
    assert all(v["nsp_accuracy"] is None for v in stats["validation_curve"])  # roberta: no NSP labels

    model_dir = tmp_path / "run" / "pretrain" / "model"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"] and (config["hidden_size"], config["intermediate_size"]) == (
        64,
        160,
    )
    trained = transformers.AutoModelForMaskedLM.from_pretrained(str(model_dir))
    before = safetensors.torch.load_file(str(start / "model.safetensors"))["bert.embeddings.word_embeddings.weight"]
    after = trained.bert.embeddings.word_embeddings.weight.detach()
    drift = float((after - before).norm() / before.norm())
    assert 0.001 < drift < 0.5, drift  # it moved, from where the starting model was
    assert load_pretraining_model(str(model_dir)).cfg.hidden_size == 64  # the evaluate stage reads a masked-LM export

    # the starting weights are an input: new weights, new pretrain fingerprint (the vocabulary is the same)
    changed = transformers.BertForMaskedLM.from_pretrained(str(start))
    with torch.no_grad():
        changed.bert.encoder.layer[0].output.dense.bias.add_(0.01)
    changed.save_pretrained(str(start))
    again = Pipeline(recipe(tmp_path / "run", gensim_data, start))
    assert again.expected_fingerprint("vocab") == manifests["vocab"].fingerprint
    assert again.expected_fingerprint("pretrain") != manifests["pretrain"].fingerprint
