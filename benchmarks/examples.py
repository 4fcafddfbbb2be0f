"""Examples stage throughput and memory against the raw tokenizer and the Hugging Face path.

Same input (the demo corpus, train + validation, and that corpus repeated 10 times), same
tokenizer (the vocab stage's tokenizer.json) and the same number of cores, three rows:

1. tokenizer  `Tokenizer.encode_batch` over every sentence (batches of 8192, no special
              tokens), in one process with the library's own threads: the speed ceiling
              the goal names;
   tokenizer_fast  the same with `encode_batch_fast` (no character offsets), which the
              stage itself calls: the true ceiling, printed for information;
2. bertpipe   the examples stage on an embedded local Ray with every CPU (`ray.num_cpus`):
              tokenize, NSP pairs, static masking, length-binned shards;
3. hf         what a user would run instead (transformers' run_mlm recipe): a `datasets`
              Dataset of the sentences, `map` with the same fast tokenizer
              (PreTrainedTokenizerFast, special tokens added per sentence) and then
              `group_texts` into blocks of the same length, both with num_proc = CPUs, then
              one pass of DataCollatorForLanguageModeling over all blocks in batches of 256.

Examples settings (like for like with row 3): the demo recipe with one phase seq128 (20
predictions), dupe_factor 1. tok/s/core = output tokens (nothing is padded in any row) /
wall seconds / CPUs. bertpipe emits more tokens than the corpus holds (a random B segment
is extra text, and the chunk's unused sentences are walked again, as in Google's code), so
"corpus tok/s/core" divides row 1's count (the corpus's tokens) by each row's time
instead: the rate at which each row consumes the same input. tok/CPU-s divides by the CPU
time (user + system) of the whole process tree instead of wall time x CPUs: the steadier
figure when other jobs share the machine.

Not timed: starting Ray, warming its workers' imports (as an earlier stage of the flow
would have) and waiting for its processes to settle; building the HF Dataset from the
shards; reading the sentences for row 1. Each row runs in a fresh process (with --trials
N, runs alternate between rows and inputs and the fastest of each is reported); memory
and CPU time are sampled every 0.1 s over the whole process tree (Ray's raylet, object
store and workers; datasets' pool) as in benchmarks/vocab.py: summed PSS, and the largest
RSS of any one process. --profile adds where the time of one shard's two tasks goes.

    python benchmarks/examples.py [--inputs 1,10] [--trials 1] [--workdir DIR] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks.vocab import (
    ENV,
    TreeUsage,
    corpus_sentences,
    demo_config,
    describe_tasks,
    measure,
    prepare_demo_corpus,
    repeat_corpus,
    run_stage_measured,
)

SEQ = 128
EXAMPLES = [
    "examples.dupe_factor=1",
    f"examples.phases=[{{name: seq{SEQ}, max_seq_length: {SEQ}, max_predictions_per_seq: 20}}]",
    # the recipe must name only phases examples makes
    f"pretrain.phases=[{{name: seq{SEQ}, steps: 300, batch_size: 32}}]",
]
ENCODE_BATCH = 8192
COLLATE_BATCH = 256
ROWS = ("tokenizer", "tokenizer_fast", "bertpipe", "hf")


def all_sentences(root: Path) -> list[str]:
    return [s for split in ("train", "validation") for doc in corpus_sentences(root, split) for s in doc]


# -- the three rows (each in a fresh process) -----------------------------------------------------


def run_tokenizer(root: Path, cpus: int, method: str = "encode_batch") -> dict:
    from bertcore.vocab.tokenizer import load_tokenizer

    tok = load_tokenizer(str(root / "vocab"))
    encode = getattr(tok, method)
    sentences = all_sentences(root)
    tokens = 0
    with TreeUsage() as memory:
        start = time.perf_counter()
        for i in range(0, len(sentences), ENCODE_BATCH):
            tokens += sum(len(e.ids) for e in encode(sentences[i : i + ENCODE_BATCH], add_special_tokens=False))
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, **memory.report()}


def run_bertpipe(root: Path, cpus: int) -> dict:

    manifest, measured = run_stage_measured("examples", demo_config(root, EXAMPLES))
    phase = manifest.stats["phases"][f"seq{SEQ}"]
    return {
        **measured,
        "tokens": sum(split["tokens"] for split in phase.values()),
        "sequences": sum(split["examples"] for split in phase.values()),
        "timings": manifest.timings,
    }


def hf_tokenizer(root: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(root / "vocab" / "tokenizer.json"),
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=1_000_000,  # sentences are grouped afterwards; no truncation warnings
    )


def group_texts(batch: dict[str, list[list[int]]]) -> dict[str, list[list[int]]]:
    """Concatenate the batch's token lists per column and cut them into SEQ-token blocks
    (the tail shorter than a block is dropped), as transformers' run_mlm does."""
    joined = {column: list(chain.from_iterable(lists)) for column, lists in batch.items()}
    usable = len(joined["input_ids"]) // SEQ * SEQ
    return {column: [ids[i : i + SEQ] for i in range(0, usable, SEQ)] for column, ids in joined.items()}


