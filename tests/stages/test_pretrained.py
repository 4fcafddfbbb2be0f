"""Existing Hugging Face BERT folders as starting points (bertcore.model.pretrained) and exports
without an NSP head: folders are written here by transformers from random weights (no
download), read back into bertcore's model, and compared logit for logit."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import safetensors.torch
import torch
import transformers

from bertcore.errors import InputDataError
from bertcore.model.bert import BertForPreTraining, ModelConfig
from bertcore.model.pretrained import load_into, model_config, read_weights
from bertcore.train.checkpoint import LocalStageFiles
from bertcore.train.export import export_checkpoint
from bertcore.train.metrics_log import METRICS, MetricsLog
from bertcore.train.objectives import Pretraining
from bertcore.train.phase_data import WorkerContext, endless_batches, phase_loader
from bertcore.train.trainer import Trainer
from test_train import SEED, make_run_root, phase_data, tiny_pretrain

torch.set_num_threads(1)
NSP_AND_POOLER = [
    "bert.pooler.dense.weight",
    "bert.pooler.dense.bias",
    "cls.seq_relationship.weight",
    "cls.seq_relationship.bias",
]


def hf_config(vocab_size: int, **overrides) -> transformers.BertConfig:
    """A small BERT that is not one of bertcore's named sizes (3 layers, 96 wide, FFN 200)."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=200,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertConfig(**{**fields, **overrides})


def save(model: transformers.PreTrainedModel, folder, **kwargs) -> str:
    torch.manual_seed(7)  # transformers draws its initialisation from the global RNG
    with torch.no_grad():  # move biases and LayerNorms off their 0/1 starts, so they are compared too
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    model.save_pretrained(str(folder), **kwargs)
    return str(folder)


def ours_from(folder: str) -> tuple[BertForPreTraining, list[str]]:
    cfg = model_config(folder)
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(1)).eval()
    return model, load_into(model, read_weights(folder)).fresh


IDS = torch.randint(5, 300, (2, 17), generator=torch.Generator().manual_seed(3))


def test_masked_lm_weights_land_in_our_model_and_only_the_nsp_head_and_pooler_start_fresh(tmp_path):
    folder = save(transformers.BertForMaskedLM(hf_config(300)), tmp_path / "mlm")
    cfg = model_config(folder)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (3, 96, 200, 300)
    ours, fresh = ours_from(folder)
    assert sorted(fresh) == sorted(NSP_AND_POOLER)
    theirs = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs(input_ids=IDS).logits
        assert (ours.full_logits(IDS).prediction_logits - expected).abs().max() < 1e-4
    # the fresh parts are the seeded initialisation, so two loads agree
    again, _ = ours_from(folder)
    assert torch.equal(again.cls.seq_relationship.weight, ours.cls.seq_relationship.weight)


@pytest.mark.parametrize("serialization", ["safetensors", "sharded"])
def test_pretraining_weights_load_whole_from_every_file_format(tmp_path, serialization):
    model = transformers.BertForPreTraining(hf_config(300))
    folder = save(model, tmp_path / "pt", **({"max_shard_size": "300KB"} if serialization == "sharded" else {}))
    files = os.listdir(folder)
    assert {"safetensors": "model.safetensors", "sharded": "model.safetensors.index.json"}[serialization] in files
    assert serialization != "sharded" or len([n for n in files if n.startswith("model-")]) > 1
    ours, fresh = ours_from(folder)
    assert fresh == []
    theirs = transformers.BertForPreTraining.from_pretrained(folder).eval()
    with torch.no_grad():
        out = theirs(input_ids=IDS)
        logits = ours.full_logits(IDS)
    assert (logits.prediction_logits - out.prediction_logits).abs().max() < 1e-4
    assert (logits.seq_relationship_logits - out.seq_relationship_logits).abs().max() < 1e-5


