"""bertcore.model.bert: checkpoint compatibility and numerical parity with transformers'
BertForPreTraining, the gathered MLM loss, NSP handling, initialisation, learning."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pydantic
import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers

from bertcore.model.bert import (
    NAMED_SIZES,
    NO_NSP_LABEL,
    TIED,
    TIED_KEYS,
    BertForPreTraining,
    ModelConfig,
    encoder_flops_per_token,
)

torch.set_num_threads(2)
VOCAB = 500


def tiny_config(**overrides) -> ModelConfig:
    return ModelConfig.named("tiny", VOCAB, **overrides)


def hf_model(cfg: ModelConfig, attn: str = "sdpa") -> transformers.BertForPreTraining:
    config = transformers.BertConfig(**cfg.to_hf_config_dict())
    return transformers.BertForPreTraining._from_config(config, attn_implementation=attn)


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter (biases and LayerNorms too) non-trivial random values, so a
    parity check cannot pass because something is still at its zero/one initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)


def padded_batch(seed: int, lengths=(24, 17, 9, 3), vocab=VOCAB) -> dict[str, torch.Tensor]:
    """[CLS] A [SEP] B [SEP] rows of different lengths, zero-padded, 15% of real
    positions labelled for MLM, NSP labels 0/1."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    ids = torch.randint(5, vocab, (b, t), generator=g)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    types = torch.zeros(b, t, dtype=torch.long)
    labels = torch.full((b, t), -100)
    for row, n in enumerate(lengths):
        types[row, n // 2 : n] = 1
        picked = torch.randperm(n, generator=g)[: max(1, round(0.15 * n))]
        labels[row, picked] = ids[row, picked]
    ids[~mask] = 0
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask.long(),
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (b,), generator=g),
    }


# --- checkpoint layout -------------------------------------------------------------------


def test_state_dict_keys_and_shapes_equal_transformers():
    cfg = tiny_config()
    ours, theirs = BertForPreTraining(cfg).state_dict(), hf_model(cfg).state_dict()
    assert ours.keys() == theirs.keys()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


def test_state_dicts_load_both_ways_strictly_and_keep_tying():
    cfg = tiny_config()
    ours, theirs = BertForPreTraining(cfg), hf_model(cfg)
    perturb(theirs, seed=1)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs_again = hf_model(cfg)
    theirs_again.load_state_dict(ours.state_dict(), strict=True)
    for a, b in zip(theirs.state_dict().values(), theirs_again.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The decoder shares the embedding matrix and the output bias, in both models.
    head = ours.cls.predictions
    assert head.decoder.weight.data_ptr() == ours.bert.embeddings.word_embeddings.weight.data_ptr()
    assert head.decoder.bias.data_ptr() == head.bias.data_ptr()
    # Tied matrices count once, as in transformers.
    assert ours.num_parameters() == theirs.num_parameters()


def test_safetensors_files_round_trip_with_transformers(tmp_path):
    cfg = tiny_config()
    ours = BertForPreTraining(cfg)
    perturb(ours, seed=13)
    # ours -> safetensors (shared tensors stored once) -> transformers.from_pretrained
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_config_dict()))
    safetensors.torch.save_model(ours, str(tmp_path / "model.safetensors"))
    stored = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert set(ours.state_dict()) - set(stored) == set(TIED_KEYS)
    state = ours.state_dict()
    assert all(state[alias].data_ptr() == state[source].data_ptr() for alias, source in TIED.items())
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    ids = torch.randint(5, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ours.eval().full_logits(ids).prediction_logits
        assert (theirs(input_ids=ids).prediction_logits - want).abs().max() < 1e-5
    # transformers.save_pretrained -> ours: the same two keys are missing, the ties restore them.
    theirs.save_pretrained(str(tmp_path / "hf"))
    again = BertForPreTraining(cfg).eval()
    stored = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    result = again.load_state_dict(stored, strict=False)
    assert set(result.missing_keys) == set(TIED_KEYS) and not result.unexpected_keys
    with torch.no_grad():
        assert (again.full_logits(ids).prediction_logits - want).abs().max() < 1e-5


# --- numerical parity ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("direction", "attn"), [("ours_into_hf", "sdpa"), ("hf_into_ours", "sdpa"), ("ours_into_hf", "eager")]
)
def test_logits_and_loss_match_transformers_on_padded_batch(direction, attn):
    # eager: HF's own matmul-softmax attention with an additive mask, a different kernel from ours.
    cfg = tiny_config()
    ours, theirs = BertForPreTraining(cfg), hf_model(cfg, attn)
    if direction == "ours_into_hf":
        perturb(ours, seed=2)
        theirs.load_state_dict(ours.state_dict(), strict=True)
    else:
        perturb(theirs, seed=2)
        ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    batch = padded_batch(seed=3)
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        got = ours.full_logits(**inputs)
        want = theirs(**inputs)
        our_loss = ours(**batch).loss
        their_loss = theirs(**batch).loss
    assert got.prediction_logits.shape == (4, 24, VOCAB)
    assert got.seq_relationship_logits.shape == (4, 2)
    # Padding must matter (a model ignoring the mask would differ from HF here) ...
    assert (got.prediction_logits - want.prediction_logits).abs().max() < 1e-4
    assert (got.seq_relationship_logits - want.seq_relationship_logits).abs().max() < 1e-4
    assert abs(our_loss.item() - their_loss.item()) < 1e-4
    # ... and a padded row must equal the same row run alone, unpadded.
    n = 9
    alone = ours.full_logits(inputs["input_ids"][2:3, :n], inputs["token_type_ids"][2:3, :n])
    assert (alone.prediction_logits[0] - got.prediction_logits[2, :n]).abs().max() < 1e-4


