"""Load test of `bertpipe serve` in both its modes against the service a user would write
by hand and against the model's own rate, on loopback only, bounded in requests and time.

The model: a 3-layer student of all-MiniLM-L6-v2 (its embeddings and layers 1, 3, 5, as a
`from_teacher` distillation starts; speed does not depend on training), laid out in a
temporary run root as the distill stage leaves it and exported by `bertpipe export`'s
code to fused ONNX fp32 and int8. Measured in one run, one service at a time, each a
subprocess:

    ceiling          no HTTP: the same int8 student in the Engine the server runs, in this
                     process, on the same texts, 64 one-text requests per batch (what a
                     full batch at concurrency 64 holds); texts per second
    baseline         the same student in transformers fp32 behind a FastAPI handler
                     (uvicorn, one worker), one request at a time, as a user writes it
    in-process       `bertpipe serve --stage distill --format onnx --quantize int8`: one
                     uvicorn process, the serve: section's defaults (serve.batching auto:
                     batches only while batches measure cheaper per token)
    batching on      the same with serve.batching=on: every batch takes what is queued
    batching off     the same with serve.batching=off: each request runs alone
    Ray Serve x2     the same with --replicas 2: Ray Serve's proxy and two replicas of one
                     thread each

Clients: asyncio (aiohttp, uvloop) in this process, a closed loop at concurrency 1, 8 and
64, each request one text of 16 to 256 tokens (news sentences, lengths drawn uniformly
with a keyed RNG), POST /embed {"inputs": [text]}. Per level: untimed warm-up requests,
then up to --requests requests or --seconds seconds, whichever ends first. Figures:
throughput (answered requests per second), latency p50/p95/p99, every error counted, and
the CPU the clients themselves used (this process's CPU time over the level's wall time,
as a share of the machine's cores) and the server's (its process tree's). The clients
share the cores with the server, so a client-free figure is about the throughput divided
by (1 - the clients' share). Goals (the issue's), each printed met or NOT met:

- in-process int8 at concurrency 64: >= 0.7x the ceiling, and >= 4x the baseline;
- in-process p95 at concurrency 8 <= 2.5x its unloaded latency (p50 at concurrency 1);
- concurrency 1: batching costs <= 2 ms of p50 (in-process against batching off);
- the default is the fast setting: in-process (auto) at concurrency 8 and 64 >= 0.9x the
  faster of batching on and off (and what auto chose and measured, from /info).

Then a Ray Serve replica is killed (SIGKILL, its pid from /info) while 8 clients keep
sending, and what they saw is printed: failed requests, how long until requests succeeded
again and until a new replica answered.

    .venv/bin/python benchmarks/serve.py            # the whole benchmark
    .venv/bin/python benchmarks/serve.py --quick    # a smoke run: few requests
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project, when not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_clients, beside this file

from bertcore.rng import keyed_numpy
from serve_clients import Service, free_port, kill_phase, load, run_async

CONCURRENCY = (1, 8, 64)
TOKENS = (16, 256)
GOAL_BASELINE, GOAL_CEILING, GOAL_P95, GOAL_BATCHING_MS, GOAL_DEFAULT = 4.0, 0.7, 2.5, 2.0, 0.9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="most timed requests per service and concurrency")
    parser.add_argument("--seconds", type=float, default=45.0, help="most seconds per service and concurrency")
    parser.add_argument(
        "--warmup", type=int, default=16, help="untimed requests before each level (at least the concurrency)"
    )
    parser.add_argument("--texts", type=int, default=512, help="distinct texts the clients cycle through")
    parser.add_argument(
        "--kill-seconds", type=float, default=30.0, help="length of the replica-kill phase (0: skip it)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 100 requests or 8 s per level, a 12 s kill phase, 128 texts"
    )
    parser.add_argument(
        "--baseline-server", metavar="FOLDER", help=argparse.SUPPRESS
    )  # internal: run the FastAPI baseline
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seconds, args.kill_seconds, args.texts = 100, 8.0, 12.0, 128
    return args


# -- the baseline a user would write --------------------------------------------------------------


def baseline_server(folder: str, port: int) -> None:
    """transformers fp32 in a FastAPI handler: `async def`, so one request at a time."""
    import torch
    import uvicorn
    from fastapi import FastAPI
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/embed")
    async def embed(body: dict) -> dict:
        batch = tokenizer(body["inputs"], padding=True, truncation=True, max_length=TOKENS[1], return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state  # (B, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
        return {"embeddings": vectors.tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- the run root and the texts -------------------------------------------------------------------


def student_run(tmp: str) -> tuple[str, str, str]:
    """(run root, recipe, student folder): the student as the distill stage's model/, a
    corpus validation shard of news sentences, the fused ONNX fp32 and int8 export."""
    import pyarrow as pa
    import torch
    import yaml
    from transformers import BertModel

    from bertcore import sample_data
    from bertcore.config import StorageConfig
    from bertcore.eval.encoder import quiet_transformers
    from bertcore.vocab.tokenizer import TOKENIZER_FILES
    from inference import student_of, teacher_folder
    from pipelines.export.onnx import export_onnx
    from pipelines.registry import parse_config
    from pipelines.shards import write_table
    from pipelines.stage_dir import Manifest, StageDir
    from pipelines.storage import Storage

    teacher_dir, real = teacher_folder(os.path.join(tmp, "random-teacher"))
    with quiet_transformers():
        student = student_of(BertModel.from_pretrained(teacher_dir))
    folder = os.path.join(tmp, "student")
    student.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(teacher_dir, name)):
            shutil.copyfile(os.path.join(teacher_dir, name), os.path.join(folder, name))
    root, storage = os.path.join(tmp, "run"), Storage(StorageConfig())

    def manifest(stage: str, shards) -> Manifest:
        return Manifest(
            stage=stage,
            code_version="benchmark",
            fingerprint=f"{stage}-benchmark",
            inputs={},
            config={},
            shards=shards,
            stats={},
            timings={},
        )

    distill = StageDir(storage, root, "distill")
    shards = [
        distill.publish_copy(f"model/{name}", os.path.join(folder, name), rows=0) for name in sorted(os.listdir(folder))
    ]
    distill.write_manifest(manifest("distill", shards), "")
    corpus = StageDir(storage, root, "corpus")
    sentences = [
        line.strip()
        for line in open(sample_data.gensim_data_dir() / sample_data.NEWS_TEXT, encoding="utf-8")
        if line.strip()
    ]
    table = pa.table(
        {
            "doc_id": [f"d{i}" for i in range(len(sentences))],
            "source": ["news"] * len(sentences),
            "title": [""] * len(sentences),
            "sentences": [[s] for s in sentences],
        }
    )
    corpus.write_manifest(
        manifest(
            "corpus",
            [corpus.publish("validation/part-00000.arrow", lambda path: write_table(path, table), rows=len(sentences))],
        ),
        "",
    )
    data = {
        "run": {"root": root, "seed": 1},
        "corpus": {"inputs": ["unused.txt"]},
        "evaluate": {"embeddings": {"max_seq_length": TOKENS[1]}},
    }
    recipe = os.path.join(tmp, "serve.yaml")
    with open(recipe, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    _, exported = export_onnx(parse_config(data), storage, stage="distill", int8=True, sentences=64)
    print(
        f"student: {'all-MiniLM-L6-v2' if real else 'RANDOM weights of all-MiniLM-L6-v2'}, layers 1, 3, 5 "
        f"({student.config.num_hidden_layers} x "
        f"{student.config.hidden_size}); ONNX export fused {exported.stats['fusions']}, int8 agreement "
        f"{exported.stats['checks']['int8']['agreement']}",
        flush=True,
    )
    return root, recipe, folder


def texts(folder: str, count: int) -> list[str]:
    """`count` news texts of 16 to 256 tokens (the student's tokenizer, special tokens
    included), lengths uniform, drawn with a keyed RNG."""
    from bertcore import sample_data
    from bertcore.eval.encoder import load_tokenizer

    tokenizer = load_tokenizer(folder)
    words = " ".join(
        line.strip() for line in open(sample_data.gensim_data_dir() / sample_data.NEWS_TEXT, encoding="utf-8")
    ).split()
    rng = keyed_numpy(0, "serve-benchmark", "texts")
    out = []
    for target in rng.integers(TOKENS[0], TOKENS[1] + 1, size=count):
        start = int(rng.integers(0, len(words) - 400))
        end = start + max(1, int(target * 0.6))
        while len(tokenizer(" ".join(words[start:end]))["input_ids"]) < target and end < start + 400:
            end += 1
        text = " ".join(words[start:end])
        while len(tokenizer(text)["input_ids"]) > target:  # a long last word: drop it
            text = text.rsplit(" ", 1)[0]
        out.append(text)
    return out


# -- the ceiling: the model's own rate, no HTTP -----------------------------------------------------


def ceiling(recipe: str, pool: list[str], seconds: float) -> tuple[float, float]:
    """(texts per second, CPU milliseconds per text) of the Engine the server runs (int8
    student, every core), on the pool's texts in batches of 64 one-text requests."""
    from bertcore.config import StorageConfig
    from bertcore.inference.engine import Engine
    from bertcore.inference.validate import Job
    from pipelines.registry import load_config
    from pipelines.serve.source import resolve
    from pipelines.storage import Storage

    cfg = load_config(recipe)
    storage = Storage(StorageConfig())
    source = resolve(cfg, storage, stage="distill", task=None, fmt="onnx", quantize="int8")
    engine = Engine(source.engine_spec(storage, cfg.serve.max_batch_tokens, len(os.sched_getaffinity(0))))
    batches = [
        [Job("embed", (text,), pooling=source.pooling) for text in pool[i : i + 64]] for i in range(0, len(pool), 64)
    ]
    engine.run(batches[0])  # warm-up
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        for batch in batches:
            engine.run(batch)
            done += len(batch)
    return done / (time.perf_counter() - started), (time.process_time() - cpu) * 1e3 / done