def test_tensorflow_names_and_a_bare_encoder_are_read_too(tmp_path):
    folder = save(transformers.BertModel(hf_config(300)), tmp_path / "encoder")
    state = safetensors.torch.load_file(os.path.join(folder, "model.safetensors"))
    assert not any(k.startswith("bert.") for k in state)  # BertModel's own names
    # the spelling of checkpoints converted from Google's TensorFlow files
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in state.items()
    }
    safetensors.torch.save_file(renamed, os.path.join(folder, "model.safetensors"))
    ours, fresh = ours_from(folder)
    assert sorted(fresh) == sorted(
        [
            "cls.predictions.bias",
            "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.LayerNorm.weight",
            "cls.predictions.transform.LayerNorm.bias",
            "cls.seq_relationship.weight",
            "cls.seq_relationship.bias",
        ]
    )
    encoder = transformers.BertModel(hf_config(300)).eval()
    encoder.load_state_dict(state)
    with torch.no_grad():
        assert (ours.bert(IDS) - encoder(input_ids=IDS).last_hidden_state).abs().max() < 1e-4
        assert (ours.bert.pooler(ours.bert(IDS)) - encoder(input_ids=IDS).pooler_output).abs().max() < 1e-5


def test_checkpoints_that_do_not_fit_are_refused_naming_what_is_wrong(tmp_path):
    folder = save(transformers.BertForMaskedLM(hf_config(300)), tmp_path / "mlm")
    state = read_weights(folder)
    model = BertForPreTraining(model_config(folder))
    without = {k: v for k, v in state.items() if k != "bert.encoder.layer.2.output.dense.weight"}
    with pytest.raises(InputDataError, match=r"lacks \['bert\.encoder\.layer\.2\.output\.dense\.weight'\]"):
        load_into(model, without)
    small = BertForPreTraining(ModelConfig.model_validate({**model_config(folder).model_dump(), "vocab_size": 299}))
    with pytest.raises(
        InputDataError,
        match=r"bert\.embeddings\.word_embeddings\.weight has shape \(300, 96\), the model expects \(299, 96\)",
    ):
        load_into(small, state)

    config = json.loads((tmp_path / "mlm" / "config.json").read_text())
    (tmp_path / "mlm" / "config.json").write_text(json.dumps({**config, "model_type": "distilbert"}))
    with pytest.raises(InputDataError, match=r"config\.json: model_type 'distilbert' is not a BERT model"):
        model_config(folder)
    (tmp_path / "mlm" / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    with pytest.raises(InputDataError, match=r"position_embedding_type 'relative_key' is not absolute"):
        model_config(folder)
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(InputDataError, match=r"no weights \(model\.safetensors"):
        read_weights(folder)


def test_export_without_nsp_is_what_transformers_masked_lm_holds(tmp_path, gensim_data):
    root = tmp_path / "run"
    info = make_run_root(root, gensim_data, max_documents=40, dupe_factor=1)
    cfg = ModelConfig.named("tiny", len(info["tokens"]), max_position_embeddings=64)
    ours = BertForPreTraining(cfg, torch.Generator().manual_seed(2)).eval()
    export_checkpoint(ours.state_dict(), cfg, str(root / "vocab"), str(tmp_path / "mlm"), nsp=False)
    config = json.loads((tmp_path / "mlm" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    stored = set(safetensors.torch.load_file(str(tmp_path / "mlm" / "model.safetensors")))
    expected = set(transformers.BertForMaskedLM(transformers.BertConfig(**config)).state_dict()) - {
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
    }  # tied: stored once, as save_pretrained does
    assert stored == expected
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "mlm")).eval()
    ids = IDS % len(info["tokens"])
    with torch.no_grad():
        assert (theirs(input_ids=ids).logits - ours.full_logits(ids).prediction_logits).abs().max() < 1e-4


def test_training_starts_from_the_loaded_weights(world_of_one, tmp_path, gensim_data):
    root = tmp_path / "run"
    info = make_run_root(root, gensim_data, max_documents=60, dupe_factor=1)
    folder = save(transformers.BertForMaskedLM(hf_config(len(info["tokens"]))), tmp_path / "mlm")
    cfg = tiny_pretrain(
        phases=[{"name": "seq64", "steps": 3, "batch_size": 8, "max_seq_length": 64}],
        warmup_steps=1,
        validation_batches=0,
    )
    model_cfg = cfg.build_model_config(len(info["tokens"]), base=model_config(folder))
    marker = Trainer(
        cfg,
        Pretraining(model_cfg, init_state_dict=read_weights(folder)),
        phase_data(root, info),
        LocalStageFiles(str(tmp_path / "stage")),
        seed=SEED,
        resume_key="k",
    ).run()
    assert sorted(marker["init"]["fresh"]) == sorted(NSP_AND_POOLER) and marker["model_config"]["hidden_size"] == 96
    # the first step's MLM loss is the Hugging Face model's own loss on the first batch
    first = next(
        endless_batches(phase_loader(cfg, phase_data(root, info)[0], cfg.phases[0], SEED, WorkerContext()), "seq64")
    )
    theirs = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs(
            input_ids=first["input_ids"],
            token_type_ids=first["token_type_ids"],
            attention_mask=first["attention_mask"],
            labels=first["labels"],
        ).loss.item()
    assert MetricsLog(str(tmp_path / "stage" / METRICS)).records()[0]["mlm_loss"] == pytest.approx(expected, rel=1e-4)


def test_the_pretrain_stage_refuses_a_starting_model_that_does_not_fit_before_training(tmp_path, gensim_data):
    from bertcore.config import StorageConfig
    from bertcore.errors import ConfigError
    from pipelines.runner import run_stage
    from pipelines.storage import Storage

    root = tmp_path / "run"
    info = make_run_root(root, gensim_data, max_documents=40, dupe_factor=1)
    manifest = json.loads((root / "vocab" / "_manifest.json").read_text())
    manifest["config"].update(source="pretrained", pretrained=str(tmp_path / "model"))  # as if adopted from the model
    (root / "vocab" / "_manifest.json").write_text(json.dumps(manifest))
    storage = Storage(StorageConfig())
    cfg = tiny_pretrain(init_from=str(tmp_path / "model"), model_overrides={})

    with pytest.raises(
        ConfigError, match=r"pretrain\.init_from: .*model holds no Hugging Face model \(it needs config\.json"
    ):
        run_stage("pretrain", cfg, root=str(root), storage=storage, seed=SEED)
    save(transformers.BertForMaskedLM(hf_config(len(info["tokens"]) + 1)), tmp_path / "model")
    with pytest.raises(
        ConfigError,
        match=(
            rf"has {len(info['tokens']) + 1} word embeddings but the vocab stage's vocabulary has "
            rf"{len(info['tokens'])} entries"
        ),
    ):
        run_stage("pretrain", cfg, root=str(root), storage=storage, seed=SEED)
    save(transformers.BertForMaskedLM(hf_config(len(info["tokens"]), max_position_embeddings=48)), tmp_path / "model")
    with pytest.raises(ConfigError, match=r"phase seq64 has sequences of 64 tokens but the model has 48 positions"):
        run_stage("pretrain", cfg, root=str(root), storage=storage, seed=SEED)
    assert not (root / "pretrain" / "checkpoints").exists()  # refused before any training
    with pytest.raises(
        ValueError,
        match=r"pretrain\.model_overrides\.hidden_size: the shape of a model continued from pretrain\.init_from",
    ):
        tiny_pretrain(init_from="x", model_overrides={"hidden_size": 64})


def test_a_starting_model_on_s3_is_identified_by_its_objects_and_read_from_a_local_copy(s3_bucket, tmp_path):
    from bertcore.config import StorageConfig
    from pipelines.stages import pretrain
    from pipelines.storage import Storage, join

    endpoint, bucket = s3_bucket
    storage = Storage(StorageConfig(endpoint_url=endpoint))
    folder = save(
        transformers.BertForMaskedLM(hf_config(300)), tmp_path / "mlm", max_shard_size="300KB"
    )  # sharded: index + parts
    uri = f"s3://{bucket}/models/mlm"
    for name in sorted(os.listdir(folder)):
        storage.write_bytes(join(uri, name), (tmp_path / "mlm" / name).read_bytes())
    external = pretrain.identify(tiny_pretrain(init_from=uri + "/", model_overrides={}), storage)
    names = sorted(os.listdir(folder))
    assert sorted(external.identity["init_from"]) == [join(uri, n) for n in names]  # config, index and every shard
    assert all(sig == storage.signature(u) for u, sig in external.identity["init_from"].items())
    local = external.value.local(storage)
    assert not local.startswith(str(tmp_path)) and model_config(local) == model_config(folder)
    ours, fresh = ours_from(local)
    assert sorted(fresh) == sorted(NSP_AND_POOLER)
    with torch.no_grad():
        expected = transformers.BertForMaskedLM.from_pretrained(folder).eval()(input_ids=IDS).logits
        assert (ours.full_logits(IDS).prediction_logits - expected).abs().max() < 1e-4
