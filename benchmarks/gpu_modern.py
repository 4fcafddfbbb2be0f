"""GPU pretraining throughput of the modern family: bertcore's ModernBertForMaskedLM on packed
batches against transformers' ModernBertForMaskedLM on the same records padded (SDPA, its
sparse MLM head), ModernBERT-base (22 x 768) by default, sequences of 1,024 tokens with the
paper's length mix, 30% masked, bf16 autocast with fp32 weights and torch's fused AdamW:
non-padding tokens/s, MFU and the ratio.

MFU = model FLOPs / (seconds x peak), the same model FLOPs for both (the family's
flops_per_token: 6 x the matrix weights, attention over the keys each layer attends, local
layers at most the 128-token window, the MLM head on the masked share). bertcore's attention
is flash-attn's variable-length kernel when flash-attn is installed, else SDPA on the
sequences side by side (the line says which). The peak is bertcore.train.mfu's table
(H100/H200 bf16: 989e12) or --peak-flops.

    python benchmarks/gpu_modern.py                  # base, 1,024 tokens, 64k-token batches
    python benchmarks/gpu_modern.py --smoke          # tiny sizes; runs on a CPU too
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/modern.py: the batches
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project, when not installed

import numpy as np
import torch
import transformers

from bertcore.model.config import ModelConfig
from bertcore.model.modernbert import ModernBertForMaskedLM
from bertcore.model.unpadded import _flash_varlen
from bertcore.rng import keyed_numpy
from bertcore.train.config import PretrainConfig
from bertcore.train.mfu import peak_flops
from bertcore.train.packing import pack_batches
from modern import VOCAB, documents, packed_batch, same_masks, tokens_of


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base")
    parser.add_argument("--seq-len", type=int, default=1024, help="longest sequence (ModernBERT's first phase)")
    parser.add_argument("--token-budget", type=int, default=65_536, help="tokens per step")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-flops", type=float, default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps: checks the script on a CPU")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.size, args.seq_len, args.token_budget, args.warmup, args.steps = "tiny", 256, 2048, 1, 2
    return args


def main() -> None:
    args = arguments()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = ModelConfig.named(args.size, VOCAB, model_type="modernbert")
    ours = ModernBertForMaskedLM(cfg, torch.Generator().manual_seed(0)).to(device).train()
    hf_config = transformers.ModernBertConfig(**{**cfg.to_hf_config_dict("mlm"), "sparse_prediction": True})
    theirs = transformers.ModernBertForMaskedLM._from_config(hf_config, attn_implementation="sdpa")
    theirs.load_state_dict(ours.state_dict())
    theirs = theirs.to(device).train()
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizers = {
        "bertcore packed": torch.optim.AdamW(ours.parameters(), lr=1e-4, **fused),
        "transformers padded": torch.optim.AdamW(theirs.parameters(), lr=1e-4, **fused),
    }
    modules = {"bertcore packed": ours, "transformers padded": theirs}
    rng = keyed_numpy(0, "gpu-modern")
    seconds = dict.fromkeys(modules, 0.0)
    tokens = dict.fromkeys(modules, 0)
    flops = dict.fromkeys(modules, 0.0)
    for k in range(args.warmup + args.steps):
        docs = documents(rng, 4 * args.token_budget // args.seq_len + 8, args.seq_len // 8, args.seq_len)
        first = pack_batches(np.array([len(d) for d in docs]), args.token_budget)[0]
        packed = packed_batch([docs[i] for i in first], rng)
        batches = {"bertcore packed": packed, "transformers padded": same_masks(packed)}
        lengths = np.diff(packed["cu_seqlens"].numpy())
        attended = float((lengths**2).sum() / lengths.sum())
        masked = float((packed["labels"] != -100).float().mean())
        names = list(modules)[k % 2 :] + list(modules)[: k % 2]
        for name in names:
            batch = {key: value.to(device) for key, value in batches[name].items()}
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            optimizers[name].zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = modules[name](**batch).loss
            loss.backward()
            optimizers[name].step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if k >= args.warmup:
                seconds[name] += time.perf_counter() - started
                tokens[name] += tokens_of(batch)
                flops[name] += cfg.family.flops_per_token(cfg, attended, masked) * tokens_of(batch)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    peak = args.peak_flops or peak_flops(PretrainConfig(precision="bf16"), device_name)
    attention = "flash-attn varlen" if _flash_varlen() is not None and device.type == "cuda" else "SDPA side by side"
    print(
        f"modern family training, {args.size} ({cfg.num_hidden_layers} x {cfg.hidden_size}), {device_name or 'CPU'}, "
        f"bf16 autocast, sequences up to {args.seq_len}, {args.token_budget:,}-token steps; bertcore attention: "
        f"{attention}"
    )
    base = tokens["transformers padded"] / seconds["transformers padded"]
    figures = {}
    for name in modules:
        rate = tokens[name] / seconds[name]
        mfu = flops[name] / seconds[name] / peak if peak else None
        figures[name] = {"tokens_per_s": rate, "mfu": mfu, "ratio": rate / base}
        shown = f"{mfu:.1%}" if mfu is not None else "n/a (no peak)"
        print(f"{name:22s} {rate:12,.0f} non-pad tokens/s  MFU {shown:>14}  {rate / base:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name, "size": args.size, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
