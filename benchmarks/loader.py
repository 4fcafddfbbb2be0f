"""The training data loader alone: sequences and tokens per second per CPU core of
bertpipe's ExamplesLoader against the Hugging Face path on the same shards, and how many
loader cores one GPU needs.

Shards: the demo corpus and its vocabulary (the corpus and vocab stages, as
benchmarks/examples.py prepares them), turned into examples shards by the examples stage's
own code (bertcore.examples.layout, in this process) at seq128 and seq512, once with static masks
and once unmasked (for dynamic masking), every record batch grouped by length bin as the
stage writes them. --repeat N repeats the training documents N times (more batches per
epoch; the loader never sees a difference between a repeated and a new document).

Rows, each in this process with torch on one thread, for at least --seconds of CPU time:
- bertpipe: ExamplesLoader over the shards (length bins, shuffled, one process or
  --workers DataLoader workers): static masks, dynamic masking, dynamic whole-word masking.
- hf: `datasets.load_dataset("arrow", data_files=<the same shards>)`, with the columns a
  Hugging Face user would store derived once beforehand (not timed): token_type_ids,
  special_tokens_mask, and for static masks the labels, for whole words the offset mapping
  (from the `##` pieces); then a torch DataLoader (same batch size, shuffled, the same
  worker count) with transformers' collators: DataCollatorForTokenClassification (pads the
  stored labels) for static masks, DataCollatorForLanguageModeling for dynamic masking,
  with whole_word_mask=True for whole words (transformers 5 folded
  DataCollatorForWholeWordMask into it; it needs the offsets).
Per core = sequences (or non-pad tokens) / CPU seconds of this process and its DataLoader
workers. Batches hold --tokens-per-batch tokens (256 sequences at seq128, 64 at seq512).
Both loaders start their workers once per epoch: with --workers, give --repeat so an
epoch is long (the demo corpus makes about 35 batches at seq128).

Loader cores per GPU: the sequences per second one GPU consumes at 50% MFU, divided by the
loader's sequences per second per core for that masking. GPU demand, with every sequence
full (T tokens, the most a GPU can take):
    sequences/s = 0.5 * P / (T * F),  F = 6 N + 12 L H T + 6 (H^2 + V H) * 0.15
P = 989e12 FLOP/s (H100 dense bf16, bertcore/train/mfu.py), F = training FLOPs per token
(bertcore.model.bert.encoder_flops_per_token: N = L (4 H^2 + 2 H I) weights in the matrix
products, attention over T, the MLM head on 15% of tokens), V = 30522.

    python benchmarks/loader.py [--seconds 5] [--repeat 1] [--workers 0] [--workdir DIR]
    python benchmarks/loader.py --smoke   # seconds, to check the script works
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks.examples import hf_tokenizer, prepare
from benchmarks.vocab import ENV, corpus_sentences, demo_config

MODES = ("static", "dynamic", "dynamic-wwm")
MODELS = ("mini", "small", "base", "large")
MLM_SHARE = 0.15
VOCAB = 30522
GOAL_RATIO = 3.0


# -- shards -----------------------------------------------------------------------------------------


def build_shards(root: Path, out: Path, seq: int, masking: str, repeat: int) -> list[Path]:
    """Examples shards of the train split under `root`, per length bin, as the stage writes them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from bertcore.examples.config import length_bin
    from bertcore.examples.layout import arrow_schema, example_batches
    from bertcore.examples.masking import VocabTables
    from bertcore.examples.pairs import InMemoryDocs
    from bertcore.vocab.encode import encode_sentences
    from bertcore.vocab.tokenizer import load_tokenizer, vocab_list

    folder = out / f"seq{seq}-{masking}"
    done = folder / "done"
    if done.exists():
        return sorted(folder.glob("*.arrow"))
    folder.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(str(root / "vocab"))
    vocab = VocabTables.from_tokens(vocab_list(tok))
    documents = corpus_sentences(root, "train")
    sentences = [s for doc in documents for s in doc]
    bounds = np.concatenate([[0], np.cumsum([len(doc) for doc in documents])])
    values, lengths = encode_sentences(tok, sentences, bounds)
    cuts = np.concatenate([[0], np.cumsum(lengths)])
    docs = [
        [values[cuts[i] : cuts[i + 1]].tolist() for i in range(a, b) if lengths[i]]
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    docs = [d for d in docs if d] * repeat
    cfg = demo_config(
        root,
        [
            f"examples.masking={masking}",
            (
                f"examples.phases=[{{name: seq{seq}, max_seq_length: {seq}, max_predictions_per_seq: "
                f"{round(seq * MLM_SHARE)}}}]"
            ),
            f"pretrain.phases=[{{name: seq{seq}, steps: 10, batch_size: 32}}]",
        ],
    ).examples
    schema = arrow_schema(vocab.vocab_size)
    writers: dict[int, ipc.RecordBatchFileWriter] = {}
    for batch in example_batches(list(range(len(docs))), InMemoryDocs(docs), cfg, cfg.phases[0], 0, vocab):
        bins = length_bin(batch.column("length").to_numpy(), cfg.length_bins)
        for bin_ in np.unique(bins).tolist():
            if bin_ not in writers:
                writers[bin_] = ipc.new_file(str(folder / f"part-00000-len{bin_:03d}.arrow"), schema)
            writers[bin_].write_batch(batch.take(pa.array(np.flatnonzero(bins == bin_))))
    for writer in writers.values():
        writer.close()
    done.write_text("")
    return sorted(folder.glob("*.arrow"))


# -- the two loaders ---------------------------------------------------------------------------------


def bertpipe_batches(root: Path, paths: list[Path], mode: str, batch: int, workers: int):
    from bertcore.examples.config import ExamplesConfig
    from bertcore.examples.masking import VocabTables
    from bertcore.train.loader import ExamplesLoader
    from bertcore.vocab.tokenizer import load_tokenizer, vocab_list

    vocab = VocabTables.from_tokens(vocab_list(load_tokenizer(str(root / "vocab"))))
    cfg = ExamplesConfig(masking="static" if mode == "static" else "dynamic", whole_word_mask=mode == "dynamic-wwm")
    loader = ExamplesLoader(
        paths,
        batch,
        seed=0,
        length_bins=cfg.length_bins,
        masking=cfg.masking,
        mask_config=cfg.mask_config(cfg.phases[0], vocab),
        pad_id=vocab.special.pad,
        num_workers=workers,
    )
    while True:
        yield from loader


class _OffsetsFromPieces:
    """An offset mapping a tokenizer would have produced, from the `##` pieces: a piece
    continues the word before it (no gap), any other token starts a new one."""

    def __init__(self, tokens: list[str]):
        import numpy as np

        self.width = np.asarray([len(t) - 2 if t.startswith("##") else len(t) for t in tokens])
        self.gap = np.asarray([0 if t.startswith("##") else 1 for t in tokens])

    def __call__(self, ids: list[int]) -> list[list[int]]:
        import numpy as np

        ids = np.asarray(ids)
        ends = np.cumsum(self.width[ids] + self.gap[ids])
        return np.stack([ends - self.width[ids], ends], axis=1).tolist()


class _PaddedOffsets:
    """The tokenizer's pad() pads token lists but not the offset mapping, which whole-word
    masking needs as a tensor: pad it to the batch's longest record first, as a user must."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features: list[dict]) -> dict:
        longest = max(len(f["input_ids"]) for f in features)
        for f in features:
            f["offset_mapping"] = f["offset_mapping"] + [[0, 0]] * (longest - len(f["offset_mapping"]))
        return self.collator(features)


def hf_batches(root: Path, paths: list[Path], mode: str, batch: int, workers: int):
    """transformers' path over the same shards (see the module docstring)."""
    from datasets import disable_progress_bars, load_dataset
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForLanguageModeling, DataCollatorForTokenClassification

    disable_progress_bars()
    tokenizer = hf_tokenizer(root)
    specials = set(tokenizer.all_special_ids)
    offsets = _OffsetsFromPieces(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))

    def columns(rows: dict) -> dict:
        out = {"input_ids": rows["input_ids"], "next_sentence_label": rows["next_sentence_label"]}
        out["token_type_ids"] = [[0] * b + [1] * (n - b) for b, n in zip(rows["segment_b_start"], rows["length"])]
        out["special_tokens_mask"] = [[int(t in specials) for t in ids] for ids in rows["input_ids"]]
        if mode == "static":
            labels = []
            for ids, positions, masked in zip(rows["input_ids"], rows["masked_positions"], rows["masked_ids"]):
                row = [-100] * len(ids)
                for p, m in zip(positions, masked):
                    row[p] = m
                labels.append(row)
            out["labels"] = labels
            del out["special_tokens_mask"]
        if mode == "dynamic-wwm":
            out["offset_mapping"] = [offsets(ids) for ids in rows["input_ids"]]
        return out

    with tempfile.TemporaryDirectory(prefix="bertpipe-hf-") as cache:
        dataset = load_dataset("arrow", data_files=[str(p) for p in paths], split="train", cache_dir=cache)
        dataset = dataset.map(columns, batched=True, remove_columns=dataset.column_names)
        if mode == "static":
            collator = DataCollatorForTokenClassification(tokenizer)
        else:
            collator = DataCollatorForLanguageModeling(
                tokenizer, mlm_probability=MLM_SHARE, whole_word_mask=mode == "dynamic-wwm", seed=0
            )
        if mode == "dynamic-wwm":
            collator = _PaddedOffsets(collator)
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=collator)
        while True:
            yield from loader


