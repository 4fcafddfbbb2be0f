"""The modern encoder (bertcore/model/modernbert.py, the modernbert family): its state dict is
transformers' ModernBertForMaskedLM's, name for name, with the same logits; a packed batch
gives each sequence the logits it gets alone (attention never crosses a boundary, positions
restart), as does a padded one; the export loads with AutoModelForMaskedLM as
ModernBertForMaskedLM with an empty loading report; and the packed batches
(bertcore/train/packing.py) hold every record once, within the budget, masked per batch."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers

from bertcore.examples.masking import MaskConfig
from bertcore.examples.vocab_tables import VocabTables
from bertcore.model.config import ModelConfig
from bertcore.model.families import FAMILIES, family, for_vocabulary
from bertcore.model.modernbert import ModernBertForMaskedLM
from bertcore.model.unpadded import _banded, local_attention_chunked
from bertcore.train.export import export_checkpoint
from bertcore.train.loader import Rows
from bertcore.train.objectives import Pretraining, batch_counts
from bertcore.train.packing import PackedCollator, pack_batches, padding_share

torch.set_num_threads(1)
VOCAB = 300


def config(**overrides) -> ModelConfig:
    # a window of 8 tokens (4 each side), so sequences of 5 to 40 exercise the local layers
    fields = {"model_type": "modernbert", "local_attention": 8, "max_position_embeddings": 128, **overrides}
    return ModelConfig.named("tiny", VOCAB, **fields)


def perturbed(cfg: ModelConfig, seed: int = 3) -> ModernBertForMaskedLM:
    """Random weights everywhere (norms and the decoder bias too), so equal logits cannot
    come from parameters still at their initial ones and zeros."""
    model = ModernBertForMaskedLM(cfg, torch.Generator().manual_seed(seed)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def sequences(lengths, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, VOCAB, (n,), generator=g) for n in lengths]


def padded(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return ids, mask


def cu_of(seqs) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum([len(s) for s in seqs])], dtype=torch.int32)


LENGTHS = (5, 40, 17, 3, 33)


@pytest.fixture(scope="module")
def theirs_and_ours():
    cfg = config()
    ours = perturbed(cfg)
    hf_config = transformers.ModernBertConfig(**cfg.to_hf_config_dict("mlm"))
    theirs = transformers.ModernBertForMaskedLM._from_config(hf_config, attn_implementation="sdpa").eval()
    return cfg, ours, theirs


def test_the_state_dict_is_modernbert_for_masked_lm_s_and_the_logits_agree(theirs_and_ours):
    cfg, ours, theirs = theirs_and_ours
    state = ours.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert not any(k.endswith("bias") for k in state if k != "decoder.bias")  # no biases but the decoder's
    assert "model.layers.0.attn_norm.weight" not in state and "model.layers.1.attn_norm.weight" in state
    missing, unexpected = theirs.load_state_dict(state, strict=True)
    assert missing == unexpected == []
    ids, mask = padded(sequences(LENGTHS))
    with torch.no_grad():
        mine = ours.full_logits(ids, attention_mask=mask).prediction_logits
        reference = theirs(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(mine[real], reference[real], atol=1e-4), float((mine - reference)[real].abs().max())
    # the window matters: with global attention everywhere the long sequences' logits differ
    everywhere = ModernBertForMaskedLM(cfg.model_copy(update={"global_attn_every_n_layers": 1}))
    everywhere.load_state_dict(state)
    with torch.no_grad():
        wider = everywhere.eval().full_logits(ids, attention_mask=mask).prediction_logits
    assert not torch.allclose(wider[real], mine[real], atol=1e-3)


def test_a_packed_batch_gives_each_sequence_the_logits_it_gets_alone(theirs_and_ours):
    cfg, ours, _ = theirs_and_ours
    seqs = sequences(LENGTHS, seed=1)
    cu = cu_of(seqs)
    with torch.no_grad():
        packed = ours.full_logits(torch.cat(seqs)[None], cu_seqlens=cu).prediction_logits[0]  # (N, V)
        alone = [ours.full_logits(s[None]).prediction_logits[0] for s in seqs]
        # a change in one sequence leaves every other sequence's logits alone
        changed = [s.clone() for s in seqs]
        changed[1][:] = 7
        other = ours.full_logits(torch.cat(changed)[None], cu_seqlens=cu).prediction_logits[0]
    for i, logits in enumerate(alone):
        part = packed[cu[i] : cu[i + 1]]
        assert torch.allclose(part, logits, atol=1e-5), (i, float((part - logits).abs().max()))
        if i != 1:
            assert torch.allclose(other[cu[i] : cu[i + 1]], part, atol=1e-6)
    assert not torch.allclose(other[cu[1] : cu[2]], packed[cu[1] : cu[2]])
    # positions restart per sequence: the same tokens packed after another sequence score the same
    with torch.no_grad():
        twice = ours.full_logits(torch.cat([seqs[2], seqs[2]])[None], cu_seqlens=cu_of([seqs[2]] * 2))
    first, second = twice.prediction_logits[0].split(len(seqs[2]))
    assert torch.allclose(first, second, atol=1e-5)


def test_chunked_local_attention_is_the_banded_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 45, 8, generator=g) for _ in range(3))
    valid = torch.arange(45)[None, :] < torch.tensor([45, 30, 7])[:, None]  # (S, L)
    chunked = local_attention_chunked(q, k, v, valid, half=4, dropout_p=0.0)
    mask = _banded(45, 4, q.device) & (valid[:, None, None, :] | ~valid[:, None, :, None])
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(
        chunked[valid[:, None, :].expand(-1, 2, -1)], dense[valid[:, None, :].expand(-1, 2, -1)], atol=1e-5
    )


def test_named_shapes_and_parameter_counts_are_transformers():
    base = ModelConfig.named("base", 50368, model_type="modernbert")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.num_attention_heads) == (
        22,
        768,
        1152,
        12,
    )
    assert (base.global_rope_theta, base.local_rope_theta, base.local_attention, base.global_attn_every_n_layers) == (
        160_000.0,
        10_000.0,
        128,
        3,
    )
    for size in ("tiny", "small"):
        cfg = ModelConfig.named(size, 1000, model_type="modernbert")
        with torch.device("meta"):
            theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**cfg.to_hf_config_dict("mlm")))
            ours = ModernBertForMaskedLM(cfg)
        assert cfg.family.parameter_count(cfg) == ours.num_parameters() == theirs.num_parameters()
    assert family("modernbert") is FAMILIES["modernbert"] is base.family
    assert (
        for_vocabulary("auto", "roberta").name == "roberta" and for_vocabulary("modernbert", "roberta") is base.family
    )
    with pytest.raises(ValueError, match=r"pretrain\.family: the bert family needs a WordPiece vocabulary"):
        for_vocabulary("bert", "roberta")
    with pytest.raises(ValueError, match="the modernbert family has no size 'medium'"):
        ModelConfig.named("medium", 1000, model_type="modernbert")


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory, gensim_data):
    from test_train import make_run_root

    root = tmp_path_factory.mktemp("modern-vocab")
    info = make_run_root(root, gensim_data, max_documents=60, dupe_factor=1)
    return root / "vocab", info["tokens"]


def test_the_export_loads_as_modernbert_for_masked_lm_with_an_empty_report_and_our_logits(vocab_dir, tmp_path):
    folder, tokens = vocab_dir
    cfg = config(local_attention=16)
    cfg = cfg.model_copy(update={"vocab_size": len(tokens)})
    ours = perturbed(ModelConfig.model_validate(cfg.model_dump()))
    export_checkpoint(ours.state_dict(), ours.cfg, str(folder), str(tmp_path / "model"), nsp=False)
    written = json.loads((tmp_path / "model" / "config.json").read_text())
    assert written["architectures"] == ["ModernBertForMaskedLM"] and written["cls_token_id"] == tokens.index("[CLS]")
    theirs, report = transformers.AutoModelForMaskedLM.from_pretrained(
        str(tmp_path / "model"), output_loading_info=True
    )
    assert type(theirs).__name__ == "ModernBertForMaskedLM"
    assert {k: v for k, v in report.items() if v} == {}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    texts = ["The fire crews worked through the night to protect homes near the border.", "Police said."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        reference = theirs.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        mine = ours.full_logits(batch["input_ids"], attention_mask=batch["attention_mask"]).prediction_logits
    real = batch["attention_mask"].bool()
    assert torch.allclose(mine[real], reference[real], atol=1e-4)


# -- packed batches ----------------------------------------------------------------------------


def test_pack_batches_holds_every_record_once_within_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 120, size=500)
    batches = pack_batches(lengths, 512, np.random.default_rng(1))
    together = np.concatenate(batches)
    assert sorted(together.tolist()) == list(range(500))
    assert all(int(lengths[b].sum()) <= 512 for b in batches)
    # next fit: a batch closes only when the next record would not fit
    assert all(int(lengths[a].sum()) + int(lengths[b[0]]) > 512 for a, b in zip(batches, batches[1:]))
    assert pack_batches(lengths, 512, np.random.default_rng(1))[3].tolist() == batches[3].tolist()  # keyed
    assert np.concatenate(pack_batches(lengths, 512)).tolist() == list(range(500))  # rng None: the given order
    assert pack_batches(np.zeros(0, dtype=np.int64), 8) == []
    with pytest.raises(ValueError, match="a record of 600 tokens is longer than the token budget of 512"):
        pack_batches(np.array([10, 600]), 512)
    binned = [np.flatnonzero((lengths > lo) & (lengths <= lo + 32)) for lo in range(0, 128, 32)]
    assert padding_share(lengths, [b[i : i + 8] for b in binned for i in range(0, len(b), 8)]) > 0.05


def _rows(lengths, seed=0, masks=False) -> Rows:
    g = np.random.default_rng(seed)
    ids = np.concatenate([[2, *g.integers(5, 90, n - 2), 3] for n in lengths]).astype(np.int64)
    rows = Rows(np.asarray(lengths), np.asarray(lengths), np.full(len(lengths), -1, dtype=np.int8), ids)
    if masks:  # one stored mask per record at position 1
        rows.mask_counts = np.ones(len(lengths), dtype=np.int64)
        rows.positions = np.ones(len(lengths), dtype=np.int64)
        rows.masked_ids = np.full(len(lengths), 42)
    return rows


def _vocab() -> VocabTables:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(85)]]
    return VocabTables.from_tokens(tokens)


def test_the_packed_collator_restarts_positions_and_masks_per_batch_at_the_rate():
    cfg = MaskConfig(vocab=_vocab(), masked_lm_prob=0.3, max_predictions_per_seq=100)
    collate = PackedCollator(seed=7, masking="dynamic", mask_config=cfg)
    rows = _rows([10, 64, 5, 40])
    batch = collate(rows, epoch=0, batch_index=3)
    assert batch["input_ids"].shape == (1, 119) and batch["cu_seqlens"].tolist() == [0, 10, 74, 79, 119]
    assert batch["cu_seqlens"].dtype == torch.int32 and int(batch["max_seqlen"]) == 64
    assert batch["position_ids"][0, 70:80].tolist() == [60, 61, 62, 63, 0, 1, 2, 3, 4, 0]
    labels = batch["labels"][0]
    target = labels != -100
    assert torch.equal(labels[target], torch.from_numpy(rows.ids)[target])  # labels are the original ids
    assert not target[batch["cu_seqlens"][:-1].long()].any()  # [CLS] is never a target
    assert abs(int(target.sum()) - round(0.3 * 119)) <= 4
    assert torch.equal(collate(rows, 0, 3)["labels"][0], labels)  # keyed by (seed, epoch, batch index)
    assert not torch.equal(collate(rows, 1, 3)["labels"][0], labels)
    counts = batch_counts(batch)
    assert (counts.tokens, counts.sequences, counts.slots) == (119, 4, 119)
    # static masks come from the records; a tail padded to a multiple of 8 lies outside every sequence
    static = PackedCollator(seed=7, masking="static", pad_id=0, pad_to_multiple_of=8)(_rows([10, 5], masks=True), 0, 0)
    assert static["input_ids"].shape == (1, 16) and static["cu_seqlens"].tolist() == [0, 10, 15]
    assert torch.nonzero(static["labels"][0] != -100).flatten().tolist() == [1, 11]
    assert batch_counts(static).slots == 16 and batch_counts(static).tokens == 15


def test_the_objective_scores_a_packed_batch_as_the_same_records_padded():
    cfg = config()
    objective = Pretraining(cfg)
    model = objective.build(torch.Generator().manual_seed(0), torch.device("cpu")).eval()
    mask_cfg = MaskConfig(vocab=_vocab(), masked_lm_prob=0.3, max_predictions_per_seq=100)
    rows = _rows([12, 40, 7])
    packed = PackedCollator(seed=1, mask_config=mask_cfg)(rows, 0, 0)
    ids, mask = padded([torch.from_numpy(x) for x in np.split(packed["input_ids"][0].numpy(), [12, 52])])
    labels, _ = padded([torch.from_numpy(x) for x in np.split(packed["labels"][0].numpy(), [12, 52])])
    labels[mask == 0] = -100
    with torch.no_grad():
        a = objective.forward(model, packed, torch.device("cpu"))
        b = objective.forward(model, {"input_ids": ids, "attention_mask": mask, "labels": labels}, torch.device("cpu"))
    assert a.sums["mlm_n"] == b.sums["mlm_n"] > 0 and a.sums["mlm_ok"] == b.sums["mlm_ok"]
    assert abs(float(a.loss) - float(b.loss)) < 1e-5 and a.flops < b.flops  # packed: no padded slot's work


def test_a_recipe_chooses_the_family_and_what_it_cannot_do_is_refused_naming_the_key():
    from bertcore.errors import ConfigError
    from pipelines.registry import parse_config

    phases = [{"name": "seq128", "steps": 10, "batch_size": 8}]
    recipe = {
        "corpus": {"inputs": ["a.txt"]},
        "examples": {"objective": "roberta", "max_seq_length": 128},
        "pretrain": {"family": "modernbert", "model_size": "tiny", "phases": phases},
    }
    cfg = parse_config(recipe)
    assert cfg.pretrain.build_model_config(1000).model_type == "modernbert"
    with pytest.raises(ConfigError, match=r"examples\.objective bert makes sentence pairs .* the modernbert family"):
        parse_config({**recipe, "examples": {"objective": "bert", "max_seq_length": 128}})
    bert = {**recipe["pretrain"], "family": "bert"}
    with pytest.raises(ConfigError, match=r"pretrain\.phases\[0\]\.token_budget: the bert family reads padded"):
        parse_config({**recipe, "pretrain": {**bert, "phases": [{**phases[0], "token_budget": 4096}]}})
    with pytest.raises(ConfigError, match=r"pretrain\.phases\[0\]\.global_rope_theta: the bert family has no rotary"):
        parse_config({**recipe, "pretrain": {**bert, "phases": [{**phases[0], "global_rope_theta": 1e4}]}})
    with pytest.raises(ConfigError, match=r"pretrain\.family: the roberta family needs a byte-level BPE vocabulary"):
        parse_config({**recipe, "pretrain": {**recipe["pretrain"], "family": "roberta"}})