def test_training_gradients_match_transformers_without_dropout():
    cfg = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours, theirs = BertForPreTraining(cfg), hf_model(cfg)
    perturb(ours, seed=4)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ours.train(), theirs.train()
    batch = padded_batch(seed=5)
    ours(**batch).loss.backward()
    theirs(**batch).loss.backward()
    our_grads = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert name in our_grads, name
        torch.testing.assert_close(our_grads[name].grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


# --- the gathered MLM head ---------------------------------------------------------------


def test_gathered_mlm_loss_and_accuracy_equal_full_logits():
    cfg = tiny_config()
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(0))
    perturb(model, seed=6)
    model.eval()
    batch = padded_batch(seed=7)
    labels = batch["labels"]
    with torch.no_grad():
        out = model(**batch)
        full = model.full_logits(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    logits = full.prediction_logits.reshape(-1, VOCAB)
    expected = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100)
    assert abs(out.mlm_loss.item() - expected.item()) < 1e-5
    labelled = labels != -100
    assert out.mlm_count.item() == labelled.sum().item()
    right = (full.prediction_logits.argmax(-1) == labels) & labelled
    assert out.mlm_correct.item() == right.sum().item()
    nsp_expected = F.cross_entropy(full.seq_relationship_logits, batch["next_sentence_label"])
    assert abs(out.nsp_loss.item() - nsp_expected.item()) < 1e-5
    assert abs(out.loss.item() - (expected + nsp_expected).item()) < 1e-5