# -- measuring ----------------------------------------------------------------------------------------


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(batches, seconds: float) -> dict:
    """Sequences and non-pad tokens per CPU-second (this process and reaped workers) over
    batches drawn until `seconds` of CPU have passed (the first batch is not timed)."""
    first = next(batches)
    assert first["input_ids"].shape == first["labels"].shape
    sequences = tokens = 0
    start, wall = _cpu(), time.perf_counter()
    for batch in batches:
        sequences += batch["input_ids"].shape[0]
        tokens += int(batch["attention_mask"].sum())
        if _cpu() - start >= seconds:
            break
    cpu = _cpu() - start
    return {
        "sequences": sequences,
        "tokens": tokens,
        "cpu_s": cpu,
        "wall_s": time.perf_counter() - wall,
        "seq_per_cpu_s": sequences / cpu,
        "tok_per_cpu_s": tokens / cpu,
    }


def gpu_sequences_per_s(size: str, seq: int) -> float:
    """Sequences per second one H100 consumes at 50% MFU, every sequence T tokens long."""
    from bertcore.model.bert import ModelConfig, encoder_flops_per_token
    from bertcore.train.mfu import PEAK_FLOPS

    flops = encoder_flops_per_token(ModelConfig.named(size, VOCAB), seq, MLM_SHARE)
    return 0.5 * PEAK_FLOPS[("H100", "bf16")] / (seq * flops)


