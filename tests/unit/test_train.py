"""bertcore.train.trainer and what it uses: the pretrain config section, schedule, LAMB, loss watch, metrics log,
checkpoint bookkeeping, and the DeepSpeed loop in one process (world size 1, gloo):
time budget, NaN handling, exact resume.

`make_run_root` (also used by test_pretrain_stage.py and test_export.py) writes what the
vocab and examples stages would: a WordPiece trained here on the gensim news sample and
examples shards made with bertcore.examples.layout, with their manifests."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pyarrow.ipc as ipc
import pytest
import torch
from pydantic import ValidationError

from bertcore.examples.config import ExamplesConfig, PhaseConfig
from bertcore.examples.layout import examples_for_shard, records_to_table
from bertcore.examples.masking import VocabTables
from bertcore.examples.pairs import InMemoryDocs
from bertcore.model.bert import BertForPreTraining, ModelConfig
from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, LocalStageFiles, checkpoint_tag, complete_checkpoints
from bertcore.train.config import PretrainConfig
from bertcore.train.loss_watch import LossWatch, TrainingDiverged
from bertcore.train.metrics_log import VALIDATION, MetricsLog
from bertcore.train.objectives import Pretraining
from bertcore.train.optim import Lamb, deepspeed_config, lr_multiplier, parameter_groups
from bertcore.train.phase_data import PhaseData, WorkerContext, endless_batches, phase_loader
from bertcore.train.trainer import Trainer
from bertcore.vocab.tokenizer import VocabConfig, save_tokenizer, train_wordpiece, vocab_list

torch.set_num_threads(1)
SEED = 4321


# -- the inputs a pretrain run reads -------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_run_root(
    root: Path,
    gensim_data: Path,
    *,
    phases: tuple[tuple[str, int], ...] = (("seq64", 64),),
    masking: str = "static",
    dupe_factor: int = 2,
    vocab_size: int = 600,
    short_seq_prob: float = 0.1,
    length_bins: tuple[int, ...] = (32,),
    max_documents: int | None = None,
) -> dict:
    """Write <root>/vocab/ and <root>/examples/<phase>/{train,validation}/part-00000.arrow
    with both manifests, from the 300 news articles of lee_background.cor. Returns
    {"tokens": vocabulary, "records": {phase: train record count}}."""
    lines = (gensim_data / "lee_background.cor").read_text(encoding="utf-8", errors="replace").splitlines()
    documents = [[s.strip() for s in line.split(". ") if s.strip()] for line in lines if line.strip()][:max_documents]
    vocab_cfg = VocabConfig(vocab_size=vocab_size, bert_layout=False, limit_alphabet=100)
    tokenizer = train_wordpiece((s for d in documents for s in d), vocab_cfg)
    vocab_dir = root / "vocab"
    names = save_tokenizer(tokenizer, vocab_cfg, str(vocab_dir))
    tokens = vocab_list(tokenizer)
    encoded = iter(tokenizer.encode_batch([s for d in documents for s in d], add_special_tokens=False))
    docs = [[ids for ids in (next(encoded).ids for _ in d) if ids] for d in documents]
    docs = [d for d in docs if d]
    vocab = VocabTables.from_tokens(tokens)
    examples_cfg = ExamplesConfig(
        phases=[
            PhaseConfig(name=n, max_seq_length=n_tok, max_predictions_per_seq=max(1, round(0.15 * n_tok)))
            for n, n_tok in phases
        ],
        length_bins=sorted({*length_bins, *(n_tok for _, n_tok in phases)}),
        dupe_factor=dupe_factor,
        short_seq_prob=short_seq_prob,
        masking=masking,
    )
    split = int(len(docs) * 0.9)
    shards, counts = [], {}
    for phase in examples_cfg.phases:
        for part, indices in (("train", range(split)), ("validation", range(split, len(docs)))):
            records = list(examples_for_shard(list(indices), InMemoryDocs(docs), examples_cfg, phase, SEED, vocab))
            table = records_to_table(records, len(tokens))
            path = root / "examples" / phase.name / part / "part-00000.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            with ipc.new_file(str(path), table.schema) as writer:
                writer.write_table(table, max_chunksize=200)
            relative = f"{phase.name}/{part}/part-00000.arrow"
            shards.append(
                {
                    "path": relative,
                    "rows": len(records),
                    "bytes": path.stat().st_size,
                    "sha256": _sha256(path),
                    "extra": {},
                }
            )
            if part == "train":
                counts[phase.name] = len(records)
    common = {
        "code_version": "test",
        "inputs": {},
        "timings": {},
        "skipped": [],
        "package_version": "test",
        "created_at": "",
        "python": "",
    }
    examples_manifest = {
        "stage": "examples",
        "fingerprint": "examples-"
        + hashlib.sha256(json.dumps([s["sha256"] for s in shards]).encode()).hexdigest()[:12],
        "config": examples_cfg.model_dump(mode="json"),
        "shards": shards,
        "stats": {p.name: {"masking": masking} for p in examples_cfg.phases},
        **common,
    }
    vocab_shards = [
        {"path": n, "rows": 1, "bytes": (vocab_dir / n).stat().st_size, "sha256": _sha256(vocab_dir / n), "extra": {}}
        for n in names
    ]
    vocab_manifest = {
        "stage": "vocab",
        "fingerprint": "vocab-" + _sha256(vocab_dir / "vocab.txt")[:12],
        "config": vocab_cfg.model_dump(mode="json"),
        "shards": vocab_shards,
        "stats": {},
        **common,
    }
    (root / "examples" / "_manifest.json").write_text(json.dumps(examples_manifest))
    (vocab_dir / "_manifest.json").write_text(json.dumps(vocab_manifest))
    return {"tokens": tokens, "records": counts, "examples": examples_cfg}


def tiny_pretrain(**overrides) -> PretrainConfig:
    """A tiny-model config for the 64-token sample phase; no dropout unless overridden."""
    fields = dict(
        model_size="tiny",
        model_overrides={
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": 128,
        },
        num_workers=1,
        learning_rate=1e-3,
        warmup_steps=5,
        phases=[{"name": "seq64", "steps": 20, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10,
        validation_batches=2,
        torch_threads=1,
    )
    fields.update(overrides)
    return PretrainConfig(**fields)


# -- configuration ---------------------------------------------------------------------------


def test_fp16_on_cpu_is_refused_naming_the_key():
    with pytest.raises(ValidationError, match=r"pretrain\.precision=fp16 needs a GPU"):
        PretrainConfig(precision="fp16")
    assert PretrainConfig(precision="fp16", use_gpu=True).precision == "fp16"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"zero_stage": 4}, r"zero_stage"),
        ({"zero_stage": -1}, r"zero_stage"),
        (
            {
                "num_workers": 3,
                "gradient_accumulation_steps": 2,
                "phases": [{"name": "seq128", "steps": 5, "batch_size": 16, "max_seq_length": 128}],
            },
            r"pretrain\.phases\[0\]\.batch_size \(16\) must be a multiple of .* \(3 x 2 = 6\)",
        ),
        (
            {"phases": [{"name": "seq1024", "steps": 5, "batch_size": 16, "max_seq_length": 1024}]},
            r"pretrain\.phases\[0\]\.max_seq_length \(1024\) exceeds the model's max_position_embeddings \(512\)",
        ),
        ({"optimizer": "lamb", "zero_stage": 2}, r"pretrain\.optimizer=lamb needs pretrain\.zero_stage=0"),
        ({"warmup_steps": 10, "warmup_fraction": 0.1}, r"warmup_steps and pretrain\.warmup_fraction"),
        ({"model_overrides": {"hidden_szie": 3}}, r"pretrain\.model_overrides: .*hidden_szie"),
        ({"model_overrides": {"vocab_size": 3}}, r"pretrain\.model_overrides\.vocab_size"),
        ({"optimiser": "lamb"}, r"optimiser"),
        ({"betas": [0.9, 1.0]}, r"betas"),
    ],
)
def test_invalid_settings_are_errors_that_name_the_key(fields, message):
    with pytest.raises(ValidationError, match=message):
        PretrainConfig(**fields)


def test_position_embeddings_override_allows_longer_phases_and_sizes_resolve():
    cfg = PretrainConfig(
        model_size="mini",
        model_overrides={"max_position_embeddings": 1024},
        phases=[{"name": "seq1024", "steps": 100, "batch_size": 8, "max_seq_length": 1024}],
    )
    model = cfg.build_model_config(vocab_size=999, pad_token_id=0)
    assert (model.num_hidden_layers, model.hidden_size, model.max_position_embeddings, model.vocab_size) == (
        4,
        256,
        1024,
        999,
    )
    assert cfg.micro_batch_size(cfg.phases[0]) == 4  # 8 sequences over 2 default workers
    assert cfg.warmup == 1  # default: 1% of all steps


def test_default_schedule_is_berts_and_phase_lookup_follows_step_counts():
    cfg = PretrainConfig()
    # lengths are left to the examples phases of the same names (seq128, seq512)
    assert [(p.name, p.steps, p.batch_size, p.max_seq_length) for p in cfg.phases] == [
        ("seq128", 900_000, 256, None),
        ("seq512", 100_000, 256, None),
    ]
    assert cfg.warmup == 10_000 and cfg.total_steps == 1_000_000
    assert [cfg.phase_at(s) for s in (0, 899_999, 900_000, 999_999)] == [0, 0, 1, 1]
    with pytest.raises(ValueError):
        cfg.phase_at(1_000_000)


def test_resume_key_ignores_budget_and_cadence_but_not_the_trajectory():
    base = tiny_pretrain()
    inputs = {"examples": "e", "vocab": "v", "seed": 1}
    key = base.resume_key(inputs)
    assert tiny_pretrain(time_budget_s=5, checkpoint_every=3, keep_checkpoints=1, log_every=1).resume_key(inputs) == key
    assert tiny_pretrain(learning_rate=2e-3).resume_key(inputs) != key
    assert tiny_pretrain(num_workers=2).resume_key(inputs) != key  # the loader shards by world size
    assert base.resume_key({**inputs, "seed": 2}) != key


# -- schedule and optimizer ------------------------------------------------------------------


def test_learning_rate_rises_linearly_then_decays_linearly_to_the_last_step():
    warmup, total = 10, 110
    factors = [lr_multiplier(s, warmup, total) for s in range(total)]
    assert factors[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert factors[warmup] == 1.0 and max(factors) == 1.0
    decay = factors[warmup:]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert max(steps) - min(steps) < 1e-12  # a straight line
    assert factors[-1] == pytest.approx(1 / (total - warmup))  # the last update still moves
    assert lr_multiplier(0, 0, 5) == 1.0


def test_lamb_step_matches_the_paper_update_and_scales_each_layer_to_its_weight_norm():
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(6, 4, generator=g), torch.randn(4, generator=g) * 1e-3]
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    grads = [torch.randn(w.shape, generator=g) * s for w, s in zip(weights, (10.0, 1e-4))]
    for p, grad in zip(params, grads):
        p.grad = grad.clone()
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-6, 0.1
    Lamb(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd).step()
    for w, grad, p in zip(weights, grads, params):
        m_hat = (1 - b1) * grad / (1 - b1)
        v_hat = (1 - b2) * grad**2 / (1 - b2)
        update = m_hat / (v_hat.sqrt() + eps) + wd * w
        expected = w - lr * (w.norm() / update.norm()) * update
        assert torch.allclose(p.detach(), expected, atol=1e-7)
        # The trust ratio makes every layer move by lr * ||w||, whatever its gradient scale.
        assert (p.detach() - w).norm().item() == pytest.approx(lr * w.norm().item(), rel=1e-5)


def test_lamb_leaves_zero_weights_to_the_plain_adam_step_and_trains_a_model():
    zero = torch.nn.Parameter(torch.zeros(3))
    zero.grad = torch.tensor([1.0, -2.0, 0.5])
    Lamb([zero], lr=0.1).step()
    assert torch.allclose(zero.detach(), -0.1 * torch.sign(torch.tensor([1.0, -2.0, 0.5])), atol=1e-5)

    cfg = ModelConfig.named("tiny", 200, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 200, (8, 16), generator=g)
    labels = torch.where(torch.rand(8, 16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    optimizer = Lamb(parameter_groups(model, 0.01), lr=0.02)
    first = None
    for _ in range(30):
        loss = model(ids, labels=labels).loss
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5 * first


def test_weight_decay_spares_biases_and_layer_norms_and_counts_tied_weights_once():
    model = BertForPreTraining(ModelConfig.named("tiny", 100))
    decay, plain = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in plain["params"])
    assert any(names[id(p)].endswith("LayerNorm.weight") for p in plain["params"])
    assert "bert.embeddings.word_embeddings.weight" in {names[id(p)] for p in decay["params"]}
    assert len(decay["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_deepspeed_config_follows_the_section():
    ds = deepspeed_config(
        tiny_pretrain(
            zero_stage=2,
            precision="bf16",
            gradient_accumulation_steps=2,
            num_workers=2,
            phases=[{"name": "seq64", "steps": 10, "batch_size": 16, "max_seq_length": 64}],
        ),
        micro_batch_size=4,
    )
    assert ds["train_batch_size"] == 16 and ds["gradient_accumulation_steps"] == 2
    assert (
        ds["zero_optimization"] == {"stage": 2, "elastic_checkpoint": True}
        and ds["bf16"] == {"enabled": True}
        and ds["gradient_clipping"] == 1.0
    )
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["torch_adam"] is True
    assert "optimizer" not in deepspeed_config(tiny_pretrain(optimizer="lamb"), 4)  # a client optimizer


# -- loss watch, metrics log, checkpoint bookkeeping -------------------------------------------


def test_loss_watch_flags_spikes_after_its_grace_and_ignores_non_finite_steps():
    watch = LossWatch(factor=3.0, grace=5)
    for loss in (5.0, 4.0, 4.0, 4.0):
        watch.observe(loss)
        assert not watch.is_spike(100.0)  # still in grace
    watch.observe(4.0)
    assert watch.is_spike(100.0) and not watch.is_spike(8.0)
    before = watch.state_dict()
    watch.observe(float("nan"))
    assert watch.state_dict() == before
    watch.reset()
    assert not watch.is_spike(100.0)
    assert not LossWatch(factor=None, grace=0, mean=1.0, seen=10).is_spike(1e9)


def test_metrics_log_truncation_keeps_earlier_steps_and_drops_a_cut_line(tmp_path):
    log = MetricsLog(str(tmp_path / "metrics.jsonl"))
    for step in range(1, 6):
        log.append({"step": step, "loss": 1.0 / step})
    with open(log.path, "a") as handle:
        handle.write('{"step": 6, "lo')  # killed mid-write
    log.truncate(3)
    assert [r["step"] for r in log.records()] == [1, 2, 3]
    log.append({"step": 4})
    assert [r["step"] for r in log.records()] == [1, 2, 3, 4]


def test_only_checkpoints_with_a_marker_count_as_complete(tmp_path):
    files = LocalStageFiles(str(tmp_path))
    for step, complete in ((100, True), (200, True), (300, False)):
        folder = tmp_path / CHECKPOINTS / checkpoint_tag(step)
        folder.mkdir(parents=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"x")
        if complete:
            files.write_text(f"{CHECKPOINTS}/{checkpoint_tag(step)}/{COMPLETE}", json.dumps({"step": step}))
    assert checkpoint_tag(100) == "step-0000100"
    assert [m["step"] for m in complete_checkpoints(files)] == [100, 200]


# -- the loop in one process -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("run")
    info = make_run_root(root, gensim_data)
    return root, info


def phase_data(root: Path, info: dict, name: str = "seq64") -> list[PhaseData]:
    vocab = VocabTables.from_tokens(info["tokens"])
    return [
        PhaseData(
            name=name,
            shards=[str(root / "examples" / name / "train" / "part-00000.arrow")],
            validation_shards=[str(root / "examples" / name / "validation" / "part-00000.arrow")],
            pad_id=vocab.special.pad,
            length_bins=info["examples"].length_bins,
        )
    ]


def make_trainer(cfg: PretrainConfig, root: Path, info: dict, stage: Path, init_state_dict=None, **kwargs) -> Trainer:
    return Trainer(
        cfg,
        Pretraining(cfg.build_model_config(len(info["tokens"])), init_state_dict=init_state_dict),
        phase_data(root, info),
        LocalStageFiles(str(stage)),
        seed=SEED,
        resume_key=cfg.resume_key({"test": 1}),
        **kwargs,
    )


def test_time_budget_stops_cleanly_and_a_rerun_finishes_the_same_steps(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    reference = make_trainer(tiny_pretrain(), root, info, tmp_path / "reference").run()
    assert reference["step"] == 20 and reference["stopped_by"] is None
    assert reference["validation"]["sequences"] > 0
    before = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    again = make_trainer(tiny_pretrain(), root, info, tmp_path / "reference").run()  # finds the final checkpoint
    assert again == reference and MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records() == before

    stage = tmp_path / "budget"
    stopped = make_trainer(tiny_pretrain(time_budget_s=1e-3), root, info, stage).run()
    assert stopped["stopped_by"] == "time_budget" and stopped["step"] == 1
    assert (stage / CHECKPOINTS / checkpoint_tag(1) / COMPLETE).exists()
    finished = make_trainer(tiny_pretrain(), root, info, stage).run()
    assert finished["step"] == 20 and finished["stopped_by"] is None

    def steps(folder):
        return [
            (r["step"], r["data_hash"], round(r["loss"], 5))
            for r in MetricsLog(str(folder / "metrics.jsonl")).records()
        ]

    assert steps(stage) == steps(tmp_path / "reference")
    assert finished["tokens_seen"] == reference["tokens_seen"]
    # checkpoints at the budget stop, at 10 and at the end; all complete
    assert [m["step"] for m in complete_checkpoints(LocalStageFiles(str(stage)))] == [1, 10, 20]


def test_metrics_have_every_field_per_step(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    cfg = tiny_pretrain(
        peak_flops_per_device=1e11,
        warmup_steps=1,
        phases=[{"name": "seq64", "steps": 3, "batch_size": 8, "max_seq_length": 64}],
    )
    make_trainer(cfg, root, info, tmp_path).run()
    records = MetricsLog(str(tmp_path / "metrics.jsonl")).records()
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["phase"] == "seq64"
        for key in (
            "loss",
            "mlm_loss",
            "nsp_loss",
            "mlm_accuracy",
            "nsp_accuracy",
            "lr",
            "grad_norm",
            "tokens_per_s",
            "sequences_per_s",
            "mfu",
        ):
            assert isinstance(r[key], float) and math.isfinite(r[key]), key
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["nsp_loss"], rel=1e-6)
        assert 0.0 <= r["mlm_accuracy"] <= 1.0 and 0.0 < r["mfu"] < 1.0
        assert r["sequences"] == 8 and 8 * 3 <= r["tokens"] <= 8 * 64
    assert [r["lr"] for r in records] == pytest.approx([1e-3 * lr_multiplier(s, 1, 3) for s in range(3)])


def _nan_row_weights(cfg: ModelConfig, token: int) -> dict:
    model = BertForPreTraining(cfg, torch.Generator().manual_seed(0))
    state = model.state_dict()
    state["bert.embeddings.word_embeddings.weight"][token] = float("nan")
    return state


def test_nan_loss_stops_with_the_step_named(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    cfg = tiny_pretrain()
    model_cfg = cfg.build_model_config(len(info["tokens"]))
    trainer = make_trainer(
        cfg, root, info, tmp_path, init_state_dict=_nan_row_weights(model_cfg, info["tokens"].index("the"))
    )
    with pytest.raises(
        TrainingDiverged, match=r"the loss is not finite at step 1 \(phase seq64\).*pretrain\.on_nonfinite=skip"
    ):
        trainer.run()


def _rare_target(root: Path, share: float) -> int:
    """The token id whose share among the stored MLM targets is closest to `share`."""
    table = ipc.open_file(str(root / "examples" / "seq64" / "train" / "part-00000.arrow")).read_all()
    counts = Counter(table.column("masked_ids").combine_chunks().flatten().to_pylist())
    total = sum(counts.values())
    return min(counts, key=lambda t: abs(counts[t] / total - share))


def test_skip_policy_drops_the_poisoned_batches_and_stop_names_the_first(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    # No spike check: only the poisoned batches may be skipped, so they can be predicted.
    cfg = tiny_pretrain(on_nonfinite="skip", loss_spike_factor=None)
    model = BertForPreTraining(cfg.build_model_config(len(info["tokens"])), torch.Generator().manual_seed(0))
    state = model.state_dict()
    # A -inf output bias makes the loss infinite exactly for batches where that token is a
    # target (about one batch in six here) and leaves every other batch finite.
    poisoned = _rare_target(root, 0.002)
    state["cls.predictions.bias"][poisoned] = float("-inf")
    marker = make_trainer(cfg, root, info, tmp_path / "skip", init_state_dict=state).run()
    records = MetricsLog(str(tmp_path / "skip" / "metrics.jsonl")).records()
    assert marker["step"] == 20 and [r["step"] for r in records] == list(range(1, 21))
    # Replay the trainer's batch stream: each step skips exactly the poisoned batches in
    # front of its first clean one, and no clean batch is lost.
    stream = endless_batches(
        phase_loader(cfg, phase_data(root, info)[0], cfg.phases[0], SEED, WorkerContext()), "seq64"
    )
    expected = []
    for _ in range(20):
        expected.append(0)
        while bool((next(stream)["labels"] == poisoned).any()):
            expected[-1] += 1
    assert sum(expected) > 0, "the poisoned token must hit at least one batch, or nothing is tested"
    assert [r["skipped_batches"] for r in records] == expected
    skipped = [r["step"] for r in records if r["skipped_batches"]]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)
    # The stop policy sees the same data and ends at the first step that met such a batch.
    with pytest.raises(TrainingDiverged, match=rf"not finite at step {skipped[0]} \(phase seq64\)"):
        make_trainer(tiny_pretrain(), root, info, tmp_path / "stop", init_state_dict=state).run()


class Crash(Exception):
    """Raised by an on_step callback to stop a run at a chosen step, as a crash would."""


def crash_at(step: int):
    """An on_step callback that kills the run once step `step` is logged."""

    def on_step(record: dict) -> None:
        if record["step"] == step:
            raise Crash(step)

    return on_step


@pytest.fixture(scope="module")
def two_phase_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("phases")
    return root, make_run_root(root, gensim_data, phases=(("seq32", 32), ("seq64", 64)), dupe_factor=1)


def test_phases_run_in_order_and_a_crash_resumes_exactly_across_the_boundary(world_of_one, two_phase_root, tmp_path):
    root, info = two_phase_root
    cfg = tiny_pretrain(
        phases=[
            {"name": "seq32", "steps": 6, "batch_size": 16, "max_seq_length": 32},
            {"name": "seq64", "steps": 4, "batch_size": 8, "max_seq_length": 64},
        ],
        checkpoint_every=3,
        keep_checkpoints=2,
        model_overrides={},  # with dropout: the resumed run must restore the RNG too
    )
    vocab = VocabTables.from_tokens(info["tokens"])

    def trainer(stage: Path, on_step=None) -> Trainer:
        phases = [
            PhaseData(
                name=n, shards=[str(root / "examples" / n / "train" / "part-00000.arrow")], pad_id=vocab.special.pad
            )
            for n in ("seq32", "seq64")
        ]
        return Trainer(
            cfg,
            Pretraining(cfg.build_model_config(len(info["tokens"]))),
            phases,
            LocalStageFiles(str(stage)),
            seed=SEED,
            resume_key="k",
            on_step=on_step,
        )

    def steps(stage: Path):
        return [
            (r["step"], r["phase"], r["sequences"], r["data_hash"], round(r["loss"], 5))
            for r in MetricsLog(str(stage / "metrics.jsonl")).records()
        ]

    trainer(tmp_path / "reference").run()
    reference = steps(tmp_path / "reference")
    assert [(s, p, n) for s, p, n, _, _ in reference] == [(s, "seq32", 16) for s in range(1, 7)] + [
        (s, "seq64", 8) for s in range(7, 11)
    ]
    records = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    assert all(r["padded_tokens"] <= r["sequences"] * (32 if r["phase"] == "seq32" else 64) for r in records)

    for crash in (5, 8):  # mid-phase (resumes from step 3), after the boundary (from step 6)
        stage = tmp_path / f"crash-{crash}"
        with pytest.raises(Crash):
            trainer(stage, crash_at(crash)).run()
        assert len(MetricsLog(str(stage / "metrics.jsonl")).records()) == crash
        marker = trainer(stage).run()
        assert marker["step"] == 10
        assert steps(stage) == reference
    # keep_checkpoints=2: the two newest complete checkpoints remain
    assert sorted(os.listdir(tmp_path / "crash-8" / CHECKPOINTS)) == [checkpoint_tag(9), checkpoint_tag(10)]


def test_validation_every_n_steps_follows_a_fixed_sample_and_leaves_training_alone(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    every5 = make_trainer(tiny_pretrain(eval_every=5), root, info, tmp_path / "every5").run()
    end_only = make_trainer(tiny_pretrain(eval_every=None), root, info, tmp_path / "end-only").run()

    def trajectory(stage):
        return [(r["step"], r["data_hash"], r["loss"]) for r in MetricsLog(str(stage / "metrics.jsonl")).records()]

    assert trajectory(tmp_path / "every5") == trajectory(tmp_path / "end-only")  # validating changes no step
    records = MetricsLog(str(tmp_path / "every5" / VALIDATION)).records()
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    assert [r["step"] for r in MetricsLog(str(tmp_path / "end-only" / VALIDATION)).records()] == [20]
    assert len({r["sequences"] for r in records}) == 1 and records[0]["sequences"] > 0
    # the same weights on the same sample: the two runs' final validations agree exactly
    timeless = [
        {k: v for k, v in r.items() if k != "time_s"}
        for r in (records[-1], every5["validation"], end_only["validation"])
    ]
    assert timeless[0] == timeless[1] == timeless[2]
    assert records[-1]["mlm_loss"] < records[0]["mlm_loss"] - 0.2  # held-out loss falls as training goes on
    assert all(0.0 <= r["mlm_accuracy"] <= 1.0 and r["nsp_loss"] is not None for r in records)

    # a crash after the step-15 validation resumes from step 10: the log is cut back, not duplicated
    with pytest.raises(Crash):
        make_trainer(tiny_pretrain(eval_every=5), root, info, tmp_path / "crashed", on_step=crash_at(17)).run()
    assert [r["step"] for r in MetricsLog(str(tmp_path / "crashed" / VALIDATION)).records()] == [5, 10, 15]
    make_trainer(tiny_pretrain(eval_every=5), root, info, tmp_path / "crashed").run()
    resumed = MetricsLog(str(tmp_path / "crashed" / VALIDATION)).records()
    assert [r["step"] for r in resumed] == [5, 10, 15, 20]
    assert [r["mlm_loss"] for r in resumed] == pytest.approx([r["mlm_loss"] for r in records], abs=1e-6)


def test_lamb_as_a_client_optimizer_trains_and_resumes_exactly(world_of_one, sample_root, tmp_path):
    root, info = sample_root
    # LAMB moves each layer by lr x its weight norm per step: 5% here, what Adam at 1e-3 does to 0.02-std weights
    cfg = tiny_pretrain(optimizer="lamb", learning_rate=5e-2, checkpoint_every=5, validation_batches=0)
    make_trainer(cfg, root, info, tmp_path / "reference").run()
    reference = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    assert sum(r["mlm_loss"] for r in reference[-5:]) < sum(r["mlm_loss"] for r in reference[:5]) - 5 * 0.3
    with pytest.raises(Crash):
        make_trainer(cfg, root, info, tmp_path / "crashed", on_step=crash_at(13)).run()
    make_trainer(cfg, root, info, tmp_path / "crashed").run()  # resumes from step 10 with LAMB's moments
    resumed = MetricsLog(str(tmp_path / "crashed" / "metrics.jsonl")).records()
    assert [(r["data_hash"], round(r["loss"], 5)) for r in resumed] == [
        (r["data_hash"], round(r["loss"], 5)) for r in reference
    ]
