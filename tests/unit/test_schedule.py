"""Warmup-stable-decay over the tokens seen (bertcore/train/optim.py `wsd_multiplier`), for any
family: the learning rate at chosen points, the pre-decay checkpoint kept under its name
while older ones are pruned, the token budget ending the run, and a run resumed from the
pre-decay checkpoint into the decay taking exactly the uninterrupted run's steps."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest
import torch
from pydantic import ValidationError

from bertcore.train.checkpoint import (
    CHECKPOINTS,
    COMPLETE,
    PRE_DECAY,
    LocalStageFiles,
    checkpoint_tag,
    named_checkpoint,
)
from bertcore.train.config import ScheduleConfig
from bertcore.train.metrics_log import MetricsLog
from bertcore.train.optim import LearningRate, lr_multiplier, wsd_multiplier
from test_train import Crash, crash_at, make_run_root, make_trainer, tiny_pretrain

torch.set_num_threads(1)


@pytest.mark.parametrize(
    "decay, at, factor",
    [
        ("linear", 0, 0.01),  # (0 + 1) / 100 of the peak: the first update
        ("linear", 49, 0.5),
        ("linear", 100, 1.0),  # warm
        ("linear", 799, 1.0),  # stable up to the decay's start
        ("linear", 800, 1.0),  # the decay's first update is at the peak
        ("linear", 850, 0.1 + 0.9 * 0.75),  # a quarter of the way down to 10%
        ("1-sqrt", 850, 0.1 + 0.9 * 0.5),  # 1 - sqrt(1/4)
        ("1-sqrt", 950, 0.1 + 0.9 * (1 - 0.75**0.5)),
        ("1-sqrt", 1000, 0.1),  # the end, and past it
        ("1-sqrt", 5000, 0.1),
    ],
)
def test_wsd_learning_rate_at_chosen_points(decay, at, factor):
    schedule = ScheduleConfig(
        kind="wsd", warmup_tokens=100, decay_tokens=200, total_tokens=1000, decay=decay, final_lr_ratio=0.1
    )
    assert wsd_multiplier(at, schedule) == pytest.approx(factor)
    assert schedule.decay_start == 800


def test_the_linear_schedule_is_berts_over_steps_and_wsd_needs_its_budget():
    cfg = tiny_pretrain()  # warmup_steps 5, 20 steps
    rate = LearningRate(cfg)
    assert [rate.factor(s, tokens=10**9) for s in range(20)] == [lr_multiplier(s, 5, 20) for s in range(20)]
    with pytest.raises(ValidationError, match="a wsd schedule needs the run's token budget"):
        ScheduleConfig(kind="wsd", warmup_tokens=10)
    with pytest.raises(ValidationError, match=r"warmup_tokens \(600\) \+ decay_tokens \(500\) exceed total_tokens"):
        ScheduleConfig(kind="wsd", warmup_tokens=600, decay_tokens=500, total_tokens=1000)
    with pytest.raises(ValidationError, match=r"pretrain\.warmup_steps / warmup_fraction belong to the linear"):
        tiny_pretrain(schedule={"kind": "wsd", "total_tokens": 1000})


@pytest.fixture(scope="module")
def news_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("wsd")
    return root, make_run_root(root, gensim_data, max_documents=150, dupe_factor=1)


def wsd_config(**overrides):
    # about 700 tokens a step: warm for ~3 steps, stable to ~10, decay over ~6; the budget ends it before step 40
    schedule = {"kind": "wsd", "warmup_tokens": 2000, "decay_tokens": 4000, "total_tokens": 11000, "decay": "1-sqrt"}
    fields = dict(
        warmup_steps=None,
        schedule=schedule,
        phases=[{"name": "seq64", "steps": 40, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=2,
        keep_checkpoints=1,
        validation_batches=0,
        model_overrides={"max_position_embeddings": 128},  # with dropout: a resume must restore the RNG too
    )
    return tiny_pretrain(**{**fields, **overrides})


def test_the_pre_decay_checkpoint_is_kept_and_a_resume_from_it_into_the_decay_is_exact(
    world_of_one, news_root, tmp_path
):
    root, info = news_root
    cfg = wsd_config()
    reference = make_trainer(cfg, root, info, tmp_path / "reference").run()
    records = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    assert reference["stopped_by"] == "token_budget" and reference["tokens_seen"] >= 11000 > records[-2]["tokens_seen"]
    files = LocalStageFiles(str(tmp_path / "reference"))
    pre = named_checkpoint(files, PRE_DECAY)
    assert pre is not None and pre["tokens_seen"] >= 7000 > records[pre["step"] - 2]["tokens_seen"]
    # kept beside the newest (keep_checkpoints 1 pruned every other one)
    assert sorted(os.listdir(tmp_path / "reference" / CHECKPOINTS)) == [
        checkpoint_tag(pre["step"]),
        checkpoint_tag(reference["step"]),
    ]
    lrs = [r["lr"] for r in records]
    peak = cfg.learning_rate
    assert lrs[0] < 0.01 * peak and lrs[pre["step"] - 1] == pytest.approx(peak)  # warmup, then the stable peak
    assert lrs[pre["step"]] < peak  # the decay begins with the first update after the checkpoint
    assert all(a > b for a, b in zip(lrs[pre["step"] :], lrs[pre["step"] + 1 :]))  # then down
    expected = [LearningRate(cfg).rate(0, r["tokens_seen"] - r["tokens"]) for r in records]
    assert lrs == pytest.approx(expected)

    # a crash two steps into the decay: the rerun resumes from the pre-decay checkpoint (the
    # newer one deleted, as a store that lost it) and takes the same steps
    stage = tmp_path / "resumed"
    with pytest.raises(Crash):
        make_trainer(cfg, root, info, stage, on_step=crash_at(pre["step"] + 2)).run()
    for name in os.listdir(stage / CHECKPOINTS):
        if name != checkpoint_tag(pre["step"]):
            (stage / CHECKPOINTS / name / COMPLETE).unlink(missing_ok=True)
    taken: list[int] = []
    finished = make_trainer(cfg, root, info, stage, on_step=lambda r: taken.append(r["step"])).run()
    assert taken[0] == pre["step"] + 1  # from the pre-decay checkpoint, not from the start

    def steps(folder):
        return [(r["step"], r["data_hash"], round(r["loss"], 5), r["lr"]) for r in MetricsLog(str(folder)).records()]

    assert steps(stage / "metrics.jsonl") == steps(tmp_path / "reference" / "metrics.jsonl")
    assert finished["tokens_seen"] == reference["tokens_seen"] and finished["step"] == reference["step"]
    # a finished run asked again returns its marker: the token budget is spent
    assert make_trainer(cfg, root, info, stage).run()["step"] == reference["step"]


def test_packed_batches_fill_the_token_budget_without_padding_and_resume_exactly(world_of_one, news_root, tmp_path):
    """The modern family on packed batches (pretrain.phases[*].token_budget): every step's
    tokens within the budget and no padding, the same steps after a crash and a resume."""
    root, info = news_root
    phase = {"name": "seq64", "steps": 40, "batch_size": 16, "max_seq_length": 64, "token_budget": 768}
    cfg = wsd_config(family="modernbert", phases=[phase])
    reference = make_trainer(cfg, root, info, tmp_path / "reference").run()
    records = MetricsLog(str(tmp_path / "reference" / "metrics.jsonl")).records()
    assert reference["stopped_by"] == "token_budget"
    assert all(r["padding_share"] == 0.0 and r["tokens"] <= 768 for r in records)
    full = [r["tokens"] for r in records[:-1]]  # a window's last batch may be short
    assert sum(full) / len(full) > 0.85 * 768, full  # packed up to the budget, not 16 sequences of up to 64

    stage = tmp_path / "resumed"
    with pytest.raises(Crash):
        make_trainer(cfg, root, info, stage, on_step=crash_at(7)).run()
    make_trainer(cfg, root, info, stage).run()

    def steps(folder):
        return [(r["step"], r["data_hash"], round(r["loss"], 5)) for r in MetricsLog(str(folder)).records()]

    assert steps(stage / "metrics.jsonl") == steps(tmp_path / "reference" / "metrics.jsonl")
