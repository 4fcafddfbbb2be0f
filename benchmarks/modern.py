"""The modern encoder (bertcore/model/modernbert.py) on CPU, each figure beside its baseline
in the same run:

    throughput  training steps (forward, backward, AdamW) of bertcore's encoder on packed
                batches against transformers' ModernBertForMaskedLM (padded, SDPA, its
                sparse MLM head on: the cheapest setting it has) on the same records, from
                the same weights: non-padding tokens per second (goal: at least 1.2x)
    packing     the same documents in packed batches (bertcore/train/packing.py) against
                length-binned padded ones (the loader's Collator): padding share and
                non-padding tokens per second of bertcore's training step
    inference   forward passes on mixed lengths (the serve benchmark's mix: 16 to 256 tokens)
                unpadded (bertcore's encoder, padding removed before the embeddings) against
                padded (transformers', SDPA): tokens per second
    long        seconds per training step of one 8,192-token batch at 512, 2,048 and 8,192
                tokens a sequence, local/global attention (a global layer every third,
                window 128) against global attention everywhere

Models alternate step by step (who goes first rotates), warmup steps are not timed, all use
the same torch threads, and a figure is the median of the per-step rates. Synthetic ids
(timing does not depend on them), masked at 30%.

    flock /tmp/bertpipe-bench.lock .venv/bin/python benchmarks/modern.py throughput --size mini --threads 2
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers

from bertcore.examples.config import length_bin
from bertcore.model.config import ModelConfig
from bertcore.model.modernbert import ModernBertForMaskedLM
from bertcore.rng import keyed_numpy
from bertcore.train.packing import pack_batches, padding_share

VOCAB = 30_522
FIRST_REAL_ID, MASK = 5, 4


def documents(rng: np.random.Generator, n: int, low: int, high: int) -> list[np.ndarray]:
    """n id sequences of lengths uniform in [low, high]."""
    return [rng.integers(FIRST_REAL_ID, VOCAB, int(k)) for k in rng.integers(low, high + 1, n)]


def masked(rng: np.random.Generator, ids: np.ndarray, rate: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """(input ids with `rate` of the positions replaced by [MASK], labels -100 elsewhere)."""
    pick = rng.random(len(ids)) < rate
    labels = np.where(pick, ids, -100)
    return np.where(pick, MASK, ids), labels


def packed_batch(docs: list[np.ndarray], rng: np.random.Generator) -> dict[str, torch.Tensor]:
    pairs = [masked(rng, d) for d in docs]
    lengths = [len(d) for d in docs]
    return {
        "input_ids": torch.from_numpy(np.concatenate([p[0] for p in pairs]))[None],
        "labels": torch.from_numpy(np.concatenate([p[1] for p in pairs]))[None],
        "cu_seqlens": torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32),
        "max_seqlen": torch.tensor(max(lengths)),
    }


def padded_batch(docs: list[np.ndarray], rng: np.random.Generator, multiple: int = 8) -> dict[str, torch.Tensor]:
    width = math.ceil(max(len(d) for d in docs) / multiple) * multiple
    ids = np.zeros((len(docs), width), np.int64)
    labels = np.full_like(ids, -100)
    mask = np.zeros_like(ids)
    for row, d in enumerate(docs):
        ids[row, : len(d)], labels[row, : len(d)] = masked(rng, d)
        mask[row, : len(d)] = 1
    return {k: torch.from_numpy(v) for k, v in (("input_ids", ids), ("attention_mask", mask), ("labels", labels))}


def same_masks(packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The padded twin of a packed batch: the same records, ids and labels, padded to a multiple of 8."""
    cu = packed["cu_seqlens"].tolist()
    ids, labels = packed["input_ids"][0], packed["labels"][0]
    width = math.ceil(max(b - a for a, b in zip(cu, cu[1:])) / 8) * 8
    out = {
        "input_ids": torch.zeros(len(cu) - 1, width, dtype=torch.long),
        "attention_mask": torch.zeros(len(cu) - 1, width, dtype=torch.long),
        "labels": torch.full((len(cu) - 1, width), -100, dtype=torch.long),
    }
    for row, (a, b) in enumerate(zip(cu, cu[1:])):
        out["input_ids"][row, : b - a], out["labels"][row, : b - a] = ids[a:b], labels[a:b]
        out["attention_mask"][row, : b - a] = 1
    return out


