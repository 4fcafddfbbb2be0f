"""bertcore.model.bert as RoBERTa (model_type roberta): the same logits as transformers'
RobertaForMaskedLM on a padded batch, whichever way the weights travel (a transformers
folder read by bertcore, a bertcore export read by transformers); the exported folder is
what AutoModelForMaskedLM, AutoTokenizer and pipeline("fill-mask") load as RoBERTa, with
no warning and no load report."""

from __future__ import annotations

import json
import logging
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import safetensors.torch
import torch
import transformers

from bertcore.eval.intrinsic import load_pretraining_model
from bertcore.model.bert import BertForPreTraining, ModelConfig
from bertcore.model.families.roberta import roberta_shape
from bertcore.model.folder import check_model_folder, read_config
from bertcore.model.pretrained import load_into, read_weights
from bertcore.train.export import ROBERTA_HF_FILES, export_checkpoint
from bertcore.vocab.bpe import save_bpe, train_byte_level_bpe
from bertcore.vocab.config import VocabConfig
from bertcore.vocab.tokenizer import load_tokenizer
from test_vocab_adopt import lee_sentences

torch.set_num_threads(2)
VOCAB = 400
PAD = 1


def roberta_config() -> ModelConfig:
    return ModelConfig.named("tiny", VOCAB, **roberta_shape(PAD, max_length=32))


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial values everywhere (biases and LayerNorms too), so parity cannot come
    from parameters still at their initial zeros and ones."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)


def padded_batch(seed: int, lengths=(30, 17, 9, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask): <s> ... </s> rows of different lengths, padded with <pad>."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (len(lengths), max(lengths)), generator=g)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, n - 1] = 0, 2
    ids[~mask] = PAD
    return ids, mask.long()


def loaded_quietly(load):
    """`load()`, with every Python warning and every transformers log record it emits."""
    from transformers.utils import logging as hf_logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    hf_logging.set_verbosity_info()
    hf_logging.get_logger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = load()
    finally:
        hf_logging.get_logger().removeHandler(handler)
        hf_logging.set_verbosity_warning()
    said = [str(w.message) for w in caught] + [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    return value, said


@pytest.fixture(scope="module")
def tokenizer_dir(gensim_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe")
    save_bpe(
        train_byte_level_bpe(lee_sentences(gensim_data, 200), VocabConfig(model="byte_level_bpe", vocab_size=VOCAB)),
        str(out),
    )
    return out


def test_a_transformers_roberta_folder_gives_the_same_logits_in_bertcore(tmp_path):
    cfg = roberta_config()
    theirs = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**cfg.to_hf_config_dict()))
    perturb(theirs, seed=1)
    theirs.save_pretrained(str(tmp_path))
    assert read_config(str(tmp_path)) == cfg
    assert check_model_folder(str(tmp_path)).has_mlm_head
    ours = BertForPreTraining(read_config(str(tmp_path)), torch.Generator().manual_seed(0))
    plan = load_into(ours, read_weights(str(tmp_path)))
    assert sorted(plan.fresh) == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
        "cls.seq_relationship.bias",
        "cls.seq_relationship.weight",
    ]
    assert plan.ignored == []
    ids, mask = padded_batch(seed=2)
    with torch.no_grad():
        got = ours.eval().full_logits(ids, attention_mask=mask).prediction_logits
        want = theirs.eval()(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (got - want)[real].abs().max() < 1e-4
    # positions count from <pad> + 1 whatever the padding: a padded row equals the row alone
    alone = ours.full_logits(ids[2:3, :9]).prediction_logits[0]
    assert (alone - got[2, :9]).abs().max() < 1e-4
    # ... and a model with BERT's positions does not give these logits
    bert_positions = BertForPreTraining(cfg.model_copy(update={"model_type": "bert"}), torch.Generator().manual_seed(0))
    bert_positions.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (bert_positions.eval().full_logits(ids, attention_mask=mask).prediction_logits - want)[
            real
        ].abs().max() > 1e-2
    # the evaluate stage reads the folder the same way
    evaluated = load_pretraining_model(str(tmp_path))
    with torch.no_grad():
        assert (evaluated.full_logits(ids, attention_mask=mask).prediction_logits - want)[real].abs().max() < 1e-4


def test_a_bertcore_export_is_a_roberta_for_masked_lm_with_the_same_logits(tokenizer_dir, tmp_path):
    cfg = roberta_config()
    ours = BertForPreTraining(cfg, torch.Generator().manual_seed(0))
    perturb(ours, seed=3)
    out = tmp_path / "model"
    names = export_checkpoint(
        ours.state_dict(), cfg, str(tokenizer_dir), str(out), nsp=True
    )  # a RoBERTa never keeps the NSP head
    assert sorted(names) == sorted(ROBERTA_HF_FILES) == sorted(os.listdir(out))
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("roberta", ["RobertaForMaskedLM"])
    assert (config["max_position_embeddings"], config["type_vocab_size"], config["pad_token_id"]) == (34, 1, 1)
    stored = safetensors.torch.load_file(str(out / "model.safetensors"))
    expected = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**cfg.to_hf_config_dict())).state_dict()
    assert set(stored) == set(expected) - {"lm_head.decoder.weight", "lm_head.decoder.bias"}  # tied, stored once
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 32

    theirs, said = loaded_quietly(lambda: transformers.AutoModelForMaskedLM.from_pretrained(str(out)))
    assert type(theirs).__name__ == "RobertaForMaskedLM" and said == []
    tokenizer, said = loaded_quietly(lambda: transformers.AutoTokenizer.from_pretrained(str(out)))
    assert said == [] and tokenizer.mask_token == "<mask>"
    ids, mask = padded_batch(seed=4)
    with torch.no_grad():
        got = ours.eval().full_logits(ids, attention_mask=mask).prediction_logits
        want = theirs.eval()(input_ids=ids, attention_mask=mask).logits
    assert (got - want)[mask.bool()].abs().max() < 1e-4
    text = "The Prime Minister said on Tuesday that the fires were contained."
    encoded = tokenizer(text, return_tensors="pt")
    assert encoded["input_ids"][0].tolist() == load_tokenizer(str(out)).encode(text).ids

    # the evaluate stage's fill-mask table masks a whole Ġ word and shows the mask after its space
    from bertcore.eval.intrinsic import fill_mask

    sentences = [
        "The Prime Minister said on Tuesday that the fires were contained.",
        "Police said the fires near the city were out.",
    ]
    items = fill_mask(load_pretraining_model(str(out)), tokenizer, sentences, seed=0, count=2)
    assert len(items) == 2
    for item in items:
        assert item["answer"].startswith("Ġ") and " <mask>" in item["text"] and len(item["predictions"]) == 5

    fill, said = loaded_quietly(lambda: transformers.pipeline("fill-mask", model=str(out), device="cpu"))
    assert said == [] and type(fill.model).__name__ == "RobertaForMaskedLM"
    predictions, said = loaded_quietly(lambda: fill("The fires were <mask> on Tuesday.", top_k=3))
    assert said == [] and len(predictions) == 3 and all(p["token"] < VOCAB for p in predictions)


