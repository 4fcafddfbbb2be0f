"""GPU pretraining throughput: bertcore's BertForPreTraining against transformers' on one
GPU, BERT-base at seq128 in bf16 by default: sequences/s, MFU, and the ratio.

Same weights, same batches (benchmarks/pretrain.py's BERT-like length mix, padded per
batch to a multiple of 8, 15% masked), same optimizer (torch's fused AdamW on fp32
weights, forward and backward under bf16 autocast), same attention kernels (SDPA). Steps
alternate between the models, who goes first rotating every round; warm-up rounds are
not timed; the GPU is synchronised around every timed step.

MFU = model FLOPs / (seconds x peak), the same model FLOPs for both models:
bertcore.model.bert.encoder_flops_per_token per non-pad token (6 x weights + 12 x L x H x T for
attention + the MLM head on the masked positions). transformers also projects every
unmasked position onto the vocabulary; that is work, not model FLOPs, so it shows as a
lower MFU. The peak is bertcore.train.mfu's table (H100/H200 bf16: 989e12 dense) or --peak-flops.

--deepspeed adds bertcore as the pretrain stage runs it: a DeepSpeed engine in bf16 (bf16
weights, fp32 masters), ZeRO-1, DeepSpeed's FusedAdam (nvcc builds it on first use),
gradient clipping, in a one-process NCCL group (with --smoke on a CPU: gloo, torch's AdamW).

    python benchmarks/gpu_pretrain.py                    # BERT-base, seq128, 256 per step
    python benchmarks/gpu_pretrain.py --compile --deepspeed
    python benchmarks/gpu_pretrain.py --smoke            # tiny sizes; runs on a CPU too
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/pretrain.py: the batches
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project, when not installed

import torch
import transformers

from bertcore.model.bert import NAMED_SIZES, BertForPreTraining, ModelConfig, encoder_flops_per_token
from bertcore.rng import keyed_numpy
from bertcore.train.config import PretrainConfig
from bertcore.train.mfu import peak_flops
from bertcore.train.optim import parameter_groups
from pretrain import make_batch


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base", choices=list(NAMED_SIZES))
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--batch-size", type=int, default=256, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds per model")
    parser.add_argument("--steps", type=int, default=20, help="timed rounds per model")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument(
        "--deepspeed", action="store_true", help="add bertcore through a DeepSpeed engine (bf16, ZeRO-1, FusedAdam)"
    )
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s of the device (default: bertcore.train.mfu's table)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model, 8 x 64 tokens, 1 + 2 rounds: checks the script, times nothing useful",
    )
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.smoke:
        args.size, args.vocab_size, args.batch_size, args.seq_len, args.warmup, args.steps = "tiny", 1000, 8, 64, 1, 2
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(model, optimizer, batch, device) -> float:
    """One step under bf16 autocast with fp32 weights and torch's AdamW."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def deepspeed_engine(model: torch.nn.Module, batch_size: int, device: torch.device):
    """bertcore's model in a DeepSpeed engine as bertcore.train.trainer builds it, in a process
    group of one (NCCL; gloo and torch's AdamW for a smoke run on a CPU)."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if not torch.distributed.is_initialized():
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
        )
        if device.type == "cuda":
            torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=device)
        else:
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    adam = {
        "lr": 1e-4,
        "betas": [0.9, 0.999],
        "eps": 1e-6,
        "weight_decay": 0.01,
        **({} if device.type == "cuda" else {"torch_adam": True}),
    }
    config = {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": batch_size,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": adam},
        "steps_per_print": 2**31 - 1,
    }
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=parameter_groups(model, 0.01), config=config, dist_init_required=False
    )
    return engine


def deepspeed_step(engine, _optimizer, batch, _device) -> float:
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()
    return loss.detach()


def build(args, cfg: ModelConfig, device: torch.device) -> dict[str, tuple]:
    """name -> (model, optimizer, step function), all from the same initial weights."""
    ours = BertForPreTraining(cfg, torch.Generator().manual_seed(args.seed))
    hf = transformers.BertForPreTraining._from_config(
        transformers.BertConfig(**cfg.to_hf_config_dict()), attn_implementation="sdpa"
    )
    hf.load_state_dict(ours.state_dict(), strict=True)
    fused = {"fused": True} if device.type == "cuda" else {}
    runs = {}
    for name, model in (("bertcore", ours), ("transformers", hf)):
        model.to(device).train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, **fused
        )
        runs[name] = (torch.compile(model) if args.compile else model, optimizer, plain_step)
    if args.deepspeed:
        twin = BertForPreTraining(cfg, torch.Generator().manual_seed(args.seed))
        runs["bertcore (DeepSpeed bf16, ZeRO-1)"] = (
            deepspeed_engine(twin, args.batch_size, device),
            None,
            deepspeed_step,
        )
    return runs


def main() -> None:
    args = arguments()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if args.deepspeed and device.type != "cuda" and not args.smoke:
        sys.exit("--deepspeed needs a GPU (NCCL), except with --smoke")
    cfg = ModelConfig.named(args.size, args.vocab_size)
    runs = build(args, cfg, device)
    rounds = args.warmup + args.steps
    batches = [
        {
            k: v.to(device)
            for k, v in make_batch(
                keyed_numpy(args.seed, "gpu-bench", i), args.batch_size, args.seq_len, args.vocab_size
            ).items()
        }
        for i in range(rounds)
    ]
    seconds = dict.fromkeys(runs, 0.0)
    last_loss = {}
    for i, batch in enumerate(batches):
        names = list(runs)
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate who goes first
            model, optimizer, step = runs[name]
            sync(device)
            t0 = time.perf_counter()
            last_loss[name] = step(model, optimizer, batch, device)
            sync(device)
            if i >= args.warmup:
                seconds[name] += time.perf_counter() - t0
    report(args, cfg, device, batches[args.warmup :], seconds, {k: float(v) for k, v in last_loss.items()})


def report(
    args, cfg: ModelConfig, device: torch.device, timed: list[dict], seconds: dict[str, float], losses: dict[str, float]
) -> None:
    tokens = sum(int(b["attention_mask"].sum()) for b in timed)
    flops = sum(
        encoder_flops_per_token(
            cfg, b["input_ids"].shape[1], float((b["labels"] != -100).sum() / b["attention_mask"].sum())
        )
        * int(b["attention_mask"].sum())
        for b in timed
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(PretrainConfig(precision="bf16", peak_flops_per_device=args.peak_flops), name)
    sequences = args.batch_size * len(timed)
    rows = {}
    for run, secs in seconds.items():
        rows[run] = {
            "sequences_per_s": sequences / secs,
            "tokens_per_s": tokens / secs,
            "ms_per_step": secs / len(timed) * 1e3,
            "mfu": flops / secs / peak if peak else None,
            "last_loss": losses[run],
        }
    print(
        f"{name}: {args.size} ({cfg.num_hidden_layers}x{cfg.hidden_size}), vocab {args.vocab_size}, {args.batch_size} "
        f"x {args.seq_len} tokens per step ({tokens / sum(b['attention_mask'].numel() for b in timed):.1%} non-pad), "
        f"bf16 autocast, {args.steps} timed steps after {args.warmup}; torch {torch.__version__}, transformers "
        f"{transformers.__version__}{', compiled' if args.compile else ''}; peak {peak or 'unknown'} FLOP/s"
    )
    for run, row in rows.items():
        mfu = f"{row['mfu']:6.1%}" if row["mfu"] is not None else "   n/a"
        print(
            f"{run:>34}: {row['sequences_per_s']:9.1f} seq/s  {row['tokens_per_s']:11.0f} tok/s  "
            f"{row['ms_per_step']:8.1f} ms/step  MFU {mfu}  loss {row['last_loss']:.3f}"
        )
    ratio = rows["bertcore"]["sequences_per_s"] / rows["transformers"]["sequences_per_s"]
    print(f"bertcore / transformers: {ratio:.2f}x sequences per second (same batches, optimizer and precision)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": name, "args": vars(args), "rows": rows, "ratio": ratio}, indent=2) + "\n"
        )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