def run_hf(root: Path, cpus: int) -> dict:
    import torch
    from datasets import Dataset, disable_progress_bars
    from transformers import DataCollatorForLanguageModeling

    disable_progress_bars()
    tokenizer = hf_tokenizer(root)
    sentences = all_sentences(root)
    with tempfile.TemporaryDirectory(prefix="bertpipe-hf-") as cache:

        def rows():
            for s in sentences:
                yield {"text": s}

        dataset = Dataset.from_generator(rows, cache_dir=cache)
        sentences = None  # the Dataset holds the text now (on disk); free the list
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=0)
        tokens = 0
        with TreeUsage() as memory:
            start = time.perf_counter()
            tokenized = dataset.map(
                lambda batch: tokenizer(batch["text"], return_special_tokens_mask=True),
                batched=True,
                num_proc=cpus,
                remove_columns=["text"],
            )
            grouped = tokenized.map(group_texts, batched=True, num_proc=cpus)
            t_map = time.perf_counter() - start
            for i in range(0, len(grouped), COLLATE_BATCH):
                columns = grouped[i : i + COLLATE_BATCH]
                features = [dict(zip(columns, values)) for values in zip(*columns.values())]
                batch = collator(features)
                tokens += int(batch["attention_mask"].sum())
            seconds = time.perf_counter() - start
        assert batch["input_ids"].shape[1] == SEQ and isinstance(batch["labels"], torch.Tensor)
    return {
        "seconds": seconds,
        "tokens": tokens,
        "sequences": len(grouped),
        "timings": {"map_s": round(t_map, 3), "collate_s": round(seconds - t_map, 3)},
        **memory.report(),
    }


def child(row: str, root: str, cpus: int) -> None:
    rows = {
        "tokenizer": run_tokenizer,
        "tokenizer_fast": lambda root, cpus: run_tokenizer(root, cpus, "encode_batch_fast"),
        "bertpipe": run_bertpipe,
        "hf": run_hf,
    }
    result = rows[row](Path(root), cpus)
    print(json.dumps(result))


# -- inputs ---------------------------------------------------------------------------------------


def prepare(work: Path, repeats: list[int]) -> dict[int, Path]:
    """Demo corpus and its vocabulary under work/x1; work/xN: the corpus repeated N times
    (benchmarks/vocab.py's repeat_corpus) and a copy of the same vocabulary."""
    import ray

    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    x1 = work / "x1"
    prepare_demo_corpus(x1)
    cfg = demo_config(x1)
    ensure_ray(cfg.ray)
    Pipeline(cfg).run("vocab")
    ray.shutdown()
    roots = {1: x1}
    for n in repeats:
        if n == 1:
            continue
        roots[n] = work / f"x{n}"
        repeat_corpus(x1, roots[n], n)
        shutil.rmtree(roots[n] / "vocab", ignore_errors=True)
        shutil.copytree(x1 / "vocab", roots[n] / "vocab")
    return roots