def cores_per_gpu(results: dict, size: str, seq: int, mode: str, row: str = "bertpipe") -> float | None:
    measured = results.get((row, seq, mode))
    return None if measured is None else gpu_sequences_per_s(size, seq) / measured["seq_per_cpu_s"]


def figures(results: dict, seqs: list[int]) -> dict:
    """The measured rates and the loader cores per GPU, as JSON."""
    return {
        "rates": [{"row": row, "seq": seq, "masking": mode, **r} for (row, seq, mode), r in results.items()],
        "cores_per_gpu": [
            {
                "model": size,
                "seq": seq,
                "masking": mode,
                "gpu_sequences_per_s": gpu_sequences_per_s(size, seq),
                "bertpipe": cores_per_gpu(results, size, seq, mode),
                "hf": cores_per_gpu(results, size, seq, mode, "hf"),
            }
            for size in MODELS
            for seq in seqs
            for mode in MODES
        ],
    }


# -- report ---------------------------------------------------------------------------------------------


def report(results: dict, args, seqs: list[int]) -> None:
    workers = f"{args.workers} DataLoader workers" if args.workers else "no DataLoader workers (the main process)"
    print(
        f"\nloader throughput per CPU core, {workers}, {args.tokens_per_batch} tokens per batch, "
        f"at least {args.seconds:g} CPU-s per row (this process plus its workers)"
    )
    print(
        "| seq | masking | bertpipe seq/s/core | bertpipe tok/s/core | HF seq/s/core | HF tok/s/core | "
        "bertpipe / HF (goal >= 3) |"
    )
    print("|---|---|---|---|---|---|---|")
    for seq in seqs:
        for mode in MODES:
            b, h = results.get(("bertpipe", seq, mode)), results.get(("hf", seq, mode))
            if b is None:
                continue
            ratio = f"{b['seq_per_cpu_s'] / h['seq_per_cpu_s']:.1f}x" if h else "-"
            hf = (f"{h['seq_per_cpu_s']:,.0f}", f"{h['tok_per_cpu_s']:,.0f}") if h else ("-", "-")
            print(
                f"| {seq} | {mode} | {b['seq_per_cpu_s']:,.0f} | {b['tok_per_cpu_s']:,.0f} | {hf[0]} | "
                f"{hf[1]} | {ratio} |"
            )
    print(
        "\nloader cores one GPU needs: H100 at 50% MFU (sequences/s = 0.5 * 989e12 / (T * F), "
        "F = 6N + 12LHT + 6(H^2 + VH) * 0.15, every sequence full) / the loader's sequences/s per core; HF's "
        "in brackets"
    )
    print("| model | seq | GPU seq/s | " + " | ".join(f"cores, {m}" for m in MODES) + " |")
    print("|---|---|---|" + "---|" * len(MODES))
    for size in MODELS:
        for seq in seqs:
            need = gpu_sequences_per_s(size, seq)
            cells = []
            for mode in MODES:
                b, h = results.get(("bertpipe", seq, mode)), results.get(("hf", seq, mode))
                cell = "-" if b is None else f"{need / b['seq_per_cpu_s']:.2f}"
                if h is not None:
                    cell += f" ({need / h['seq_per_cpu_s']:.1f})"
                cells.append(cell)
            print(f"| BERT-{size} | {seq} | {need:,.0f} | " + " | ".join(cells) + " |")
    small = results.get(("bertpipe", 128, "dynamic-wwm"))
    if small:
        cores = gpu_sequences_per_s("small", 128) / small["seq_per_cpu_s"]
        print(
            f"\nBERT-small, seq128, dynamic whole-word masking: {cores:.2f} loader cores per GPU (goal <= 1): "
            + ("met" if cores <= 1 else "not met")
        )
    ratios = [
        results[("bertpipe", s, m)]["seq_per_cpu_s"] / results[("hf", s, m)]["seq_per_cpu_s"]
        for s in seqs
        for m in MODES
        if ("hf", s, m) in results and ("bertpipe", s, m) in results
    ]
    if ratios:
        print(
            f"bertpipe / HF per core: lowest {min(ratios):.1f}x over every row (goal >= {GOAL_RATIO:g}x): "
            + ("met" if min(ratios) >= GOAL_RATIO else "not met")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="CPU seconds per row")
    parser.add_argument("--repeat", type=int, default=1, help="repeat the training documents this many times")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes of both loaders")
    parser.add_argument("--tokens-per-batch", type=int, default=32768)
    parser.add_argument("--seqs", default="128,512")
    parser.add_argument("--rows", default="bertpipe,hf")
    parser.add_argument(
        "--workdir", type=Path, help="keep the corpus and shards here (reused); default: a temporary folder"
    )
    parser.add_argument(
        "--json", type=Path, help="also write the figures here (benchmarks/scale.py --loader-json reads them)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny: seq128 only, 0.5 s per row")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.seqs = 0.5, "128"
    os.environ.update(ENV)
    import torch

    torch.set_num_threads(1)
    seqs = [int(s) for s in args.seqs.split(",")]
    with tempfile.TemporaryDirectory(prefix="bertpipe-loader-") as tmp:
        work = args.workdir or Path(tmp)
        root = prepare(work, [1])[1]
        results = {}
        for seq in seqs:
            batch = max(1, args.tokens_per_batch // seq)
            for mode in MODES:
                paths = build_shards(
                    root, work / "shards", seq, "static" if mode == "static" else "dynamic", args.repeat
                )
                for row, make in (("bertpipe", bertpipe_batches), ("hf", hf_batches)):
                    if row not in args.rows.split(","):
                        continue
                    results[(row, seq, mode)] = measured = measure(
                        make(root, paths, mode, batch, args.workers), args.seconds
                    )
                    print(
                        f"{row} seq{seq} {mode}: {measured['seq_per_cpu_s']:,.0f} seq/CPU-s, "
                        f"{measured['tok_per_cpu_s']:,.0f} tok/CPU-s "
                        f"({measured['sequences']} sequences, {measured['cpu_s']:.1f} CPU-s, "
                        f"{measured['wall_s']:.1f} s)",
                        flush=True,
                    )
        report(results, args, seqs)
        if args.json:
            args.json.write_text(json.dumps(figures(results, seqs), indent=1))


if __name__ == "__main__":
    main()