# -- the run --------------------------------------------------------------------------------------


def row(name: str, c: int, f: dict) -> str:
    errors = ", ".join(f"{n} {k}" for k, n in f["errors"].items()) or "0"
    return (
        f"{name:<14} {c:>4} {f['ok']:>6} {f['seconds']:>6.1f} {f['throughput']:>9.1f} {f['p50']:>8.1f} "
        f"{f['p95']:>8.1f} {f['p99']:>8.1f} "
        f"{f['client_share']:>7.0%} {f['server_share']:>7.0%} {cpu_per_answer(f, 'server'):>7.1f} "
        f"{cpu_per_answer(f, 'client'):>7.1f}  {errors}"
    )


def cpu_per_answer(f: dict, who: str) -> float:
    """CPU milliseconds the server (or the clients) spent per answered request: a cost that
    does not depend on how much of a shared machine the run was given."""
    return f[f"{who}_share"] * len(os.sched_getaffinity(0)) * f["seconds"] * 1e3 / max(1, f["ok"])


def verdict(what: str, value: float, goal: float, higher: bool, unit: str = "x") -> str:
    met = value >= goal if higher else value <= goal
    return f"{what}: {value:.2f}{unit} (goal {'>=' if higher else '<='} {goal:g}{unit}): {'met' if met else 'NOT met'}"