def test_accuracy_counts_a_known_number_of_right_answers():
    # Force the head to predict token 7 everywhere; label 2 positions with 7 and 3 with 8.
    cfg = tiny_config()
    model = BertForPreTraining(cfg).eval()
    with torch.no_grad():
        model.cls.predictions.bias[7] = 100.0
    ids = torch.randint(5, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    labels = torch.full((1, 10), -100)
    labels[0, [1, 2]] = 7
    labels[0, [4, 5, 6]] = 8
    out = model(ids, labels=labels)
    assert (out.mlm_correct.item(), out.mlm_count.item()) == (2, 5)


def test_masked_positions_input_gives_the_same_loss_as_labels():
    cfg = tiny_config()
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(1)).eval()
    batch = padded_batch(seed=8)
    labels = batch.pop("labels")
    # (B, P) positions padded with 0 and label -100, as a collator of the examples shards builds them.
    p = int((labels != -100).sum(1).max())
    positions = torch.zeros(labels.shape[0], p, dtype=torch.long)
    targets = torch.full_like(positions, -100)
    for row in range(labels.shape[0]):
        where = (labels[row] != -100).nonzero().squeeze(1)
        positions[row, : len(where)] = where
        targets[row, : len(where)] = labels[row, where]
    with torch.no_grad():
        a = model(**batch, labels=labels)
        b = model(**batch, masked_positions=positions, masked_labels=targets)
    assert abs(a.mlm_loss.item() - b.mlm_loss.item()) < 1e-6
    assert (a.mlm_count.item(), a.mlm_correct.item()) == (b.mlm_count.item(), b.mlm_correct.item())


def test_no_nsp_label_excludes_examples_and_none_skips_the_head():
    cfg = tiny_config()
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(2)).eval()
    perturb(model, seed=9)
    batch = padded_batch(seed=10)
    with torch.no_grad():
        full = model.full_logits(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        nsp = batch["next_sentence_label"].clone()
        nsp[[0, 2]] = NO_NSP_LABEL
        mixed = model(**{**batch, "next_sentence_label": nsp})
        none_labelled = model(**{**batch, "next_sentence_label": torch.full_like(nsp, NO_NSP_LABEL)})
        no_head = model(**{**batch, "next_sentence_label": None})
    keep = nsp != NO_NSP_LABEL
    expected = F.cross_entropy(full.seq_relationship_logits[keep], nsp[keep])
    assert abs(mixed.nsp_loss.item() - expected.item()) < 1e-5
    assert mixed.nsp_count.item() == 2
    assert none_labelled.nsp_loss.item() == 0.0
    assert none_labelled.loss.item() == pytest.approx(none_labelled.mlm_loss.item())
    assert no_head.nsp_loss is None and no_head.loss.item() == pytest.approx(no_head.mlm_loss.item())


def test_no_nsp_labels_at_all_still_give_every_parameter_a_gradient():
    # Data-parallel wrappers expect the same parameters to receive gradients on every rank.
    model = BertForPreTraining(tiny_config())
    batch = padded_batch(seed=11)
    batch["next_sentence_label"] = torch.full((4,), NO_NSP_LABEL)
    model(**batch).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_forward_needs_exactly_one_form_of_mlm_targets():
    model = BertForPreTraining(tiny_config())
    ids = torch.randint(5, VOCAB, (2, 6))
    with pytest.raises(ValueError, match="exactly one"):
        model(ids)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.full_logits(torch.randint(5, VOCAB, (1, 513)))


# --- initialisation ----------------------------------------------------------------------


def test_init_follows_bert_and_is_seeded():
    cfg = ModelConfig.named("mini", 2000)
    a = BertForPreTraining(cfg, torch.Generator().manual_seed(0))
    b = BertForPreTraining(cfg, torch.Generator().manual_seed(0))
    c = BertForPreTraining(cfg, torch.Generator().manual_seed(1))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    query = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(a.state_dict()[query], c.state_dict()[query])
    q = a.bert.encoder.layer[3].attention.self.query.weight
    assert q.std().item() == pytest.approx(0.02, rel=0.05) and abs(q.mean().item()) < 1e-3
    emb = a.bert.embeddings.word_embeddings.weight
    assert emb[cfg.pad_token_id].abs().sum().item() == 0.0
    assert emb[1:].std().item() == pytest.approx(0.02, rel=0.05)
    for name, p in a.named_parameters():
        if name.endswith("LayerNorm.weight"):
            assert torch.all(p == 1), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name


# --- learning ----------------------------------------------------------------------------


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_tiny_model_overfits_a_fixed_batch(pre_layer_norm):
    cfg = tiny_config(pre_layer_norm=pre_layer_norm)
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(0)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = padded_batch(seed=12, lengths=(32, 32, 28, 20, 32, 16, 32, 24))
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert model(**batch).mlm_correct.item() > 0


def test_pre_layer_norm_adds_a_final_norm_and_does_not_export():
    cfg = tiny_config(pre_layer_norm=True)
    model = BertForPreTraining(cfg)
    extra = set(model.state_dict()) - set(BertForPreTraining(tiny_config()).state_dict())
    assert extra == {"bert.encoder.LayerNorm.weight", "bert.encoder.LayerNorm.bias"}
    with pytest.raises(ValueError, match="pre_layer_norm"):
        cfg.to_hf_config_dict()


# --- configuration and sizes -------------------------------------------------------------


def test_named_sizes_and_overrides():
    base = ModelConfig.named("base", 30522)
    shape = (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size)
    assert shape == (12, 768, 12, 3072)
    narrow = ModelConfig.named("mini", 8000, intermediate_size=512, hidden_dropout_prob=0.0)
    assert (narrow.hidden_size, narrow.intermediate_size, narrow.hidden_dropout_prob) == (256, 512, 0.0)
    with pytest.raises(ValueError, match="huge"):
        ModelConfig.named("huge", 30522)
    with pytest.raises(pydantic.ValidationError, match="num_attention_heads"):
        ModelConfig.named("tiny", 100, num_attention_heads=3)
    with pytest.raises(pydantic.ValidationError, match="hiden_size"):
        ModelConfig(vocab_size=100, hiden_size=64)


def test_hf_config_dict_round_trips_through_bert_config():
    cfg = ModelConfig.named("mini", 1234, hidden_act="gelu_new", layer_norm_eps=1e-7)
    d = cfg.to_hf_config_dict()
    assert d["model_type"] == "bert" and d["architectures"] == ["BertForPreTraining"]
    hf = transformers.BertConfig(**d)
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
    ):
        assert getattr(hf, key) == getattr(cfg, key), key


