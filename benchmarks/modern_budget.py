"""Two training experiments of the modern family on the demo corpus, on CPU, each beside its
baseline in the same run, with the spread over seeds. Both read a run root of
configs/modernbert-demo.yaml (its corpus, vocab and examples stages done) and train in this
process with the pipeline's training loop (bertcore.train.trainer.Trainer, one worker).

    budget  the same wall-clock budget per run: the modern family's tiny shape (masked LM at
            30%) against BERT's tiny shape (masked LM at 15%), both on the recipe's packed
            sentences (seq128, no NSP), the same peak rate, warmup, then constant; held-out
            MLM accuracy at 15% on the same validation sequences with the same masks. The
            budget becomes each model's number of steps by its median step time, measured
            with the models alternating in the same run (on a shared machine the wall clock
            of one run against another's is noise).
    anneal  the domain anneal: one stable run on the corpus's Wikipedia documents (wsd
            schedule, its pre-decay checkpoint kept), then, per seed, its decay run on the
            news documents (annealed) against its decay run on more Wikipedia (not
            annealed), each from that checkpoint; held-out MLM accuracy at 15% on the news
            and on the Wikipedia validation documents, and the pre-decay model's.

    flock /tmp/bertpipe-bench.lock .venv/bin/python benchmarks/modern_budget.py budget --root runs/modernbert-demo
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from bertcore.eval.intrinsic import held_out_scores
from bertcore.examples.config import ExamplesConfig, PhaseConfig
from bertcore.examples.layout import examples_for_shard, records_to_table
from bertcore.examples.masking import VocabTables
from bertcore.examples.pairs import InMemoryDocs
from bertcore.train.checkpoint import CHECKPOINTS, PRE_DECAY, LocalStageFiles, checkpoint_tag, named_checkpoint
from bertcore.train.config import PretrainConfig
from bertcore.train.export import consolidate_checkpoint
from bertcore.train.loader import ExamplesLoader
from bertcore.train.objectives import Pretraining
from bertcore.train.phase_data import PhaseData
from bertcore.train.trainer import Trainer
from bertcore.vocab.tokenizer import load_tokenizer, vocab_list

PHASE = PhaseConfig(name="seq128", max_seq_length=128, max_predictions_per_seq=39)
EXAMPLES = ExamplesConfig(
    objective="roberta", phases=[PHASE], masking="dynamic", dupe_factor=1, short_seq_prob=0.0, length_bins=[64, 128]
)


def world_of_one() -> None:
    if not torch.distributed.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def corpus(root: Path, split: str) -> dict[str, list[list[str]]]:
    """The corpus stage's documents of `split`, by source (enwiki, lee-news)."""
    out: dict[str, list[list[str]]] = {}
    for path in sorted((root / "corpus" / split).glob("*.arrow")):
        table = ipc.open_file(pa.memory_map(str(path))).read_all()
        for source, sentences in zip(table.column("source").to_pylist(), table.column("sentences").to_pylist()):
            out.setdefault(source, []).append(sentences)
    return out


def write_examples(documents: list[list[str]], tokenizer, vocab: VocabTables, path: Path, seed: int) -> Path:
    """Packed-sentence examples (the recipe's seq128) of `documents`, in one shard."""
    encoded = tokenizer.encode_batch([s for d in documents for s in d], add_special_tokens=False)
    it = iter(encoded)
    docs = [[e.ids for e in (next(it) for _ in d) if e.ids] for d in documents]
    docs = [d for d in docs if d]
    records = list(examples_for_shard(list(range(len(docs))), InMemoryDocs(docs), EXAMPLES, PHASE, seed, vocab))
    path.parent.mkdir(parents=True, exist_ok=True)
    table = records_to_table(records, vocab.vocab_size)
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=500)
    return path


def phase_data(name: str, paths: list[Path], vocab: VocabTables, rate: float) -> PhaseData:
    mask = EXAMPLES.model_copy(update={"masked_lm_prob": rate}).mask_config(PHASE, vocab)
    return PhaseData(
        name=name,
        shards=[str(p) for p in paths],
        masking="dynamic",
        mask_config=mask,
        pad_id=vocab.special.pad,
        length_bins=[64, 128],
        token_types=False,
        vocab_size=vocab.vocab_size,
    )


def score(model, paths: list[Path], vocab: VocabTables) -> float:
    """Held-out MLM accuracy at 15%, the same masks for every model (a fixed seed)."""
    mask = EXAMPLES.model_copy(update={"masked_lm_prob": 0.15}).mask_config(PHASE, vocab)
    loader = ExamplesLoader(
        [str(p) for p in paths],
        32,
        seed=12345,
        masking="dynamic",
        mask_config=mask,
        pad_id=vocab.special.pad,
        token_types=False,
        shuffle=False,
        even_batches=False,
        vocab_size=vocab.vocab_size,
    )
    return held_out_scores(model.eval(), loader)["mlm_accuracy"]


