"""Whitespace words against Korean morphemes before WordPiece, on the Korean recipe.

configs/korean.yaml (konlpy's constitution and bills, the bundled review-sentiment task) is
run once per `vocab.pre_tokenizer` (whitespace, kiwi) on the same corpus output, with the
same seed and the same short pretraining, and each run's own figures are put side by side:

- the vocab stage's [UNK] rate and pieces per word on the corpus's validation sentences
  (words as BERT splits them, so both rows count the same words);
- held-out masked-LM accuracy and loss (evaluate's intrinsic score on the examples stage's
  validation sequences), beside the unigram floor of each vocabulary: the targets are
  each vocabulary's own pieces, so the two rows predict different things;
- korean-reviews accuracy (5-fold cross-validation) over the recipe's fine-tuning seeds:
  median [min, max] for the pretrained model and for random init of the same architecture,
  and the evaluate stage's verdict;
- for the morpheme vocabulary, how often its tokenizer.json alone (what AutoTokenizer
  loads, no analyser) gives the ids of the split on the corpus's validation sentences.

    .venv/bin/python benchmarks/korean_pretokenizer.py                  # tiny model, 150 steps
    .venv/bin/python benchmarks/korean_pretokenizer.py --steps 300      # the recipe's own length

The corpus stage runs once (under <root>/corpus) and is copied into <root>/whitespace and
<root>/kiwi, whose later stages run there. Results go to <root>/korean_pretokenizer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

KOREAN = Path(__file__).resolve().parents[1] / "configs" / "korean.yaml"
SPLITS = ("whitespace", "kiwi")


def _config(root: str, pre_tokenizer: str, args: argparse.Namespace):
    from pipelines.registry import load_config

    return load_config(
        KOREAN,
        [
            f"run.root={root}",
            f"run.seed={args.seed}",
            f"ray.num_cpus={args.cpus}",
            f"vocab.pre_tokenizer={pre_tokenizer}",
            f"pretrain.model_size={args.size}",
            f"pretrain.phases=[{{name: seq128, steps: {args.steps}, batch_size: 32}}]",
            "pretrain.torch_threads=1",
            f"pretrain.checkpoint_every={args.steps}",
            f"pretrain.eval_every={args.steps}",
            "evaluate.num_threads=1",
        ],
    )


def run_one(root: str, pre_tokenizer: str, args: argparse.Namespace) -> dict:
    """Every stage after the corpus for one pre-tokenizer; its figures."""
    from pipelines.runner import Pipeline

    here = os.path.join(root, pre_tokenizer)
    if not os.path.exists(os.path.join(here, "corpus")):
        shutil.copytree(os.path.join(root, "corpus"), os.path.join(here, "corpus"))
    pipeline = Pipeline(_config(here, pre_tokenizer, args))
    seconds = {}
    for stage in ("vocab", "examples", "pretrain", "evaluate"):
        started = time.perf_counter()
        pipeline.run(stage)
        seconds[stage] = round(time.perf_counter() - started, 1)
        print(f"{pre_tokenizer}: {stage} done in {seconds[stage]:.0f} s", flush=True)
    with open(os.path.join(here, "vocab", "_manifest.json"), encoding="utf-8") as handle:
        vocab = json.load(handle)["stats"]
    with open(os.path.join(here, "eval", "metrics.json"), encoding="utf-8") as handle:
        metrics = json.load(handle)
    intrinsic = metrics["intrinsic"]["seq128"]
    task = metrics["tasks"]["korean-reviews"]
    metric = task["primary_metric"]
    return {
        "pre_tokenizer": pre_tokenizer,
        "without_split": _agreement_without_split(here) if pre_tokenizer != "whitespace" else None,
        "vocab_size": vocab["vocab_size"],
        "unk_rate": vocab["unk_rate"],
        "pieces_per_word": vocab["pieces_per_word"],
        "mlm": {
            name: {k: intrinsic[name][k] for k in ("mlm_accuracy", "mlm_loss")}
            for name in ("pretrained", "random_init")
            if name in intrinsic
        },
        "unigram_accuracy": intrinsic["pretrained"]["baselines"]["unigram"]["mlm_accuracy"],
        "task": {
            "metric": metric,
            **{model: task[model]["validation"][metric] for model in ("pretrained", "random_init")},
            "verdict": task["verdict"]["text"],
        },
        "seconds": seconds,
    }


def _agreement_without_split(root: str) -> dict:
    """Validation sentences that tokenizer.json alone (BERT's pre-tokenizer, no analyser)
    turns into the same ids as the recorded morpheme split."""
    import glob

    from pyarrow import ipc
    from tokenizers import Tokenizer

    from bertcore.vocab.tokenizer import load_tokenizer

    sentences = []
    for path in sorted(glob.glob(os.path.join(root, "corpus", "validation", "*.arrow"))):
        with ipc.open_file(path) as reader:
            sentences += [s for doc in reader.read_all().column("sentences").to_pylist() for s in doc]
    split = load_tokenizer(os.path.join(root, "vocab"))
    plain = Tokenizer.from_file(os.path.join(root, "vocab", "tokenizer.json"))
    same = sum(a.ids == b.ids for a, b in zip(split.encode_batch(sentences), plain.encode_batch(sentences)))
    return {"sentences": len(sentences), "identical": same}


def _spread(s: dict) -> str:
    return f"{100 * s['median']:.1f} [{100 * s['min']:.1f}, {100 * s['max']:.1f}]"


def table(rows: list[dict], args: argparse.Namespace) -> list[str]:
    seeds = "/".join(str(s) for s in args.task_seeds)
    lines = [
        (
            "| pre-tokenizer | vocabulary | [UNK] rate | pieces/word | held-out MLM acc. (unigram floor) | held-out "
            f"MLM loss | korean-reviews acc., pretrained (seeds {seeds}) | random init | gain |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mlm = r["mlm"]["pretrained"]
        task = r["task"]
        gain = 100 * (task["pretrained"]["median"] - task["random_init"]["median"])
        lines.append(
            f"| {r['pre_tokenizer']} | {r['vocab_size']:,} | {100 * r['unk_rate']:.2f}% | {r['pieces_per_word']:.3f} "
            f"| {100 * mlm['mlm_accuracy']:.1f}% ({100 * r['unigram_accuracy']:.1f}%) | {mlm['mlm_loss']:.2f} "
            f"| {_spread(task['pretrained'])} | {_spread(task['random_init'])} | {gain:+.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--root",
        default="runs/bench-korean-pretokenizer",
        help="run root (the corpus is reused, later stages too when unchanged)",
    )
    parser.add_argument("--size", default="tiny", help="pretrain.model_size (tiny: 2 layers, hidden 128)")
    parser.add_argument(
        "--steps", type=int, default=150, help="pretraining steps of 32 sequences of 128 tokens, the same for both"
    )
    parser.add_argument("--seed", type=int, default=12345, help="run.seed, the same for both")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use (one torch thread per worker and job)")
    args = parser.parse_args()

    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    root = os.path.abspath(args.root)
    started = time.perf_counter()
    base = _config(root, "whitespace", args)
    args.task_seeds = next(t.seeds for t in base.evaluate.tasks if t.name == "korean-reviews")
    ensure_ray(base.ray)
    Pipeline(base).run("corpus")
    rows = [run_one(root, name, args) for name in SPLITS]
    result = {
        "settings": dict(vars(args)),
        "rows": rows,
        "minutes": (time.perf_counter() - started) / 60,
    }
    with open(os.path.join(root, "korean_pretokenizer.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2, ensure_ascii=False)
    print(
        f"\n== whitespace words against kiwi morphemes: configs/korean.yaml, {args.size} model, {args.steps} "
        f"steps, seed {args.seed} =="
    )
    for line in table(rows, args):
        print(line)
    print("held-out MLM: each row's own vocabulary and targets (morpheme pieces are not eojeol pieces).")
    for r in rows:
        if r["without_split"]:
            w = r["without_split"]
            print(
                f"{r['pre_tokenizer']}: tokenizer.json alone (AutoTokenizer, no analyser) gives the split's "
                f"ids for {w['identical']}/{w['sentences']} validation sentences"
            )
    for r in rows:
        print(f"{r['pre_tokenizer']}: {r['task']['verdict']}")
    print(f"\nall figures: {os.path.join(root, 'korean_pretokenizer.json')}; {result['minutes']:.1f} minutes in all")


if __name__ == "__main__":
    main()
