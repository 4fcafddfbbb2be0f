"""Load test of `bertpipe serve` against the service a user would write by hand, on
loopback only, bounded in requests and in time.

The model: a 3-layer student of all-MiniLM-L6-v2 (its embeddings and layers 1, 3, 5, as a
`from_teacher` distillation starts; speed does not depend on training), laid out in a
temporary run root as the distill stage leaves it and exported by `bertpipe export`'s
code to fused ONNX fp32 and int8. Three services, one at a time, each a subprocess:

    batched          `bertpipe serve --stage distill --format onnx --quantize int8`: Ray
                     Serve, dynamic batching (the serve: section's defaults)
    batching off     the same with serve.max_batch_requests=1: each request runs alone
    baseline         the same student in transformers fp32 behind a FastAPI handler
                     (uvicorn, one worker), one request at a time, as a user writes it

Clients: asyncio (aiohttp) in this process, a closed loop at concurrency 1, 8 and 64, each
request one text of 16 to 256 tokens (news sentences, lengths drawn uniformly with a keyed
RNG), POST /embed {"inputs": [text]}. Per level: untimed warm-up requests, then up to
--requests requests or --seconds seconds, whichever ends first. Figures: throughput (answered
requests per second) and latency p50/p95/p99, with every error counted. Goals:

- batched int8 student >= 4x the baseline's throughput at concurrency 64;
- its p95 at concurrency 8 < 2x its unloaded single-request latency (p50 at concurrency 1).

Then a replica is killed (SIGKILL, its pid from /info) while 8 clients keep sending, and
what they saw is printed: failed requests, how long until requests succeeded again and
until a new replica answered.

    .venv/bin/python benchmarks/serve.py            # the whole benchmark
    .venv/bin/python benchmarks/serve.py --quick    # a smoke run: few requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

from bertcore.rng import keyed_numpy  # noqa: E402

CONCURRENCY = (1, 8, 64)
TOKENS = (16, 256)
GOAL_THROUGHPUT, GOAL_P95 = 4.0, 2.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="most timed requests per service and concurrency")
    parser.add_argument("--seconds", type=float, default=45.0, help="most seconds per service and concurrency")
    parser.add_argument("--warmup", type=int, default=16, help="untimed requests before each level (at least the concurrency)")
    parser.add_argument("--texts", type=int, default=512, help="distinct texts the clients cycle through")
    parser.add_argument("--kill-seconds", type=float, default=30.0, help="length of the replica-kill phase (0: skip it)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 requests or 10 s per level, a 15 s kill phase")
    parser.add_argument("--baseline-server", metavar="FOLDER", help=argparse.SUPPRESS)  # internal: run the FastAPI baseline
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seconds, args.kill_seconds = 60, 10.0, 15.0
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
        return Manifest(stage=stage, code_version="benchmark", fingerprint=f"{stage}-benchmark", inputs={}, config={}, shards=shards, stats={}, timings={})

    distill = StageDir(storage, root, "distill")
    shards = [distill.publish_copy(f"model/{name}", os.path.join(folder, name), rows=0) for name in sorted(os.listdir(folder))]
    distill.write_manifest(manifest("distill", shards), "")
    corpus = StageDir(storage, root, "corpus")
    sentences = [line.strip() for line in open(sample_data.gensim_data_dir() / sample_data.NEWS_TEXT, encoding="utf-8") if line.strip()]
    table = pa.table({"doc_id": [f"d{i}" for i in range(len(sentences))], "source": ["news"] * len(sentences), "title": [""] * len(sentences), "sentences": [[s] for s in sentences]})
    corpus.write_manifest(manifest("corpus", [corpus.publish("validation/part-00000.arrow", lambda path: write_table(path, table), rows=len(sentences))]), "")
    data = {
        "run": {"root": root, "seed": 1}, "corpus": {"inputs": ["unused.txt"]},
        "evaluate": {"embeddings": {"max_seq_length": TOKENS[1]}},
    }
    recipe = os.path.join(tmp, "serve.yaml")
    with open(recipe, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    _, exported = export_onnx(parse_config(data), storage, stage="distill", int8=True, sentences=64)
    print(f"student: {'all-MiniLM-L6-v2' if real else 'RANDOM weights of all-MiniLM-L6-v2'}, layers 1, 3, 5 ({student.config.num_hidden_layers} x "
          f"{student.config.hidden_size}); ONNX export fused {exported.stats['fusions']}, int8 agreement {exported.stats['checks']['int8']['agreement']}", flush=True)
    return root, recipe, folder


def texts(folder: str, count: int) -> list[str]:
    """`count` news texts of 16 to 256 tokens (the student's tokenizer, special tokens
    included), lengths uniform, drawn with a keyed RNG."""
    from bertcore import sample_data
    from bertcore.eval.encoder import load_tokenizer

    tokenizer = load_tokenizer(folder)
    words = " ".join(line.strip() for line in open(sample_data.gensim_data_dir() / sample_data.NEWS_TEXT, encoding="utf-8")).split()
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


# -- services -------------------------------------------------------------------------------------


class Service:
    """A server subprocess on 127.0.0.1, stopped by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, command: list[str], port: int, ready: str | None):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        deadline = time.monotonic() + 600
        while not self._ready(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n" + "".join(self.lines)[-4000:])
            time.sleep(0.5)

    def _ready(self, line: str | None) -> bool:
        if line is not None:
            return any(out.startswith(line) for out in self.lines)
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def info(self) -> dict:
        with urllib.request.urlopen(self.url + "/info", timeout=10) as response:
            return json.load(response)

    def stop(self) -> None:
        import psutil

        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- clients --------------------------------------------------------------------------------------


async def load(url: str, pool: list[str], concurrency: int, requests: int, seconds: float, warmup: int) -> dict:
    """Closed-loop clients; returns the timed requests' figures."""
    import aiohttp

    records: list[tuple[float, float, str]] = []  # (sent, answered, outcome), seconds from the start
    counter = iter(range(10**9))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> str:
            try:
                async with session.post(url + "/embed", json={"inputs": [pool[i % len(pool)]]}) as response:
                    await response.read()
                    return str(response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return type(exc).__name__

        async def worker(stop_at: float, budget: int, keep: bool, origin: float) -> None:
            while time.perf_counter() < stop_at:
                i = next(counter)
                if i >= budget:
                    return
                sent = time.perf_counter()
                outcome = await one(i)
                if keep:
                    records.append((sent - origin, time.perf_counter() - origin, outcome))

        start = time.perf_counter()
        await asyncio.gather(*(worker(start + 120, max(warmup, concurrency), False, start) for _ in range(concurrency)))
        counter = iter(range(10**9))
        origin = time.perf_counter()
        await asyncio.gather(*(worker(origin + seconds, requests, True, origin) for _ in range(concurrency)))
    return figures(records)


def figures(records: list[tuple[float, float, str]]) -> dict:
    ok = [(sent, done) for sent, done, outcome in records if outcome == "200"]
    latency = np.array([done - sent for sent, done in ok]) * 1e3
    elapsed = max((done for _, done, _ in records), default=0.0)
    errors: dict[str, int] = {}
    for _, _, outcome in records:
        if outcome != "200":
            errors[outcome] = errors.get(outcome, 0) + 1
    return {
        "requests": len(records), "ok": len(ok), "errors": errors, "seconds": elapsed,
        "throughput": len(ok) / elapsed if elapsed else 0.0,
        **{f"p{q}": float(np.percentile(latency, q)) if len(latency) else float("nan") for q in (50, 95, 99)},
    }


async def kill_phase(service: Service, pool: list[str], seconds: float) -> dict:
    """8 clients for `seconds`; the replica is SIGKILLed after 3 s. What the clients saw."""
    import aiohttp

    before = service.info()["replica"]["pid"]
    records: list[tuple[float, float, str]] = []
    origin = time.perf_counter()
    killed_at: list[float] = []
    replaced_at: list[float] = []

    async def killer() -> None:
        await asyncio.sleep(3.0)
        os.kill(before, signal.SIGKILL)  # the replica: a descendant of the server this benchmark started
        killed_at.append(time.perf_counter() - origin)
        while time.perf_counter() - origin < seconds:
            await asyncio.sleep(0.25)
            try:
                pid = (await asyncio.to_thread(service.info))["replica"]["pid"]
            except OSError:
                continue
            if pid != before:
                replaced_at.append(time.perf_counter() - origin)
                return

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8), timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def worker(k: int) -> None:
            i = k
            while time.perf_counter() - origin < seconds:
                sent = time.perf_counter() - origin
                try:
                    async with session.post(service.url + "/embed", json={"inputs": [pool[i % len(pool)]]}) as response:
                        await response.read()
                        outcome = str(response.status)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    outcome = type(exc).__name__
                records.append((sent, time.perf_counter() - origin, outcome))
                i += 8
                if outcome != "200":
                    await asyncio.sleep(0.05)  # a client backs off a little after an error

        await asyncio.gather(killer(), *(worker(k) for k in range(8)))
    kill = killed_at[0]
    after = [r for r in records if r[0] >= kill or r[1] >= kill]
    failed = [r for r in after if r[2] != "200"]
    recovered = min((done for sent, done, outcome in records if outcome == "200" and sent > kill), default=None)
    return {
        "killed_at": kill, "replaced_at": replaced_at[0] if replaced_at else None, "first_success_after": recovered,
        "requests_after_kill": len(after), "failed": len(failed),
        "failures": {o: sum(1 for r in failed if r[2] == o) for o in sorted({r[2] for r in failed})},
        "longest_wait_s": max((done - sent for sent, done, _ in after), default=0.0),
    }


# -- the run --------------------------------------------------------------------------------------


def row(name: str, c: int, f: dict) -> str:
    errors = ", ".join(f"{n} {k}" for k, n in f["errors"].items()) or "0"
    return f"{name:<14} {c:>4} {f['ok']:>6} {f['seconds']:>6.1f} {f['throughput']:>9.1f} {f['p50']:>8.1f} {f['p95']:>8.1f} {f['p99']:>8.1f}  {errors}"


def verdict(what: str, value: float, goal: float, higher: bool) -> str:
    met = value >= goal if higher else value < goal
    return f"{what}: {value:.2f}x (goal {'>=' if higher else '<'} {goal}x): {'met' if met else 'NOT met'}"


def main() -> None:
    from importlib.metadata import version

    from inference import cpu_description

    args = parse_args()
    if args.baseline_server:
        baseline_server(args.baseline_server, args.port)
        return
    started = time.perf_counter()
    cpu, int8_dot = cpu_description()
    print(f"ray {version('ray')}, onnxruntime {version('onnxruntime')}, torch {version('torch')}; CPU: {cpu} ({len(os.sched_getaffinity(0))} cores; "
          f"int8 dot product: {', '.join(int8_dot) or 'none'}); load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    results: dict[str, dict[int, dict]] = {}
    kill = None
    with tempfile.TemporaryDirectory(prefix="bertpipe-serve-bench-") as tmp:
        root, recipe, folder = student_run(tmp)
        pool = texts(folder, args.texts)
        lengths = [len(t.split()) for t in pool]
        print(f"{len(pool)} texts of 16 to 256 tokens ({min(lengths)} to {max(lengths)} words); up to {args.requests} requests or {args.seconds:g} s "
              f"per level after {args.warmup} warm-up requests", flush=True)
        serve = [sys.executable, "-m", "flows.cli", "serve", "-c", recipe, "--stage", "distill", "--format", "onnx", "--quantize", "int8"]
        services = [
            ("baseline", lambda port: Service("baseline", [sys.executable, __file__, "--baseline-server", folder, "--port", str(port)], port, None)),
            ("batching off", lambda port: Service("batching off", [*serve, "--port", str(port), "--set", "serve.max_batch_requests=1"], port, "bertpipe serve:")),
            ("batched", lambda port: Service("batched", [*serve, "--port", str(port)], port, "bertpipe serve:")),
        ]
        print(f"\n{'service':<14} {'conc':>4} {'ok':>6} {'s':>6} {'req/s':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  errors", flush=True)
        for name, start in services:
            service = start(free_port())
            try:
                results[name] = {}
                for concurrency in CONCURRENCY:
                    results[name][concurrency] = asyncio.run(load(service.url, pool, concurrency, args.requests, args.seconds, max(args.warmup, concurrency)))
                    print(row(name, concurrency, results[name][concurrency]), flush=True)
                if name == "batched" and args.kill_seconds > 0:
                    kill = asyncio.run(kill_phase(service, pool, args.kill_seconds))
            finally:
                service.stop()
    base, batched = results["baseline"], results["batched"]
    print()
    print(verdict("batched int8 student, throughput at concurrency 64 against the baseline", batched[64]["throughput"] / base[64]["throughput"], GOAL_THROUGHPUT, True))
    print(verdict("batched int8 student, p95 at concurrency 8 against its unloaded latency (p50 at concurrency 1)", batched[8]["p95"] / batched[1]["p50"], GOAL_P95, False))
    off = results["batching off"]
    print(f"batching on against off, throughput at concurrency 64: {batched[64]['throughput'] / off[64]['throughput']:.2f}x; "
          f"at concurrency 8: {batched[8]['throughput'] / off[8]['throughput']:.2f}x")
    if kill is not None:
        recovered = f"{kill['first_success_after'] - kill['killed_at']:.1f} s" if kill["first_success_after"] else "never"
        replaced = f"{kill['replaced_at'] - kill['killed_at']:.1f} s" if kill["replaced_at"] else "not within the phase"
        print(f"replica killed (SIGKILL) under 8 clients: {kill['failed']} of {kill['requests_after_kill']} requests from then on failed "
              f"({', '.join(f'{n} {k}' for k, n in kill['failures'].items()) or 'none'}); the first success came {recovered} after the kill, "
              f"a new replica answered /info after {replaced}; the longest request took {kill['longest_wait_s']:.1f} s")
    print(f"\n{time.perf_counter() - started:.0f}s in all; load average {os.getloadavg()[0]:.2f} at the end (above the core count the timings are not for the record)")


if __name__ == "__main__":
    main()
