"""What an examples task reads from an object store, and what finished stages leave in it:
this checkout against a git ref (checked out beside it), on an s3:// run root served by a
moto server in this process.

For each code, in a fresh process with its own embedded Ray: the demo recipe's corpus (near
dedup on, cut into many shards by `--shard-chars`), vocab, then examples (seq128 only,
dupe_factor 1, one build task at a time, so the store's request log says which task read
what: each task ends with its unit marker). Printed for both, and their ratio:
- per training build task: the token shards it downloaded (most, mean) and their bytes,
  against the split's shards and bytes;
- token-shard bytes downloaded by the whole stage;
- token shards left in TMPDIR once the stage is done (each child has a TMPDIR of its own);
- per stage: its output (the manifest's shards) and the bytes beside it in the store
  outside the manifest and the resolved config, by folder, and their share of the output.

    python benchmarks/examples_reads.py [--baseline REF] [--shard-chars 100000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REF = "a3988bb"
"""main before issue 46's examples and scratch changes."""
BUCKET = "bench"
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "BERTPIPE_PROGRESS_INTERVAL_S": "30",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
STAGES = ("corpus", "vocab", "examples")

CHILD = """
import json, os, sys
from pathlib import Path
from pipelines.ray_runtime import ensure_ray
from pipelines.registry import load_config
from pipelines.runner import Pipeline

root, shard_chars = sys.argv[1], sys.argv[2]
cfg = load_config(Path("configs/demo.yaml"), [
    f"run.root={root}", "ray.num_cpus=2", "corpus.near_dedup=true", f"corpus.shard_chars={shard_chars}",
    "vocab.vocab_size=4000", "examples.dupe_factor=1",
    "examples.phases=[{name: seq128, max_seq_length: 128, max_predictions_per_seq: 20}]",
])
ensure_ray(cfg.ray)
pipeline = Pipeline(cfg)
out = {}
for name in ("corpus", "vocab", "examples"):
    manifest, _ = pipeline.run(name, parallelism=1 if name == "examples" else None)
    out[name] = {"shards": {s.path: s.bytes for s in manifest.shards}, "timings": manifest.timings}
left = [p for p in Path(os.environ["TMPDIR"]).glob("bertpipe-*/**/*") if p.is_file() and "_tokens" in p.parts]
out["tmp_tokens"] = [len(left), sum(p.stat().st_size for p in left)]
print("RESULT " + json.dumps(out))
"""


def record_requests(seen: list) -> None:
    """Append (method, /bucket/key, Content-Length) of every request the in-process moto server answers to `seen`."""
    from moto.moto_api import recorder

    original = recorder._record_request

    def record(request, body=None):
        length = request.headers.get("Content-Length")
        seen.append((request.method, unquote(request.path), int(length) if length else None))
        original(request, body)

    recorder._record_request = record