# Turc et al. 2019 ("Well-Read Students Learn Better", Table 1 of the released models) and
# Devlin et al. 2019 (BERT-base 110M), all with the 30,522-entry uncased vocabulary.
# BERT-large is published as "340M" but is 336.2M counted exactly, so it is checked
# against transformers only.
PUBLISHED_MILLIONS = {"tiny": 4.4, "mini": 11.3, "small": 29.1, "medium": 41.7, "base": 110.1}


@pytest.mark.parametrize("size", list(NAMED_SIZES))
def test_named_sizes_have_the_parameter_counts_of_transformers_and_the_papers(size):
    cfg = ModelConfig.named(size, 30522)
    with torch.device("meta"):  # shapes only: BERT-large costs no memory or init time here
        ours = BertForPreTraining(cfg)
        theirs = transformers.BertForPreTraining(transformers.BertConfig(**cfg.to_hf_config_dict()))
    assert ours.num_parameters() == theirs.num_parameters()
    if size in PUBLISHED_MILLIONS:
        assert ours.num_parameters() / 1e6 == pytest.approx(PUBLISHED_MILLIONS[size], rel=0.01)


def test_flops_formula_counts_the_model_matrices():
    cfg = ModelConfig.named("small", 30522)
    model = BertForPreTraining(cfg)
    matmul_weights = sum(m.weight.numel() for m in model.bert.encoder.modules() if isinstance(m, torch.nn.Linear))
    t = 128
    attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * t
    assert encoder_flops_per_token(cfg, t) == 6 * matmul_weights + attention
    head = model.cls.predictions
    head_weights = head.transform.dense.weight.numel() + head.decoder.weight.numel()
    assert encoder_flops_per_token(cfg, t, masked_fraction=0.15) == pytest.approx(
        6 * matmul_weights + attention + 6 * head_weights * 0.15
    )