def test_export_refuses_a_vocabulary_of_the_other_kind(tokenizer_dir, tmp_path):
    from bertcore.errors import InputDataError

    bert = ModelConfig.named("tiny", VOCAB)
    with pytest.raises(InputDataError, match="byte-level BPE vocabulary for a bert model"):
        export_checkpoint(BertForPreTraining(bert).state_dict(), bert, str(tokenizer_dir), str(tmp_path / "m"))


def test_roberta_shape_and_its_bounds():
    cfg = ModelConfig.named("base", 50265, **roberta_shape(1))
    assert (cfg.max_position_embeddings, cfg.max_sequence_length, cfg.position_offset) == (514, 512, 2)
    assert (cfg.type_vocab_size, cfg.layer_norm_eps) == (1, 1e-5)
    with pytest.raises(ValueError, match="leaves no position"):
        ModelConfig.named("tiny", 100, model_type="roberta", pad_token_id=1, max_position_embeddings=2)
    with pytest.raises(ValueError, match="exceeds the 32 tokens"):
        BertForPreTraining(roberta_config()).bert(torch.ones(1, 33, dtype=torch.long))


def test_fill_mask_picks_whole_words_of_a_byte_level_vocabulary():
    from bertcore.eval.intrinsic import _maskable

    tokens = ["<s>", "The", "Ġfires", "Ġwere", "Ġun", "believ", "able", "Ġin", "ĠCanberra", ".", "</s>"]
    # whole one-piece words of 3+ letters; "The" starts the text without a Ġ and is left out
    assert [tokens[i] for i in _maskable(tokens, {"<s>", "</s>"})] == ["Ġfires", "Ġwere"]
    bert = ["[CLS]", "the", "fires", "were", "un", "##believ", "##able", ".", "[SEP]"]
    assert [bert[i] for i in _maskable(bert, {"[CLS]", "[SEP]"})] == ["the", "fires", "were"]