def run_code(name: str, code: Path, endpoint: str, shard_chars: int, seen: list) -> dict:
    prefix = f"{name}-{int(time.time())}"
    tmp = tempfile.mkdtemp(prefix=f"bp-{name[:4]}-", dir="/tmp")  # short: Ray's socket paths live under it
    start = len(seen)
    env = {**os.environ, **ENV, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(code), "TMPDIR": tmp}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, f"s3://{BUCKET}/{prefix}", str(shard_chars)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - began
    shutil.rmtree(tmp, ignore_errors=True)  # the child counted what it left there
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        sys.exit(f"{name}: the child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["seconds"] = seconds
    result["requests"] = seen[start:]
    result["prefix"] = f"/{BUCKET}/{prefix}/"
    result["listing"] = listing(endpoint, prefix)
    return result


def listing(endpoint: str, prefix: str) -> dict[str, int]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            found[item["Key"][len(prefix) + 1 :]] = item["Size"]
    return found


def task_reads(result: dict) -> dict:
    """Per training build task (in order): the token shards it downloaded, from the request log."""
    tokens = f"{result['prefix']}examples/_tokens/train/"
    sizes = {path: length for method, path, length in result["requests"] if method == "PUT" and path.startswith(tokens)}
    read, tasks, downloaded = set(), [], 0
    for method, path, _ in result["requests"]:
        if method == "GET" and "/examples/_tokens/" in path:
            downloaded += sizes.get(path, 0)
            if path.startswith(tokens):
                read.add(path)
        elif method == "PUT" and "/examples/_progress/build__seq128__train__" in path:
            tasks.append(read)
            read = set()
    per_task = [(len(shards), sum(sizes[p] for p in shards)) for shards in tasks]
    return {
        "split_shards": len(sizes),
        "split_bytes": sum(sizes.values()),
        "tasks": len(tasks),
        "most_shards": max(n for n, _ in per_task),
        "mean_shards": sum(n for n, _ in per_task) / len(per_task),
        "most_bytes": max(b for _, b in per_task),
        "mean_bytes": sum(b for _, b in per_task) / len(per_task),
        "downloaded": downloaded,
    }


def scratch(result: dict, stage: str) -> tuple[int, Counter]:
    shards = result[stage]["shards"]
    other: Counter = Counter()
    for key, size in result["listing"].items():
        folder, _, relative = key.partition("/")
        if folder == stage and relative not in shards and relative not in ("_manifest.json", "_config.yaml"):
            other[relative.split("/")[0]] += size
    return sum(shards.values()), other


def mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def report(results: dict[str, dict]) -> None:
    names = list(results)
    reads = {name: task_reads(r) for name, r in results.items()}
    print(f"\n| training build task reads | {' | '.join(names)} |" + (" new / old |" if len(names) == 2 else ""))
    print("|---|" + "---|" * (len(names) + (len(names) == 2)))
    rows = [
        ("token shards in the split", "split_shards", str),
        ("token bytes in the split", "split_bytes", mb),
        ("build tasks", "tasks", str),
        ("token shards one task read, most", "most_shards", str),
        ("token shards one task read, mean", "mean_shards", lambda v: f"{v:.1f}"),
        ("token bytes one task read, most", "most_bytes", mb),
        ("token bytes one task read, mean", "mean_bytes", mb),
        ("token bytes the stage downloaded", "downloaded", mb),
    ]
    for label, key, fmt in rows:
        values = [reads[name][key] for name in names]
        ratio = f" {values[0] / values[1]:.2f} |" if len(names) == 2 and values[1] and "shards in" not in label else ""
        print(f"| {label} | {' | '.join(fmt(v) for v in values)} |" + (ratio or (" |" if len(names) == 2 else "")))
    left = [f"{r['tmp_tokens'][0]} ({mb(r['tmp_tokens'][1])})" for r in results.values()]
    print(f"| token shards left in TMPDIR | {' | '.join(left)} |" + (" |" if len(names) == 2 else ""))
    print(f"\n| store beside the output | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for stage in STAGES:
        cells = []
        for r in results.values():
            output, other = scratch(r, stage)
            by = ", ".join(f"{k} {mb(v)}" for k, v in sorted(other.items())) or "nothing"
            cells.append(f"{mb(sum(other.values()))} of {mb(output)} = {sum(other.values()) / output:.1%} ({by})")
        print(f"| {stage} | {' | '.join(cells)} |")
    print(f"\n| timings | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for stage in STAGES:
        print(f"| {stage} | {' | '.join(json.dumps(r[stage]['timings']) for r in results.values())} |")
    seconds = [f"{r['seconds']:.1f} s" for r in results.values()]
    print(f"| whole child | {' | '.join(seconds)} |")


def baseline_checkout(workdir: Path, ref: str) -> Path | None:
    """The files of `ref` under `workdir` (`git archive`: the repository is only read)."""
    if not ref:
        return None
    target = workdir / f"baseline-{ref}"
    if not target.exists():
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--baseline", default=BASELINE_REF, help="git ref of the code to compare with ('' for none)")
    parser.add_argument("--shard-chars", type=int, default=100_000, help="corpus.shard_chars: how many shards")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bertpipe-reads-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = baseline_checkout(workdir, args.baseline)
    codes = {"bertpipe": ROOT, **({"baseline": baseline} if baseline else {})}
    print(
        f"# examples reads and store scratch · {time.strftime('%Y-%m-%d %H:%M')} · {os.cpu_count()} CPUs · load "
        f"{os.getloadavg()[0]:.1f} · baseline {args.baseline or 'none'} · shard_chars {args.shard_chars}",
        flush=True,
    )
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    seen: list = []
    record_requests(seen)
    try:
        results = {name: run_code(name, code, endpoint, args.shard_chars, seen) for name, code in codes.items()}
    finally:
        server.stop()
    report(results)


if __name__ == "__main__":
    main()