def main() -> None:
    from importlib.metadata import version

    from inference import cpu_description

    args = parse_args()
    if args.baseline_server:
        baseline_server(args.baseline_server, args.port)
        return
    started = time.perf_counter()
    cpu, int8_dot = cpu_description()
    cores = len(os.sched_getaffinity(0))
    print(
        f"ray {version('ray')}, onnxruntime {version('onnxruntime')}, torch {version('torch')}, uvicorn "
        f"{version('uvicorn')}; CPU: {cpu} "
        f"({cores} cores; int8 dot product: {', '.join(int8_dot) or 'none'}); load average "
        f"{os.getloadavg()[0]:.2f} at the start",
        flush=True,
    )
    results: dict[str, dict[int, dict]] = {}
    kill = None
    with tempfile.TemporaryDirectory(prefix="bertpipe-serve-bench-") as tmp:
        root, recipe, folder = student_run(tmp)
        pool = texts(folder, args.texts)
        lengths = [len(t.split()) for t in pool]
        print(
            f"{len(pool)} texts of 16 to 256 tokens ({min(lengths)} to {max(lengths)} words); up to {args.requests} "
            f"requests or {args.seconds:g} s per level after {args.warmup} warm-up requests",
            flush=True,
        )
        top, top_cpu = ceiling(recipe, pool, min(args.seconds, 20.0))
        print(
            f"ceiling: the int8 student in the server's Engine, no HTTP, {cores} threads, 64 one-text requests "
            f"per batch: {top:.1f} texts/s, {top_cpu:.1f} CPU ms per text",
            flush=True,
        )
        serve = [
            sys.executable,
            "-m",
            "flows.cli",
            "serve",
            "-c",
            recipe,
            "--stage",
            "distill",
            "--format",
            "onnx",
            "--quantize",
            "int8",
        ]
        services = [
            (
                "baseline",
                lambda port: Service(
                    "baseline", [sys.executable, __file__, "--baseline-server", folder, "--port", str(port)], port, None
                ),
            ),
            ("in-process", lambda port: Service("in-process", [*serve, "--port", str(port)], port, "bertpipe serve:")),
            (
                "batching on",
                lambda port: Service(
                    "batching on", [*serve, "--port", str(port), "--set", "serve.batching=on"], port, "bertpipe serve:"
                ),
            ),
            (
                "batching off",
                lambda port: Service(
                    "batching off",
                    [*serve, "--port", str(port), "--set", "serve.batching=off"],
                    port,
                    "bertpipe serve:",
                ),
            ),
            (
                "Ray Serve x2",
                lambda port: Service(
                    "Ray Serve x2", [*serve, "--port", str(port), "--replicas", "2"], port, "bertpipe serve:"
                ),
            ),
        ]
        print(
            f"\n{'service':<14} {'conc':>4} {'ok':>6} {'s':>6} {'req/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
            f"{'p99 ms':>8} {'clients':>7} {'server':>7} {'srv ms':>7} {'cli ms':>7}  errors"
            "   (clients, server: CPU used, share of the machine; srv ms, cli ms: CPU ms per answer)",
            flush=True,
        )
        for name, start in services:
            service = start(free_port())
            try:
                results[name] = {}
                for concurrency in CONCURRENCY:
                    results[name][concurrency] = run_async(
                        load(service, pool, concurrency, args.requests, args.seconds, max(args.warmup, concurrency))
                    )
                    print(row(name, concurrency, results[name][concurrency]), flush=True)
                if name == "in-process":
                    chose = service.info()["batching"]
                    print(f"{'':<14} auto chose: {chose['now']}; measured {chose['measured']}", flush=True)
                if name == "Ray Serve x2" and args.kill_seconds > 0:
                    kill = run_async(kill_phase(service, pool, args.kill_seconds))
            finally:
                service.stop()
    base, served, on, off, ray2 = (
        results["baseline"],
        results["in-process"],
        results["batching on"],
        results["batching off"],
        results["Ray Serve x2"],
    )
    print()
    print(
        verdict(
            "in-process int8, throughput at concurrency 64 against the ceiling",
            served[64]["throughput"] / top,
            GOAL_CEILING,
            True,
        )
    )
    print(
        verdict(
            "in-process int8, throughput at concurrency 64 against the baseline",
            served[64]["throughput"] / base[64]["throughput"],
            GOAL_BASELINE,
            True,
        )
    )
    print(
        verdict(
            "in-process int8, p95 at concurrency 8 against its unloaded latency (p50 at concurrency 1)",
            served[8]["p95"] / served[1]["p50"],
            GOAL_P95,
            False,
        )
    )
    print(
        verdict(
            "concurrency 1: p50 with batching minus p50 without",
            served[1]["p50"] - off[1]["p50"],
            GOAL_BATCHING_MS,
            False,
            " ms",
        )
    )
    print(
        f"Ray Serve, 2 replicas, against in-process: {ray2[64]['throughput'] / served[64]['throughput']:.2f}x at "
        f"concurrency 64, {ray2[8]['throughput'] / served[8]['throughput']:.2f}x at 8, p50 at concurrency 1 "
        f"{ray2[1]['p50']:.1f} ms against {served[1]['p50']:.1f} ms"
    )
    print(
        f"batching on against off, throughput: {on[64]['throughput'] / off[64]['throughput']:.2f}x at concurrency "
        f"64, {on[8]['throughput'] / off[8]['throughput']:.2f}x at 8"
    )
    for c in (8, 64):
        print(
            f"the default (auto) at concurrency {c}: {served[c]['throughput'] / on[c]['throughput']:.2f}x batching on, "
            f"{served[c]['throughput'] / off[c]['throughput']:.2f}x batching off"
        )
        print(
            verdict(
                f"the default at concurrency {c} against the faster of on and off",
                served[c]["throughput"] / max(on[c]["throughput"], off[c]["throughput"]),
                GOAL_DEFAULT,
                True,
            )
        )
    share = served[64]["client_share"]
    print(
        f"the clients used {share:.0%} of the machine at concurrency 64 against the in-process server "
        f"({served[64]['server_share']:.0%} the server): "
        f"without them, about {served[64]['throughput'] / max(1e-6, 1 - share):.0f} req/s, "
        f"{served[64]['throughput'] / max(1e-6, 1 - share) / top:.2f}x the ceiling (an estimate: the server "
        f"given their CPU)"
    )
    cost = cpu_per_answer(served[64], "server") + cpu_per_answer(served[64], "client")
    print(
        f"CPU per answer at concurrency 64, in-process: server {cpu_per_answer(served[64], 'server'):.1f} ms + clients "
        f"{cpu_per_answer(served[64], 'client'):.1f} ms, against {top_cpu:.1f} ms per text for the model alone: on a "
        f"machine given wholly to it, throughput would be about {top_cpu / cost:.2f}x the ceiling and "
        f"{cpu_per_answer(base[64], 'server') / cost:.2f}x the baseline (CPU-bound estimates, independent of the "
        f"machine's other load)"
    )
    if kill is not None:
        recovered = (
            f"{kill['first_success_after'] - kill['killed_at']:.1f} s" if kill["first_success_after"] else "never"
        )
        replaced = f"{kill['replaced_at'] - kill['killed_at']:.1f} s" if kill["replaced_at"] else "not within the phase"
        print(
            f"Ray Serve: a replica killed (SIGKILL) under 8 clients: {kill['failed']} of "
            f"{kill['requests_after_kill']} requests from then on failed "
            f"({', '.join(f'{n} {k}' for k, n in kill['failures'].items()) or 'none'}); the first success came "
            f"{recovered} after the kill, "
            f"a new replica answered /info after {replaced}; the longest request took {kill['longest_wait_s']:.1f} s"
        )
    print(
        f"\n{time.perf_counter() - started:.0f}s in all; load average {os.getloadavg()[0]:.2f} at the end "
        f"(above the core count the timings are not for the record)"
    )


if __name__ == "__main__":
    main()
