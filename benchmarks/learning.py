"""What pretraining buys in a fixed CPU budget, with the baselines in the same run.

The `mini` BERT (4 layers, hidden 256) is pretrained on the demo corpus (configs/demo.yaml's
corpus, vocab and examples; seq128 only) by the pipeline's own pretrain stage (Ray Train,
DeepSpeed ZeRO-2, 2 workers) for `--budget-min` minutes. Then:

- the curve: held-out MLM accuracy (seq128 validation sequences, stored masks) at every
  checkpoint, beside the unigram baseline (always the most frequent training token) and
  the training MLM accuracy at the same steps (a gap means memorised, repeated data);
- the tasks: the demo's evaluate section (word similarity on SimLex-999 and WordSim-353,
  polarity fine-tuning with 5-fold cross-validation), pretrained against random init over
  3 seeds, with the majority-class and chance floors and one verdict per task;
- the path from pretraining to fine-tuning: exported weights against what fine-tuning
  loads, the tokenizer fine-tuning uses against the examples stage's, pair layout, the
  pooler, and how much held-out MLM accuracy the encoder keeps after fine-tuning.

    .venv/bin/python benchmarks/learning.py --budget-min 30     # the measurement, ~45 min in all
    .venv/bin/python benchmarks/learning.py --budget-min 3      # a quick look

The steps come from a short calibration run of the same stage (seconds per step), so the
learning-rate schedule ends with the budget; `pretrain.time_budget_s` stops it at the
budget in any case. Ray gets `--cpus` CPUs, one torch thread per worker and per
evaluation job, so the run does not oversubscribe the machine. Results go to
<root>/learning.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
CALIBRATION_STEPS = 20


def _config(root: str, args: argparse.Namespace, steps: int, budget_s: float | None):
    from pipelines.registry import load_config

    overrides = [
        f"run.root={root}",
        f"ray.num_cpus={args.cpus}",
        f"pretrain.model_size={args.size}",
        f"pretrain.phases=[{{name: seq128, steps: {steps}, batch_size: {args.batch_size}}}]",
        f"pretrain.learning_rate={args.lr}",
        "pretrain.warmup_fraction=0.05",
        "pretrain.torch_threads=1",
        f"pretrain.checkpoint_every={max(1, steps // args.points)}",
        "pretrain.keep_checkpoints=1000",
        "evaluate.num_threads=1",
    ]
    if budget_s is not None:
        overrides.append(f"pretrain.time_budget_s={budget_s}")
    return load_config(DEMO, overrides)


def _seconds_per_step(pretrain_dir: str) -> float:
    from bertcore.train.metrics_log import read_training_log

    with open(os.path.join(pretrain_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        records, _ = read_training_log(handle)
    times = [r["step_time_s"] for r in records[len(records) // 4 :] if isinstance(r.get("step_time_s"), (int, float))]
    return statistics.median(times)


def calibrate(root: str, args: argparse.Namespace) -> float:
    """Seconds per optimizer step of the pretrain stage on this machine, from a short run
    in <root>/calibration (sharing the upstream stages' outputs)."""
    from pipelines.runner import Pipeline

    scratch = os.path.join(root, "calibration")
    shutil.rmtree(scratch, ignore_errors=True)
    for stage in ("corpus", "vocab", "examples"):
        shutil.copytree(os.path.join(root, stage), os.path.join(scratch, stage))
    Pipeline(_config(scratch, args, CALIBRATION_STEPS, None)).run("pretrain")
    seconds = _seconds_per_step(os.path.join(scratch, "pretrain"))
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds


def curve(root: str, cfg, args: argparse.Namespace) -> list[dict]:
    """Held-out MLM accuracy and the unigram baseline at every complete checkpoint, with
    the training accuracy of the steps before it and the epochs over the examples."""
    import torch

    from bertcore.eval.baselines import target_counts
    from bertcore.eval.intrinsic import held_out_scores
    from bertcore.model.bert import BertForPreTraining, ModelConfig
    from bertcore.train.checkpoint import LocalStageFiles, checkpoint_tag, complete_checkpoints
    from bertcore.train.export import consolidate_checkpoint
    from bertcore.train.loader import ExamplesLoader
    from bertcore.train.metrics_log import read_training_log
    from bertcore.vocab.tokenizer import read_vocab
    from pipelines.shards import read_batches
    from pipelines.storage import Storage

    torch.set_num_threads(args.cpus)
    pretrain = os.path.join(root, "pretrain")
    with open(os.path.join(pretrain, "_manifest.json"), encoding="utf-8") as handle:
        model_cfg = ModelConfig.model_validate(json.load(handle)["stats"]["model_config"])
    with open(os.path.join(pretrain, "metrics.jsonl"), encoding="utf-8") as handle:
        records, _ = read_training_log(handle)
    vocab = read_vocab(os.path.join(root, "vocab", "vocab.txt"))
    specials = [i for i, t in enumerate(vocab) if t.startswith("[") and t.endswith("]")]
    storage = Storage(cfg.storage)
    train = sorted(glob.glob(os.path.join(root, "examples", "seq128", "train", "*.arrow")))
    counts = target_counts((b for path in train for b in read_batches(storage, path)), len(vocab), specials)
    validation = sorted(glob.glob(os.path.join(root, "examples", "seq128", "validation", "*.arrow")))
    points = []
    for marker in complete_checkpoints(LocalStageFiles(pretrain)):
        step = marker["step"]
        model = BertForPreTraining(model_cfg)
        model.load_state_dict(
            consolidate_checkpoint(os.path.join(pretrain, "checkpoints", checkpoint_tag(step)), model_cfg)
        )
        loader = ExamplesLoader(
            validation, 64, seed=1, pad_id=model_cfg.pad_token_id, shuffle=False, even_batches=False
        )
        scores = held_out_scores(model, loader, max_batches=args.eval_batches, unigram_counts=counts)
        recent = [
            r for r in records if step - 20 < r["step"] <= step and isinstance(r.get("mlm_accuracy"), (int, float))
        ]
        points.append(
            {
                "step": step,
                "held_out_mlm_accuracy": scores["mlm_accuracy"],
                "held_out_mlm_loss": scores["mlm_loss"],
                "unigram_accuracy": scores["baselines"]["unigram"]["mlm_accuracy"],
                "unigram_loss": scores["baselines"]["unigram"]["mlm_loss"],
                "train_mlm_accuracy": statistics.mean(r["mlm_accuracy"] for r in recent) if recent else None,
                "epoch": recent[-1].get("epoch") if recent else None,
                "minutes": sum(r.get("step_time_s") or 0.0 for r in records if r["step"] <= step) / 60,
            }
        )
        print(
            (
                f"  step {step:>6}: held-out MLM accuracy {100 * points[-1]['held_out_mlm_accuracy']:.1f}% "
                f"(unigram {100 * points[-1]['unigram_accuracy']:.1f}%)"
            ),
            flush=True,
        )
    return points


def diagnose(root: str, cfg, args: argparse.Namespace) -> dict:
    """Weights, tokenizer, pair layout and pooler on the way to fine-tuning, and the
    held-out MLM accuracy the encoder keeps after fine-tuning on polarity."""
    import torch
    from pyarrow import ipc

    from bertcore.eval import diagnostics, finetune
    from bertcore.train.loader import ExamplesLoader

    torch.set_num_threads(args.cpus)
    model_dir = os.path.join(root, "pretrain", "model")
    sentences = []
    for path in sorted(glob.glob(os.path.join(root, "corpus", "validation", "*.arrow"))):
        with ipc.open_file(path) as reader:
            sentences += [s for doc in reader.read_all().column("sentences").to_pylist() for s in doc]
    out = {
        "encoder_start": diagnostics.encoder_start(model_dir),
        "tokenizer": diagnostics.tokenizer_agreement(model_dir, os.path.join(root, "vocab"), sentences),
        "pair_layout": diagnostics.pair_layout(model_dir, sentences[0], sentences[1]),
        "mlm_after_fine_tuning": [],
    }
    validation = sorted(glob.glob(os.path.join(root, "examples", "seq128", "validation", "*.arrow")))

    def batches():
        return ExamplesLoader(validation, 64, seed=1, pad_id=0, shuffle=False, even_batches=False)

    before = diagnostics.mlm_scores_of_encoder(model_dir, None, batches(), args.eval_batches)["mlm_accuracy"]
    original = finetune.load_encoder(model_dir).state_dict()
    polarity = next(t for t in cfg.evaluate.tasks if t.type == "classification")
    for epochs in (polarity.epochs, 10 * polarity.epochs):
        task = polarity.model_copy(update={"epochs": epochs})
        state = finetune.fine_tuned_model(task, model_dir, model_dir, seed=1).encoder.state_dict()
        out["mlm_after_fine_tuning"].append(
            {
                "task": task.name,
                "epochs": epochs,
                "learning_rate": task.learning_rate,
                "mlm_accuracy_before": before,
                "mlm_accuracy_after": diagnostics.mlm_scores_of_encoder(model_dir, state, batches(), args.eval_batches)[
                    "mlm_accuracy"
                ],
                "relative_weight_change": diagnostics.relative_change(original, state),
            }
        )
    return out


def word2vec_reference(root: str, cfg, epochs: int = 20) -> dict:
    """How much word similarity the corpus holds at all: gensim's skip-gram word2vec (a
    far more sample-efficient learner of word vectors than MLM) trained on the same
    training documents, scored on the demo's word-similarity files (pairs whose words
    it has seen 5+ times)."""
    import re

    from gensim.models import Word2Vec
    from pyarrow import ipc

    from bertcore.eval import metrics
    from bertcore.eval.kinds.word_similarity import read_word_pairs

    sentences = []
    for path in sorted(glob.glob(os.path.join(root, "corpus", "train", "*.arrow"))):
        with ipc.open_file(path) as reader:
            sentences += [
                re.findall(r"\w+", s.lower()) for doc in reader.read_all().column("sentences").to_pylist() for s in doc
            ]
    model = Word2Vec(sentences, vector_size=128, window=5, min_count=5, sg=1, epochs=epochs, workers=1, seed=1)
    out = {"words": sum(map(len, sentences)), "epochs": epochs}
    for task in cfg.evaluate.tasks:
        if task.type != "word_similarity":
            continue
        pairs = read_word_pairs(task.validation, encoding=task.encoding).examples
        seen = [p for p in pairs if p.a.lower() in model.wv and p.b.lower() in model.wv]
        cosine = [float(model.wv.similarity(p.a.lower(), p.b.lower())) for p in seen]
        out[task.name] = {
            "pairs": len(seen),
            "of": len(pairs),
            "spearman": metrics.spearman(cosine, [p.score for p in seen]),
        }
    return out


def _print_summary(result: dict) -> None:
    print("\n== learning curve (seq128 held-out MLM accuracy; unigram baseline = always the most frequent token) ==")
    print(f"{'step':>7} {'minutes':>8} {'epoch':>6} {'held-out':>9} {'unigram':>8} {'train':>7}")
    for p in result["curve"]:
        train = "–" if p["train_mlm_accuracy"] is None else f"{100 * p['train_mlm_accuracy']:.1f}"
        print(
            f"{p['step']:>7} {p['minutes']:>8.1f} {p['epoch'] if p['epoch'] is not None else '–':>6} "
            f"{100 * p['held_out_mlm_accuracy']:>9.1f} {100 * p['unigram_accuracy']:>8.1f} {train:>7}"
        )
    print("\n== tasks: pretrained vs random init (median over seeds [min, max], x100) ==")
    for name, task in result["tasks"].items():
        metric = task["primary_metric"]
        cells = []
        for model in ("pretrained", "random_init"):
            s = (task.get(model) or {}).get("validation", {}).get(metric) or {}
            cells.append(
                f"{model} {100 * s.get('median', float('nan')):.1f} [{100 * s.get('min', float('nan')):.1f}, "
                f"{100 * s.get('max', float('nan')):.1f}]"
            )
        floors = task.get("baselines") or {}
        majority = ((floors.get("validation") or {}).get("majority") or {}).get(metric)
        floor = f", majority {100 * majority:.1f}" if majority is not None else ""
        chance = floors.get("chance", {}).get(metric)
        print(
            f"{name} ({metric}): {'; '.join(cells)}{floor}"
            + (f", chance {100 * chance:.1f}" if chance is not None else "")
        )
    w2v = result["word2vec"]
    scored = ", ".join(
        f"{k} {100 * v['spearman']:.1f} on {v['pairs']}/{v['of']} pairs" for k, v in w2v.items() if isinstance(v, dict)
    )
    print(f"reference: word2vec skip-gram, {w2v['epochs']} epochs over the same {w2v['words']:,} words: {scored}")
    print("\n== verdicts ==")
    for line in result["verdicts"]:
        print(f"- {line}")
    d = result["diagnostics"]
    print("\n== from pretraining to fine-tuning ==")
    print(
        f"encoder start vs exported weights: max |diff| {d['encoder_start']['max_abs_diff']} over "
        f"{d['encoder_start']['tensors']} tensors, fresh {d['encoder_start']['fresh']}, pooler "
        f"{d['encoder_start']['pooler']}"
    )
    print(
        f"tokenizer: {d['tokenizer']['identical']}/{d['tokenizer']['sentences']} held-out sentences "
        "tokenised identically by the model folder and the vocab stage"
    )
    print(f"pair layout: {d['pair_layout']}")
    for m in d["mlm_after_fine_tuning"]:
        print(
            f"after fine-tuning {m['task']} {m['epochs']} epochs at lr {m['learning_rate']}: held-out MLM accuracy "
            f"{100 * m['mlm_accuracy_before']:.1f}% -> {100 * m['mlm_accuracy_after']:.1f}%, encoder weights "
            f"moved {100 * m['relative_weight_change']:.1f}%"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-min", type=float, default=30.0, help="pretraining wall-clock budget in minutes")
    parser.add_argument("--size", default="mini", help="model size (tiny, mini, small, ...)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="global batch (sequences per step; 32 leaves the unigram plateau sooner than 64 for the same compute)",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs Ray may use (one torch thread per worker and job)")
    parser.add_argument("--points", type=int, default=8, help="checkpoints on the learning curve")
    parser.add_argument("--eval-batches", type=int, default=20, help="held-out batches of 64 sequences per curve point")
    parser.add_argument(
        "--root", default="runs/bench-learning", help="run root (corpus, vocab and examples are reused)"
    )
    args = parser.parse_args()

    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    root = os.path.abspath(args.root)
    started = time.perf_counter()
    base = _config(root, args, 1000, None)
    ensure_ray(base.ray)
    for stage in ("corpus", "vocab", "examples"):
        Pipeline(base).run(stage)
    seconds = calibrate(root, args)
    budget_s = 60 * args.budget_min
    steps = max(args.points, int(0.95 * budget_s / seconds))
    print(f"calibration: {seconds:.3f} s per step -> {steps} steps for {args.budget_min} minutes", flush=True)
    cfg = _config(root, args, steps, budget_s)
    pipeline = Pipeline(cfg)
    pipeline.run("pretrain")
    print("held-out curve:", flush=True)
    points = curve(root, cfg, args)
    pipeline.run("evaluate")
    with open(os.path.join(root, "eval", "metrics.json"), encoding="utf-8") as handle:
        metrics = json.load(handle)
    result = {
        "settings": vars(args) | {"steps": steps, "seconds_per_step": seconds},
        "curve": points,
        "tasks": metrics["tasks"],
        "intrinsic": metrics["intrinsic"],
        "embeddings": metrics.get("embeddings"),
        "verdicts": metrics["verdicts"],
        "diagnostics": diagnose(root, cfg, args),
        "word2vec": word2vec_reference(root, cfg),
        "total_minutes": (time.perf_counter() - started) / 60,
    }
    with open(os.path.join(root, "learning.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    _print_summary(result)
    print(
        f"\nreport: {os.path.join(root, 'eval', 'report.md')}; all figures: "
        f"{os.path.join(root, 'learning.json')}; {result['total_minutes']:.1f} minutes in all"
    )


if __name__ == "__main__":
    main()
