"""GPU checks (`pytest -m gpu`): the training loop in bf16 on NCCL with DeepSpeed's fused
optimizers (FusedAdam under ZeRO-2, FusedLamb at stage 0), resumed after a crash, and the
export of a bf16 ZeRO checkpoint to what transformers loads.

One process, one GPU, an NCCL process group of one. Only a session that asks for them runs
them (`pytest -m gpu`; tests/conftest.py deselects them everywhere else, and sets DeepSpeed's
accelerator to CUDA before any test module is imported); there they fail, not skip, without a
CUDA device. benchmarks/gpu_check.sh runs them on a lent GPU machine."""

from __future__ import annotations

import os

import pytest
import torch

from bertcore.model.bert import BertForPreTraining
from bertcore.train.checkpoint import CHECKPOINTS, LocalStageFiles, checkpoint_tag
from bertcore.train.export import consolidate_checkpoint, export_checkpoint
from bertcore.train.metrics_log import METRICS, MetricsLog
from bertcore.train.objectives import Pretraining
from bertcore.train.phase_data import WorkerContext
from bertcore.train.trainer import Trainer
from test_train import SEED, Crash, crash_at, make_run_root, phase_data, tiny_pretrain

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_world():
    from processes import free_port

    assert torch.cuda.is_available(), "the GPU tests need a CUDA device: run `pytest -m gpu` on a GPU machine"
    assert os.environ.get("DS_ACCELERATOR") == "cuda", (
        f"DeepSpeed's accelerator is {os.environ.get('DS_ACCELERATOR')!r}: run `pytest -m gpu` on its own"
    )
    os.environ.setdefault(
        "TORCH_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability())
    )  # JIT-build the fused ops for this GPU only
    if torch.distributed.is_initialized():
        assert torch.distributed.get_backend() == "nccl", (
            "a gloo process group is already open: run `pytest -m gpu` on its own"
        )
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))


@pytest.fixture(scope="module")
def news_root(tmp_path_factory, gensim_data):
    root = tmp_path_factory.mktemp("gpu")
    return root, make_run_root(root, gensim_data, dupe_factor=1)


def gpu_trainer(cfg, root, info, stage, on_step=None) -> Trainer:
    return Trainer(
        cfg,
        Pretraining(cfg.build_model_config(len(info["tokens"]))),
        phase_data(root, info),
        LocalStageFiles(str(stage)),
        seed=SEED,
        resume_key="gpu",
        ctx=WorkerContext(device="cuda:0"),
        on_step=on_step,
        device_name=torch.cuda.get_device_name(0),
    )


def gpu_config(**overrides):
    fields = dict(
        model_size="mini",
        model_overrides={"max_position_embeddings": 128},
        use_gpu=True,
        precision="bf16",
        learning_rate=2e-3,
        warmup_steps=5,
        checkpoint_every=10,
        validation_batches=2,
        eval_every=10,
        phases=[{"name": "seq64", "steps": 40, "batch_size": 32, "max_seq_length": 64}],
        torch_threads=None,
    )
    return tiny_pretrain(**{**fields, **overrides})


def losses(stage) -> list[tuple[int, str, float]]:
    return [(r["step"], r["data_hash"], r["loss"]) for r in MetricsLog(str(stage / METRICS)).records()]


def test_bf16_zero2_fused_adam_trains_on_nccl_resumes_and_exports(nccl_world, news_root, tmp_path):
    import transformers

    root, info = news_root
    cfg = gpu_config(zero_stage=2, torch_adam=False)  # DeepSpeed's FusedAdam
    marker = gpu_trainer(cfg, root, info, tmp_path / "reference").run()
    records = MetricsLog(str(tmp_path / "reference" / METRICS)).records()
    assert marker["step"] == 40 and marker["precision"] == "bf16" and marker["zero_stage"] == 2
    assert sum(r["mlm_loss"] for r in records[-5:]) < sum(r["mlm_loss"] for r in records[:5]) - 5 * 0.5
    assert all(r["mfu"] is not None and 0 < r["mfu"] < 1 for r in records)  # a known GPU: a peak to divide by
    assert marker["validation"]["mlm_accuracy"] > 0

    with pytest.raises(Crash):
        gpu_trainer(cfg, root, info, tmp_path / "crashed", crash_at(25)).run()
    gpu_trainer(cfg, root, info, tmp_path / "crashed").run()  # from step 20
    resumed, reference = losses(tmp_path / "crashed"), losses(tmp_path / "reference")
    assert [(s, h) for s, h, _ in resumed] == [(s, h) for s, h, _ in reference]  # the same data, step for step
    assert [v for _, _, v in resumed] == pytest.approx(
        [v for _, _, v in reference], abs=2e-2
    )  # bf16 kernels may differ slightly

    model_cfg = cfg.build_model_config(len(info["tokens"]))
    state = consolidate_checkpoint(str(tmp_path / "reference" / CHECKPOINTS / checkpoint_tag(40)), model_cfg)
    assert all(t.dtype == torch.float32 for t in state.values())  # the fp32 masters, not the bf16 copies
    export_checkpoint(state, model_cfg, str(root / "vocab"), str(tmp_path / "model"))
    ours = BertForPreTraining(model_cfg).eval()
    ours.load_state_dict(state)
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "model")).eval()
    ids = torch.randint(5, model_cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (theirs(input_ids=ids).prediction_logits - ours.full_logits(ids).prediction_logits).abs().max() < 1e-4


def test_fused_lamb_trains_in_bf16_at_stage_0(nccl_world, news_root, tmp_path):
    root, info = news_root
    cfg = gpu_config(optimizer="lamb", zero_stage=0, learning_rate=2e-2)  # DeepSpeed's FusedLamb ("type": "Lamb")
    trainer = gpu_trainer(cfg, root, info, tmp_path / "lamb")
    trainer.run()
    assert type(trainer.engine.basic_optimizer).__name__ == "FusedLamb"
    records = MetricsLog(str(tmp_path / "lamb" / METRICS)).records()
    assert sum(r["mlm_loss"] for r in records[-5:]) < sum(r["mlm_loss"] for r in records[:5]) - 5 * 0.3