def profile_tasks(root: Path, top: int = 15, repeats: int = 3) -> str:
    """Where a task's time goes, for corpus train shard 0, calling the plain functions behind
    the stage's two Ray tasks in this process: tokenize_shard, then build_shard (against the
    token shards the measured bertpipe run left under `root`); writes go to a scratch root.
    Each call is timed `repeats` times without a profiler (the least wall and CPU time is
    kept; CPU time counts the tokenizer's threads), next to the two encode calls alone on the same
    sentences, then profiled once with cProfile (which inflates Python-heavy code most)."""
    import numpy as np

    from bertcore.vocab.tokenizer import load_tokenizer
    from pipelines.stage_dir import Manifest, StageDir
    from pipelines.stages.examples import work as examples
    from pipelines.storage import Storage

    cfg = demo_config(root, EXAMPLES)
    storage = Storage(cfg.storage)
    corpus_manifest = Manifest.from_json(json.loads((root / "corpus" / "_manifest.json").read_text()))
    train = [s for s in corpus_manifest.shards if s.path.startswith("train/")]
    uris = [str(root / "examples" / "_tokens" / s.path) for s in train]
    index = examples.DocumentIndex(uris, np.concatenate([[0], np.cumsum([s.rows for s in train], dtype=np.int64)]))
    vocab_manifest = json.loads((root / "vocab" / "_manifest.json").read_text())
    vocab = examples.VocabSource(
        str(root / "vocab"), vocab_manifest["fingerprint"], tuple(s["path"] for s in vocab_manifest["shards"])
    )
    tokenizer = load_tokenizer(str(root / "vocab"))
    shard_sentences = [s for doc in corpus_sentences(root)[: train[0].rows] for s in doc]
    report = [
        (
            f"train shard 0: {train[0].rows} documents, {len(shard_sentences)} sentences; least of {repeats} "
            "plain runs, then one cProfile run"
        )
    ]
    with tempfile.TemporaryDirectory(prefix="bertpipe-profile-") as scratch:
        stage = StageDir(storage, scratch, "examples")
        attempt = iter(range(10**6))  # a new fingerprint per call, so no call finds the last one's output
        calls = {  # the plain functions behind the Ray tasks
            "encode_batch alone": lambda: tokenizer.encode_batch(shard_sentences, add_special_tokens=False),
            "encode_batch_fast alone": lambda: tokenizer.encode_batch_fast(shard_sentences, add_special_tokens=False),
            "tokenize_shard": lambda: examples.tokenize_shard._function(
                str(root / "corpus" / train[0].path),
                "_tokens/" + train[0].path,
                vocab,
                stage,
                f"profile{next(attempt)}",
            ),
            "build_shard": lambda: examples.build_shard._function(
                cfg.examples.phases[0],
                "train",
                0,
                index,
                cfg.examples,
                cfg.run.seed,
                vocab,
                stage,
                f"profile{next(attempt)}",
            ),
        }
        for name, call in calls.items():
            walls, cpus = [], []
            for _ in range(repeats):
                w, c = time.perf_counter(), time.process_time()
                call()
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
            report.append(f"{name}: {min(walls):.3f} s wall, {min(cpus):.3f} s CPU")
        for name in ("tokenize_shard", "build_shard"):
            profiler = cProfile.Profile()
            profiler.runcall(calls[name])
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
            report.append(f"cProfile {name}:" + out.getvalue().split("Ordered by: internal time", 1)[-1].rstrip())
    return "\n".join(report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", default="1,10", help="repeat factors of the demo corpus, comma-separated")
    parser.add_argument("--rows", default=",".join(ROWS), help="which rows to run")
    parser.add_argument("--trials", type=int, default=1, help="runs per row and input; the fastest is reported")
    parser.add_argument(
        "--workdir", type=Path, help="keep the runs here (reused by later runs); default: a temporary folder"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print a cProfile of one tokenize_shard and one build_shard call"
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    os.environ.update(ENV)
    repeats = [int(n) for n in args.inputs.split(",")]
    wanted = [r for r in ROWS if r in args.rows.split(",")]
    cpus = os.cpu_count() or 1

    with tempfile.TemporaryDirectory() as tmp:
        roots = prepare(args.workdir or Path(tmp), repeats)
        jobs = {(row, n): ["--child", row, str(roots[n]), str(cpus)] for n in repeats for row in wanted}
        results = measure(__file__, jobs, args.trials)
        for r in results.values():
            r["tokens_per_s_per_core"] = r["tokens"] / r["seconds"] / cpus

        print(f"examples: demo corpus (train + validation), seq{SEQ}, dupe_factor 1, {cpus} CPUs for every row")
        print("the fastest trial is shown; trials = wall s/CPU s@load average per trial")
        print(
            f"{'row':<14} {'input':>5} {'out tokens':>10} {'s':>6} {'CPU s':>6} {'tok/s/core':>11} {'tok/CPU-s':>10} "
            f"{'corpus tok/s/core':>18} {'corpus tok/CPU-s':>17} {'PSS peak MB':>12} {'RSS 1 proc MB':>14}  detail"
        )
        for (row, n), r in results.items():
            corpus = results.get(("tokenizer", n))
            rates = (
                (f"{corpus['tokens'] / r['seconds'] / cpus:,.0f}", f"{corpus['tokens'] / r['cpu_s']:,.0f}")
                if corpus
                else ("-", "-")
            )
            detail = " ".join(
                [f"trials={r['trials']}", *(f"{k}={v}" for k, v in r.get("timings", {}).items() if k != "total_s")]
            )
            if "idle_pss_mb" in r:
                detail += (
                    f" Ray_idle: PSS={r['idle_pss_mb']:.0f}MB CPU={r['idle_cpu_per_s']:.2f}s/s,"
                    f" CPU_s_less_idle={r['cpu_s'] - r['idle_cpu_per_s'] * r['seconds']:.1f}"
                )
            print(
                f"{row:<14} {'x' + str(n):>5} {r['tokens']:>10} {r['seconds']:6.1f} {r['cpu_s']:6.1f} "
                f"{r['tokens_per_s_per_core']:11,.0f} "
                f"{r['tokens'] / r['cpu_s']:10,.0f} {rates[0]:>18} {rates[1]:>17} {r['peak_pss_mb']:12.0f} "
                f"{r['peak_rss_one_mb']:14.0f}  {detail}"
            )
        for n in repeats:
            for other, goal in (("hf", ">= 2"), ("tokenizer", ">= 0.7"), ("tokenizer_fast", "none, for information")):
                if ("bertpipe", n) in results and (other, n) in results:
                    b, o = results[("bertpipe", n)], results[(other, n)]
                    print(
                        f"x{n} bertpipe / {other} (goal {goal}): out tok/s/core "
                        f"{b['tokens_per_s_per_core'] / o['tokens_per_s_per_core']:.2f}, "
                        f"out tok/CPU-s {b['tokens'] / b['cpu_s'] / (o['tokens'] / o['cpu_s']):.2f}, "
                        f"corpus tok/s/core {o['seconds'] / b['seconds']:.2f}, corpus tok/CPU-s "
                        f"{o['cpu_s'] / b['cpu_s']:.2f}"
                    )
        for (row, n), r in results.items():
            if "tasks" in r:
                print(
                    f"{row} x{n} Ray tasks (fastest trial; seconds after the stage started): "
                    f"{describe_tasks(r['tasks'])}"
                )
        if len(repeats) > 1:
            a, b = min(repeats), max(repeats)
            for row in wanted:
                ra, rb = results[(row, a)], results[(row, b)]
                line = (
                    f"peak memory growth x{a} -> x{b}, {row}: PSS all processes "
                    f"{rb['peak_pss_mb'] / ra['peak_pss_mb']:.2f}"
                )
                if "idle_pss_mb" in ra:
                    line += (
                        ", PSS above Ray idle "
                        f"{(rb['peak_pss_mb'] - rb['idle_pss_mb']) / (ra['peak_pss_mb'] - ra['idle_pss_mb']):.2f}"
                    )
                print(
                    line
                    + f", largest process RSS {rb['peak_rss_one_mb'] / ra['peak_rss_one_mb']:.2f}"
                    + (" (goal <= 1.2)" if row == "bertpipe" else "")
                )
        if args.profile:
            print(profile_tasks(roots[min(repeats)]))


if __name__ == "__main__":
    main()
