"""RoBERTa end to end on local Ray: the demo's news text, a byte-level BPE vocabulary, packed
FULL-SENTENCES examples with dynamic whole-word masking, a tiny RoBERTa trained a few steps
through Ray Train and DeepSpeed; the export is a folder that transformers' fill-mask
pipeline loads as RoBERTa, without a warning."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import transformers

from bertcore.vocab.tokenizer import load_tokenizer
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline
from test_roberta_model import loaded_quietly


def recipe(root, gensim_data) -> PipelineConfig:
    return PipelineConfig(
        run={"root": str(root), "seed": 5},
        corpus={
            "inputs": [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines", "name": "lee-news"}],
            "min_sentences": 2,
            "min_chars": 200,
            "validation_fraction": 0.05,
        },
        vocab={"model": "byte_level_bpe", "vocab_size": 1000},
        examples={"objective": "roberta", "max_seq_length": 64, "length_bins": [32, 64], "whole_word_mask": True},
        pretrain={
            "model_size": "tiny",
            "num_workers": 1,
            "learning_rate": 1e-3,
            "warmup_steps": 2,
            "phases": [{"name": "seq64", "steps": 8, "batch_size": 16}],
            "checkpoint_every": 8,
            "validation_batches": 0,
            "torch_threads": 1,
        },
    )


@pytest.mark.slow
def test_a_roberta_run_exports_what_fill_mask_loads_as_roberta(ray_cluster, gensim_data, tmp_path):
    pipeline = Pipeline(recipe(tmp_path / "run", gensim_data))
    manifests = {name: pipeline.run(name)[0] for name in ("corpus", "vocab", "examples", "pretrain")}

    vocab_dir = tmp_path / "run" / "vocab"
    assert {s.path for s in manifests["vocab"].shards} == {
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    assert manifests["vocab"].stats["vocab_size"] == 1000 and manifests["vocab"].stats["unk_rate"] == 0.0
    stats = manifests["examples"].stats
    assert stats["vocab_size"] == 1000 and stats["phases"]["seq64"]["train"]["nsp_labels"] == {
        "-1": stats["phases"]["seq64"]["train"]["examples"]
    }
    assert manifests["pretrain"].stats["steps"] == 8

    model_dir = tmp_path / "run" / "pretrain" / "model"
    assert not (tmp_path / "run" / "pretrain" / "model-mlm").exists()
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("roberta", ["RobertaForMaskedLM"])
    assert (config["max_position_embeddings"], config["type_vocab_size"], config["pad_token_id"]) == (514, 1, 1)
    fill, said = loaded_quietly(lambda: transformers.pipeline("fill-mask", model=str(model_dir), device="cpu"))
    assert said == [], said
    assert type(fill.model).__name__ == "RobertaForMaskedLM" and type(fill.tokenizer).__name__.startswith(
        "RobertaTokenizer"
    )
    predictions, said = loaded_quietly(lambda: fill("The Prime Minister said the fires were <mask>.", top_k=5))
    assert said == [] and len(predictions) == 5
    # the exported tokenizer is the vocab stage's, id for id
    text = "Police said on Tuesday that the fires near Canberra were contained."
    assert fill.tokenizer(text)["input_ids"] == load_tokenizer(str(vocab_dir)).encode(text).ids