def tokens_of(batch: dict[str, torch.Tensor]) -> int:
    return int(batch["cu_seqlens"][-1]) if "cu_seqlens" in batch else int(batch["attention_mask"].sum())


def step(model, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    optimizer.step()


def timed(runners: dict[str, tuple], batches: list[dict[str, dict]], warmup: int, train: bool) -> dict[str, float]:
    """{name: non-padding tokens per second} of each runner (model, optimizer or None) over
    `batches` ({name: batch} per step), the order rotating each step, the first `warmup`
    untimed: the median over the steps of each step's rate (a shared machine's load spikes
    hit single steps; the median leaves them out for every runner alike)."""
    rates: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for k, per_model in enumerate(batches):
        order = names[k % len(names) :] + names[: k % len(names)]
        for name in order:
            model, optimizer = runners[name]
            batch = per_model[name]
            started = time.perf_counter()
            if train:
                step(model, optimizer, batch)
            else:
                with torch.no_grad():
                    model(**batch)
            if k >= warmup:
                rates[name].append(tokens_of(batch) / (time.perf_counter() - started))
    return {name: float(np.median(values)) for name, values in rates.items()}


def models(size: str, **overrides):
    cfg = ModelConfig.named(size, VOCAB, model_type="modernbert", **overrides)
    ours = ModernBertForMaskedLM(cfg, torch.Generator().manual_seed(0))
    hf_config = transformers.ModernBertConfig(**{**cfg.to_hf_config_dict("mlm"), "sparse_prediction": True})
    theirs = transformers.ModernBertForMaskedLM._from_config(hf_config, attn_implementation="sdpa")
    theirs.load_state_dict(ours.state_dict())
    return cfg, ours, theirs


def table(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def throughput(args) -> None:
    rng = keyed_numpy(args.seed, "modern-bench", "throughput")
    cfg, ours, theirs = models(args.size)
    runners = {
        "bertcore packed": (ours.train(), torch.optim.AdamW(ours.parameters(), lr=1e-4)),
        "transformers padded (sdpa)": (theirs.train(), torch.optim.AdamW(theirs.parameters(), lr=1e-4)),
    }
    batches = []
    for _ in range(args.steps + args.warmup):
        docs = documents(rng, 10_000, args.min_length, args.max_length)
        first = pack_batches(np.array([len(d) for d in docs]), args.token_budget)[0]
        packed = packed_batch([docs[i] for i in first], rng)
        batches.append({"bertcore packed": packed, "transformers padded (sdpa)": same_masks(packed)})
    rates = timed(runners, batches, args.warmup, train=True)
    base = rates["transformers padded (sdpa)"]
    print(
        f"training throughput, {args.size} ({cfg.num_hidden_layers} layers x {cfg.hidden_size}), {args.threads} "
        f"threads, batches of up to {args.token_budget:,} tokens, sequences of {args.min_length}-{args.max_length}; "
        f"{args.steps} timed steps each"
    )
    table([(n, f"{r:,.0f}", f"{r / base:.2f}x") for n, r in rates.items()], ("model", "non-pad tokens/s", "ratio"))


def packing(args) -> None:
    rng = keyed_numpy(args.seed, "modern-bench", "packing")
    cfg = ModelConfig.named(args.size, VOCAB, model_type="modernbert")
    model = ModernBertForMaskedLM(cfg, torch.Generator().manual_seed(0)).train()
    docs = documents(rng, args.documents, args.min_length, args.max_length)
    lengths = np.array([len(d) for d in docs])
    packs = pack_batches(lengths, args.token_budget, rng)
    # the loader's length-binned batches: records of one bin, as many per batch as the budget holds at the bin's top
    bins = [32, 64, 128, 256, 512, 1024, 2048]
    binned = []
    of_bin = length_bin(lengths, [b for b in bins if b >= 0])
    for top in np.unique(of_bin):
        members = rng.permutation(np.flatnonzero(of_bin == top))
        per = max(1, args.token_budget // int(top))
        binned += [members[i : i + per] for i in range(0, len(members), per)]
    runners = {
        "packed": (model, torch.optim.AdamW(model.parameters(), lr=1e-4)),
        "length-binned padded": (model, torch.optim.AdamW(model.parameters(), lr=1e-4)),
    }
    steps = min(len(packs), len(binned), args.steps + args.warmup)
    order_p, order_b = rng.permutation(len(packs))[:steps], rng.permutation(len(binned))[:steps]
    batches = [
        {
            "packed": packed_batch([docs[i] for i in packs[p]], rng),
            "length-binned padded": padded_batch([docs[i] for i in binned[b]], rng),
        }
        for p, b in zip(order_p, order_b)
    ]
    rates = timed(runners, batches, args.warmup, train=True)
    share = {"packed": 0.0, "length-binned padded": padding_share(lengths, binned)}
    print(
        f"packed against length-binned batches of the same {len(docs):,} documents ({args.min_length}-"
        f"{args.max_length} tokens), budget {args.token_budget:,} tokens, bertcore {args.size}, {args.threads} threads"
    )
    base = rates["length-binned padded"]
    table(
        [(n, f"{share[n]:.1%}", f"{r:,.0f}", f"{r / base:.2f}x") for n, r in rates.items()],
        ("batches", "padding share", "non-pad tokens/s", "ratio"),
    )


def inference(args) -> None:
    rng = keyed_numpy(args.seed, "modern-bench", "inference")
    cfg, ours, theirs = models(args.size)
    ours.eval(), theirs.eval()

    class Encode(torch.nn.Module):  # the encoder's last hidden states: what serving computes
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, **batch):
            return self.fn(**{k: v for k, v in batch.items() if k != "labels"})

    runners = {
        "bertcore unpadded": (Encode(ours.encode), None),
        "transformers padded (sdpa)": (Encode(lambda **b: theirs.model(**b).last_hidden_state), None),
    }
    batches = []
    for _ in range(args.steps + args.warmup):
        docs = documents(rng, args.batch_size, 16, 256)
        padded = padded_batch(docs, rng)
        batches.append(dict.fromkeys(runners, padded))
    rates = timed(runners, batches, args.warmup, train=False)
    base = rates["transformers padded (sdpa)"]
    print(
        f"inference on mixed lengths (16-256 tokens, batches of {args.batch_size}, padded to the longest), "
        f"{args.size}, {args.threads} threads"
    )
    table([(n, f"{r:,.0f}", f"{r / base:.2f}x") for n, r in rates.items()], ("model", "real tokens/s", "ratio"))


def long(args) -> None:
    rng = keyed_numpy(args.seed, "modern-bench", "long")
    rows = []
    for length in (512, 2048, 8192):
        per = {}
        for label, every in (("local/global", 3), ("global everywhere", 1)):
            cfg = ModelConfig.named(args.size, VOCAB, model_type="modernbert", global_attn_every_n_layers=every)
            model = ModernBertForMaskedLM(cfg, torch.Generator().manual_seed(0)).train()
            per[label] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
        count = max(1, 8192 // length)
        batches = [
            {name: packed_batch(documents(rng, count, length, length), rng) for name in per}
            for _ in range(args.steps + args.warmup)
        ]
        rates = timed(per, batches, args.warmup, train=True)
        seconds = {name: 8192 / rate for name, rate in rates.items()}
        rows.append(
            (
                f"{length:,} x {count}",
                f"{seconds['local/global']:.3f}",
                f"{seconds['global everywhere']:.3f}",
                f"{seconds['global everywhere'] / seconds['local/global']:.2f}x",
            )
        )
    print(f"seconds per training step of 8,192 tokens, {args.size}, {args.threads} threads, window 128")
    table(rows, ("sequence x count", "local/global s", "global everywhere s", "speed-up"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("throughput", "packing", "inference", "long"))
    parser.add_argument("--size", default="mini", help="a modernbert named size (tiny, mini, small, base, large)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--token-budget", type=int, default=8192)
    parser.add_argument("--min-length", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    {"throughput": throughput, "packing": packing, "inference": inference, "long": long}[args.what](args)


if __name__ == "__main__":
    main()