def section(family: str, threads: int, **fields) -> PretrainConfig:
    base = dict(
        family=family,
        model_size="tiny",
        num_workers=1,
        learning_rate=2e-3,
        warmup_steps=None,
        checkpoint_every=10**6,
        keep_checkpoints=1,
        validation_batches=0,
        torch_threads=threads,
        log_every=10**6,
        model_overrides={"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if family == "bert" else {},
    )
    return PretrainConfig(**{**base, **fields})


def train(cfg: PretrainConfig, data: PhaseData, vocab: VocabTables, stage: Path, seed: int, key: str = "k"):
    model_cfg = cfg.build_model_config(vocab.vocab_size, vocab.special.pad)
    trainer = Trainer(cfg, Pretraining(model_cfg), [data], LocalStageFiles(str(stage)), seed=seed, resume_key=key)
    marker = trainer.run()
    return trainer.engine.module, marker


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.1%}"
    return f"{statistics.mean(values):.1%} ± {statistics.stdev(values):.1%}"


def table(rows, header) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def inputs(root: Path, work: Path):
    tokenizer = load_tokenizer(str(root / "vocab"))
    vocab = VocabTables.from_tokens(vocab_list(tokenizer))
    return tokenizer, vocab


MODELS = (("modernbert tiny, MLM 30%", "modernbert", 0.3), ("bert tiny, MLM 15%", "bert", 0.15))


def step_seconds(args, data: dict, vocab: VocabTables) -> dict[str, float]:
    """Each model's median seconds per training step (forward, backward, AdamW) on the
    loader's batches, the models alternating: the budget is turned into steps with them,
    so a shared machine's load spikes do not decide how far a run gets."""
    import time

    import numpy as np

    runs = {}
    for label, family, _ in MODELS:
        cfg = section(family, args.threads)
        model_cfg = cfg.build_model_config(vocab.vocab_size, vocab.special.pad)
        model = model_cfg.family.build(model_cfg, torch.Generator().manual_seed(0)).train()
        loader = ExamplesLoader(
            data[label].shards,
            32,
            seed=1,
            masking="dynamic",
            mask_config=data[label].mask_config,
            pad_id=vocab.special.pad,
            token_types=False,
            vocab_size=vocab.vocab_size,
        )
        runs[label] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), iter(loader), model_cfg.family)
    times: dict[str, list[float]] = {label: [] for label in runs}
    for k in range(args.calibration_steps + 2):
        for label, (model, optimizer, batches, family) in runs.items():
            batch = next(batches)
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(**{key: batch[key] for key in family.batch_keys if key in batch}).loss.backward()
            optimizer.step()
            if k >= 2:
                times[label].append(time.perf_counter() - started)
    return {label: float(np.median(t)) for label, t in times.items()}


def budget(args, root: Path, work: Path) -> None:
    tokenizer, vocab = inputs(root, work)
    train_docs = [d for docs in corpus(root, "train").values() for d in docs]
    held_docs = [d for docs in corpus(root, "validation").values() for d in docs]
    train_path = write_examples(train_docs, tokenizer, vocab, work / "all" / "train.arrow", 1)
    held_path = write_examples(held_docs, tokenizer, vocab, work / "all" / "validation.arrow", 2)
    data = {label: phase_data("seq128", [train_path], vocab, rate) for label, _, rate in MODELS}
    seconds = step_seconds(args, data, vocab)
    steps = {label: max(1, round(args.seconds / s)) for label, s in seconds.items()}
    schedule = {"kind": "wsd", "warmup_tokens": 5e4, "decay_tokens": 0, "total_tokens": 1e12}
    results: dict[str, list[tuple[float, int]]] = {}
    for seed in args.seeds:
        for label, family, _ in MODELS:
            phases = [{"name": "seq128", "steps": steps[label], "batch_size": 32, "max_seq_length": 128}]
            cfg = section(family, args.threads, schedule=schedule, phases=phases)
            model, marker = train(cfg, data[label], vocab, work / f"{family}-{seed}", seed)
            results.setdefault(label, []).append(
                (score(model, [held_path], vocab), marker["step"], marker["tokens_seen"])
            )
            print(f"  {label}, seed {seed}: {marker['step']} steps, held-out MLM at 15% {results[label][-1][0]:.1%}")
    print(
        f"same wall-clock budget ({args.seconds:.0f} s of training per run at each model's median step time, measured "
        f"alternately in this run: {', '.join(f'{label} {s:.3f} s' for label, s in seconds.items())}), "
        f"{args.threads} threads, demo corpus, seeds {args.seeds}: held-out MLM accuracy at 15% on "
        f"{len(held_docs)} validation documents"
    )
    base = statistics.mean(a for a, _, _ in results["bert tiny, MLM 15%"])
    table(
        [
            (
                label,
                spread([a for a, _, _ in runs]),
                f"{statistics.mean(s for _, s, _ in runs):.0f}",
                f"{statistics.mean(t for _, _, t in runs):,.0f}",
                f"{statistics.mean(a for a, _, _ in runs) - base:+.1%}",
            )
            for label, runs in results.items()
        ],
        ("model", "MLM acc @15% (mean ± sd)", "steps", "tokens", "vs bert tiny"),
    )


