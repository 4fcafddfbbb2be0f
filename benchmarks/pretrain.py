"""Pretraining step throughput: bertcore's BertForPreTraining against transformers'
(with its "sdpa" and "eager" attention by default).

All models start from the same weights, see the same batches (sequence length 128 by
default, a BERT-like length mix, padded per batch to a multiple of 8), use AdamW and the
same number of torch threads, and run fp32 training steps (forward, backward, optimizer
step). Steps alternate between the models (who goes first rotates every round), warmup
rounds are not timed, and the figure is non-pad tokens per second.

    .venv/bin/python benchmarks/pretrain.py --size mini --threads 2
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers

from bertcore.model.bert import NAMED_SIZES, BertForPreTraining, ModelConfig, encoder_flops_per_token
from bertcore.rng import keyed_numpy

FIRST_REAL_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK] in a BERT vocabulary
CLS, SEP, MASK = 2, 3, 4


def sequence_lengths(rng: np.random.Generator, n: int, seq_len: int, short_prob: float = 0.1) -> np.ndarray:
    """Lengths like create_pretraining_data's output: most sequences fill the target
    (documents are packed up to max_seq_length, ending a few tokens short at a sentence
    boundary or a document end), `short_prob` of them draw a short target uniformly."""
    short = rng.random(n) < short_prob
    full = rng.integers(seq_len - 8, seq_len + 1, n)
    brief = rng.integers(8, seq_len + 1, n)
    return np.where(short, brief, full)


def make_batch(rng: np.random.Generator, batch_size: int, seq_len: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """One padded batch of `[CLS] A [SEP] B [SEP]` sequences with BERT's masking budget
    (15% of tokens, at most 20 per 128), labels -100 elsewhere, random NSP labels."""
    lengths = sequence_lengths(rng, batch_size, seq_len)
    width = int(-(-lengths.max() // 8) * 8)  # pad to a multiple of 8
    max_predictions = round(0.15 * seq_len)
    ids = np.zeros((batch_size, width), np.int64)
    types = np.zeros_like(ids)
    labels = np.full_like(ids, -100)
    for row, n in enumerate(lengths):
        sep_a = int(rng.integers(1, n - 2)) if n > 3 else 1
        ids[row, :n] = rng.integers(FIRST_REAL_ID, vocab_size, n)
        ids[row, [0, sep_a, n - 1]] = [CLS, SEP, SEP]
        types[row, sep_a + 1 : n] = 1
        candidates = np.setdiff1d(np.arange(1, n - 1), [sep_a])
        k = min(max_predictions, max(1, round(n * 0.15)), len(candidates))
        picked = rng.choice(candidates, k, replace=False)
        labels[row, picked] = ids[row, picked]
        ids[row, picked] = MASK
    mask = np.arange(width)[None, :] < lengths[:, None]
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        "labels": torch.from_numpy(labels),
        "next_sentence_label": torch.from_numpy(rng.integers(0, 2, batch_size)),
    }


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mini", choices=list(NAMED_SIZES))
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds per model")
    parser.add_argument("--steps", type=int, default=8, help="timed rounds per model")
    parser.add_argument(
        "--hf-attn",
        nargs="+",
        default=["sdpa", "eager"],
        choices=["sdpa", "eager"],
        help="transformers attn_implementation(s) to compare against",
    )
    parser.add_argument(
        "--attention-dropout",
        type=float,
        default=0.1,
        help="attention_probs_dropout_prob of both models (0 lets SDPA use its fused kernel)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    cfg = ModelConfig.named(args.size, args.vocab_size, attention_probs_dropout_prob=args.attention_dropout)
    ours = BertForPreTraining(cfg, torch.Generator().manual_seed(args.seed))
    hf_config = transformers.BertConfig(**cfg.to_hf_config_dict())
    models: dict[str, torch.nn.Module] = {"bertcore": ours}
    for attn in args.hf_attn:
        hf = transformers.BertForPreTraining._from_config(hf_config, attn_implementation=attn)
        hf.load_state_dict(ours.state_dict(), strict=True)
        models[f"transformers ({attn})"] = hf

    rounds = args.warmup + args.steps
    batches = [
        make_batch(keyed_numpy(args.seed, "bench", i), args.batch_size, args.seq_len, args.vocab_size)
        for i in range(rounds)
    ]

    start_losses = {}
    for name, model in models.items():
        model.eval()
        with torch.no_grad():
            start_losses[name] = model(**batches[0]).loss.item()
        model.train()

    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.01) for name, m in models.items()}
    seconds = dict.fromkeys(models, 0.0)
    tokens = 0
    for i, batch in enumerate(batches):
        order = list(models)[i % len(models) :] + list(models)[: i % len(models)]  # rotate who goes first
        for name in order:
            t0 = time.perf_counter()
            train_step(models[name], optimizers[name], batch)
            if i >= args.warmup:
                seconds[name] += time.perf_counter() - t0
        if i >= args.warmup:
            tokens += int(batch["attention_mask"].sum())

    padded = sum(b["attention_mask"].numel() for b in batches[args.warmup :])
    masked = sum(int((b["labels"] != -100).sum()) for b in batches[args.warmup :])
    width = np.mean([b["input_ids"].shape[1] for b in batches[args.warmup :]])
    flops_per_token = encoder_flops_per_token(cfg, int(width), masked_fraction=masked / padded)

    print(
        f"size {args.size}: {ours.num_parameters() / 1e6:.1f}M parameters, vocab {args.vocab_size}, "
        f"batch {args.batch_size} x seq {args.seq_len}, torch threads {args.threads}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, attention dropout {args.attention_dropout}"
    )
    print(
        f"timed steps {args.steps} per model after {args.warmup} warmup; non-pad tokens {tokens / padded:.1%} "
        f"of padded, masked {masked / padded:.1%}"
    )
    print("loss at start (eval, same weights): " + ", ".join(f"{n} {v:.4f}" for n, v in start_losses.items()))
    for name in models:
        ratio = "" if name == "bertcore" else f"   bertcore is {seconds[name] / seconds['bertcore']:.2f}x faster"
        print(
            f"{name:>22}: {tokens / seconds[name]:9.1f} non-pad tokens/s  "
            f"({seconds[name] / args.steps * 1e3:7.1f} ms/step){ratio}"
        )
    print(
        f"bertcore model FLOP rate (encoder + masked head, padded tokens): "
        f"{flops_per_token * padded / seconds['bertcore'] / 1e9:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    main()
