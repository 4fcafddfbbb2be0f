"""bertcore.train.export: DeepSpeed checkpoints of every ZeRO stage and precision consolidate to
the same fp32 weights, and the exported folder is what transformers loads (from_pretrained,
pipeline("fill-mask")) with logits equal to ours."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import torch
import transformers

from bertcore.errors import InputDataError
from bertcore.model.bert import BertForPreTraining, ModelConfig
from bertcore.train.checkpoint import CHECKPOINTS, LocalStageFiles, checkpoint_tag
from bertcore.train.export import HF_FILES, consolidate_checkpoint, export_checkpoint
from bertcore.train.objectives import Pretraining
from bertcore.train.trainer import Trainer
from bertcore.vocab.tokenizer import load_tokenizer
from test_train import SEED, make_run_root, phase_data, tiny_pretrain

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("export")
    return root, make_run_root(root, gensim_data, max_documents=120, dupe_factor=1)


def perturbed_model(cfg: ModelConfig, seed: int = 3) -> BertForPreTraining:
    """Random weights everywhere (biases and LayerNorms too), so equal logits cannot come
    from parameters that are still at their initial zeros and ones."""
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(seed)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


SENTENCES = [
    "The fire crews worked through the night to protect homes.",
    "Police said the man was arrested.",
]


def test_exported_folder_loads_in_transformers_with_our_logits(run_root, tmp_path):
    root, info = run_root
    cfg = ModelConfig.named("tiny", len(info["tokens"]), max_position_embeddings=64)
    ours = perturbed_model(cfg)
    names = export_checkpoint(ours.state_dict(), cfg, str(root / "vocab"), str(tmp_path / "model"))
    assert sorted(names) == sorted(HF_FILES) and sorted(os.listdir(tmp_path / "model")) == sorted(HF_FILES)

    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "model")).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    batch = tokenizer(SENTENCES[0], SENTENCES[1], return_tensors="pt")
    pair = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    # the exported tokenizer is the vocab stage's: same ids as bertcore's loader of it
    assert (
        batch["input_ids"][0, 1:-1].tolist()[:5]
        == load_tokenizer(str(root / "vocab")).encode(SENTENCES[0], add_special_tokens=False).ids[:5]
    )
    with torch.no_grad():
        for inputs in (batch, pair):
            want = ours.full_logits(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
            got = theirs(**inputs)
            real = inputs["attention_mask"].bool()
            assert (got.prediction_logits[real] - want.prediction_logits[real]).abs().max() < 1e-4
            assert (got.seq_relationship_logits - want.seq_relationship_logits).abs().max() < 1e-4

    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "model"), device="cpu")
    predictions = fill("the police said the [MASK] was arrested.", top_k=5)
    assert len(predictions) == 5 and all(p["token_str"].replace(" ", "") for p in predictions)
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and sum(scores) <= 1.0 + 1e-6
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["vocab_size"] == len(info["tokens"]) and config["architectures"] == ["BertForPreTraining"]
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["model_max_length"] == 64


def test_export_refuses_what_transformers_could_not_load(run_root, tmp_path):
    root, info = run_root
    vocab = len(info["tokens"])
    cfg = ModelConfig.named("tiny", vocab)
    state = perturbed_model(cfg).state_dict()
    with pytest.raises(InputDataError, match=r"vocab\.txt has \d+ entries but the model's vocab_size is"):
        export_checkpoint(
            perturbed_model(ModelConfig.named("tiny", vocab + 1)).state_dict(),
            ModelConfig.named("tiny", vocab + 1),
            str(root / "vocab"),
            str(tmp_path / "a"),
        )
    with pytest.raises(ValueError, match="pre_layer_norm"):
        pre = ModelConfig.named("tiny", vocab, pre_layer_norm=True)
        export_checkpoint(BertForPreTraining(pre).state_dict(), pre, str(root / "vocab"), str(tmp_path / "b"))
    untied = dict(state)
    untied["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1.0
    with pytest.raises(ValueError, match="cls.predictions.decoder.weight must equal"):
        export_checkpoint(untied, cfg, str(root / "vocab"), str(tmp_path / "c"))
    empty = tmp_path / "no-vocab"
    empty.mkdir()
    with pytest.raises(InputDataError, match=r"vocab\.txt is missing"):
        export_checkpoint(state, cfg, str(empty), str(tmp_path / "d"))


def _train_and_consolidate(root, info, stage, **overrides) -> dict:
    cfg = tiny_pretrain(
        phases=[{"name": "seq64", "steps": 3, "batch_size": 8, "max_seq_length": 64}],
        warmup_steps=1,
        validation_batches=0,
        **overrides,
    )
    model_cfg = cfg.build_model_config(len(info["tokens"]))
    Trainer(
        cfg, Pretraining(model_cfg), phase_data(root, info), LocalStageFiles(str(stage)), seed=SEED, resume_key="k"
    ).run()
    return consolidate_checkpoint(str(stage / CHECKPOINTS / checkpoint_tag(3)), model_cfg)


def test_every_zero_stage_consolidates_to_the_same_fp32_weights(world_of_one, run_root, tmp_path):
    root, info = run_root
    plain = _train_and_consolidate(root, info, tmp_path / "z0", zero_stage=0)
    trained = BertForPreTraining(tiny_pretrain().build_model_config(len(info["tokens"])))
    assert plain.keys() == trained.state_dict().keys()
    assert all(t.dtype == torch.float32 for t in plain.values())
    for stage in (2, 3):
        other = _train_and_consolidate(root, info, tmp_path / f"z{stage}", zero_stage=stage)
        assert other.keys() == plain.keys()
        worst = max((other[k] - plain[k]).abs().max().item() for k in plain)
        assert worst < 1e-5, (stage, worst)
    # three steps did move the weights away from their initialisation
    init = BertForPreTraining(trained.cfg, torch.Generator()).state_dict()
    assert (
        plain["bert.encoder.layer.0.attention.self.query.weight"]
        - init["bert.encoder.layer.0.attention.self.query.weight"]
    ).abs().max() > 1e-4

    # the full chain: ZeRO-3 checkpoint -> Hugging Face folder -> transformers, same logits as ours
    export_checkpoint(other, trained.cfg, str(root / "vocab"), str(tmp_path / "model"))
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "model")).eval()
    trained.load_state_dict(other)
    ids = torch.randint(5, len(info["tokens"]), (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (
            theirs(input_ids=ids).prediction_logits - trained.eval().full_logits(ids).prediction_logits
        ).abs().max() < 1e-4


def test_bf16_checkpoints_export_the_fp32_master_weights(world_of_one, run_root, tmp_path):
    root, info = run_root
    stage0 = _train_and_consolidate(root, info, tmp_path / "bf16-z0", precision="bf16", zero_stage=0)
    stage1 = _train_and_consolidate(root, info, tmp_path / "bf16-z1", precision="bf16", zero_stage=1)
    key = "bert.encoder.layer.1.output.dense.weight"
    for state in (stage0, stage1):
        assert state[key].dtype == torch.float32
        # masters, not the 16-bit module copies: most values are not representable in bf16
        assert (state[key].to(torch.bfloat16).float() != state[key]).float().mean() > 0.5
    worst = max((stage0[k] - stage1[k]).abs().max().item() for k in stage0)
    assert worst < 5e-3