def anneal(args, root: Path, work: Path) -> None:
    tokenizer, vocab = inputs(root, work)
    train_docs, held_docs = corpus(root, "train"), corpus(root, "validation")
    general, domain = args.general, args.domain
    paths = {
        (name, split): write_examples(docs[name], tokenizer, vocab, work / name / f"{split}.arrow", 3)
        for split, docs in (("train", train_docs), ("validation", held_docs))
        for name in (general, domain)
    }
    total, decay = args.total_tokens, args.decay_tokens
    schedule = {"kind": "wsd", "warmup_tokens": 5e4, "decay_tokens": decay, "total_tokens": total, "decay": "1-sqrt"}
    steps = 10**6

    def cfg(name: str) -> PretrainConfig:
        phases = [{"name": name, "steps": steps, "batch_size": 32, "max_seq_length": 128}]
        return section("modernbert", args.threads, schedule=schedule, phases=phases, checkpoint_every=steps)

    stable = work / "stable"
    data = phase_data("general", [paths[general, "train"]], vocab, 0.3)
    train(cfg("general"), data, vocab, stable, seed=0, key="anneal")
    pre = named_checkpoint(LocalStageFiles(str(stable)), PRE_DECAY)
    tag = checkpoint_tag(pre["step"])
    model_cfg = cfg("general").build_model_config(vocab.vocab_size, vocab.special.pad)
    pre_model = model_cfg.family.build(model_cfg)
    pre_model.load_state_dict(consolidate_checkpoint(str(stable / CHECKPOINTS / tag), model_cfg))
    held = {name: [paths[name, "validation"]] for name in (domain, general)}
    rows = [("pre-decay (no decay)", *(f"{score(pre_model, held[n], vocab):.1%}" for n in (domain, general)))]
    for label, source in ((f"decay on {domain} (annealed)", domain), (f"decay on {general} (not annealed)", general)):
        scores = {domain: [], general: []}
        for seed in args.seeds:
            name = f"decay-{source}"
            model, marker = resume(
                cfg(name),
                phase_data(name, [paths[source, "train"]], vocab, 0.3),
                vocab,
                stable,
                work / f"{name}-{seed}",
                tag,
                seed=seed,
            )
            for n in scores:
                scores[n].append(score(model, held[n], vocab))
            print(f"  {label}, seed {seed}: to step {marker['step']}, {marker['tokens_seen']:,} tokens")
        rows.append((label, spread(scores[domain]), spread(scores[general])))
    print(
        f"domain anneal: stable on {general} to {total - decay:,.0f} tokens (pre-decay checkpoint at step "
        f"{pre['step']}), then a {decay:,.0f}-token 1-sqrt decay per seed {args.seeds}; held-out MLM accuracy at 15%"
    )
    table(rows, ("model", f"{domain} validation", f"{general} validation"))


def resume(cfg, data, vocab, stable: Path, stage: Path, tag: str, seed: int = 0):
    """A run started from the stable run's pre-decay checkpoint `tag` (copied into `stage`)
    on the data of `data` (its phase named otherwise, so its loader starts afresh), to the
    end of the schedule."""
    shutil.copytree(stable / CHECKPOINTS / tag, stage / CHECKPOINTS / tag)
    return train(cfg, data, vocab, stage, seed, key="anneal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("budget", "anneal"))
    parser.add_argument("--root", required=True, help="a run root of configs/modernbert-demo.yaml (corpus, vocab done)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=60.0, help="budget: training seconds per run")
    parser.add_argument("--calibration-steps", type=int, default=8, help="budget: timed steps per model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--general", default="enwiki")
    parser.add_argument("--domain", default="lee-news")
    parser.add_argument("--total-tokens", type=float, default=8e5, help="anneal: the schedule's token budget")
    parser.add_argument("--decay-tokens", type=float, default=2e5, help="anneal: the decay's tokens")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world_of_one()
    with tempfile.TemporaryDirectory(prefix="modern-budget-") as tmp:
        {"budget": budget, "anneal": anneal}[args.what](args, Path(args.root), Path(tmp))


if __name__ == "__main__":
    main()
