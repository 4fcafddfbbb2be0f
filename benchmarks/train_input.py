"""Data movement from the examples stage on, on an s3:// run root: bertpipe against the code
before "data moves only where it is needed" (a git ref, checked out beside it), on the same
synthetic corpus at 1x, 8x and 32x, in one run.

Store: a moto S3 server on 127.0.0.1 started here, behind a small WSGI layer that logs every
request it answers with its time and the bytes of its body. Input: `--docs` x scale distinct
documents (jsonl, local), each 5 to 40 sentences drawn from different articles of the
shipped enwiki sample (keyed, so both versions read the same bytes). Recipe: the demo's
(seq128 and seq512 examples, dupe_factor 2) with 30 pretraining steps of the tiny model on
2 Ray Train workers (ZeRO-2), `log_every` 1. Each version runs its own corpus, vocab and
examples stages under its own prefix, then pretraining, each in a fresh process with an
embedded Ray and its own TMPDIR (RAY_TMPDIR elsewhere, so only bertpipe's files count).

Printed per scale and version:
- peak local disk: the most bytes under the training run's TMPDIR (sampled every 0.3 s:
  the driver's and both workers' local files, one machine), all files and the examples
  shards (`.arrow`) among them; and the shard bytes left there after the run;
- loader memory per record: tracemalloc's peak while rank 0 of 2 builds its seq128 loader
  and takes 5 batches, over the phase's training records (`--loader` only reads; the
  version's own loader, on the version's own examples);
- driver bytes: examples shard bytes the server sent between the stage's start and the
  driver starting the workers (`_fit_once`), the driver's reads before any worker runs;
- to step 1: seconds from the stage's start to rank 0's first progress line (step 1), and
  how many of them the driver spent before it started the workers; with --trials N the
  training run is repeated and the fastest kept (every trial is printed);
- data wait: the share of step time rank 0 waited for its batches over steps 2 on, and its
  wait in step 1 (the first window) in seconds (metrics.jsonl; the old code records neither);
- GETs/shard: GET requests for seq128 training shards over the shards fetched (two ranks
  on one machine: 1.0 means one download per machine);
- scratch: bytes under the corpus, vocab and examples prefixes that are neither a shard of
  a manifest nor a manifest or resolved config, over those stages' published bytes.
Then the goals, and a projection to English Wikipedia with configs/bert-base.yaml and to
160 GB of text with configs/roberta-base.yaml and bert-base.yaml.

    python benchmarks/train_input.py [--docs 10000] [--scales 1,8,32] [--baseline a3988bb] [--trials 1] [--workdir DIR]
    python benchmarks/train_input.py --quick     # 1,000 documents at 1x and 2x: checks the script works
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--child" not in sys.argv:  # a child imports the code of the version it measures (PYTHONPATH)
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not an installed package

BUCKET = "bench"
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
STEPS = 30
# what the projection scales to (the figures for configs/bert-base.yaml on English
# Wikipedia: dupe_factor 10, seq128 and seq512, 330 bytes per seq128 record)
WIKI_EXAMPLES_GB = 250.0
WIKI_RECORDS = 409e6  # 17.6 GB of the old loader's index per rank at 43 bytes a record
TEXT_160_FACTOR = 8.0  # 160 GB of text gives about 2 TB of examples with the same recipe


# -- the store -------------------------------------------------------------------------------------


class RequestLog:
    """A moto S3 server on 127.0.0.1 whose answers are logged: (time, method, path, bytes)."""

    def __init__(self):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        from processes import free_port

        self.entries: list[tuple[float, str, str, int]] = []
        self._lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)

        def logged(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            body = app(environ, start_response)
            size = 0
            for chunk in body:
                size += len(chunk)
                yield chunk
            with self._lock:
                self.entries.append((time.time(), method, path, size))

        self.port = free_port()
        self.server = make_server("127.0.0.1", self.port, logged, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def between(self, start: float, end: float, method: str, pattern: str) -> list[tuple[str, int]]:
        rule = re.compile(pattern)
        with self._lock:
            return [(p, n) for t, m, p, n in self.entries if start <= t <= end and m == method and rule.search(p)]

    def stop(self) -> None:
        self.server.shutdown()


def client(url: str):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="us-east-1")


def objects(url: str, prefix: str) -> dict[str, int]:
    pages = client(url).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def scratch(url: str, prefix: str) -> tuple[int, int]:
    """(bytes outside published shards and manifests, published bytes) of the data stages."""
    listed = objects(url, prefix)
    extra = published = 0
    for stage in ("corpus", "vocab", "examples"):
        base = f"{prefix}{stage}/"
        manifest = json.loads(client(url).get_object(Bucket=BUCKET, Key=base + "_manifest.json")["Body"].read())
        shards = {base + s["path"] for s in manifest["shards"]} | {base + "_manifest.json", base + "_config.yaml"}
        for key, size in listed.items():
            if key.startswith(base):
                if key in shards:
                    published += size
                else:
                    extra += size
    return extra, published


# -- the input -----------------------------------------------------------------------------------


def documents(folder: Path, n: int) -> Path:
    """n distinct documents of 5 to 40 sentences from different articles (jsonl)."""
    from benchmarks.dedup import _article_sentences
    from bertcore.rng import keyed_random

    path = folder / f"docs-{n}.jsonl"
    if not path.exists():
        articles = _article_sentences()
        rng = keyed_random(0, "train-input", n)
        with open(path, "w", encoding="utf-8") as out:
            for d in range(n):
                picked = rng.sample(range(len(articles)), rng.randint(5, 40))
                text = " ".join(rng.choice(articles[a]) for a in picked)
                out.write(json.dumps({"key": f"doc-{d}", "text": text}) + "\n")
    return path


def overrides(root: str, corpus: Path) -> list[str]:
    return [
        f"run.root={root}",
        f"corpus.inputs=[{{uri: '{corpus}', format: jsonl, name: synthetic}}]",
        "pretrain.num_workers=2",
        f"pretrain.phases=[{{name: seq128, steps: {STEPS}, batch_size: 32}}]",
        f"pretrain.checkpoint_every={STEPS}",
        "pretrain.log_every=1",
        "pretrain.eval_every=null",
        "pretrain.validation_batches=2",
        "pretrain.warmup_fraction=0.1",
    ]


# -- children: one measured run each, in the version's own checkout ------------------------------


def child_data(root: str, corpus: str) -> dict:
    from pipelines.ray_runtime import ensure_ray
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline

    cfg = load_config(Path.cwd() / "configs" / "demo.yaml", overrides(root, Path(corpus)))
    ensure_ray(cfg.ray)
    pipeline = Pipeline(cfg)
    out = {}
    for name in ("corpus", "vocab", "examples"):
        manifest, _ = pipeline.run(name)
        out[name] = {"bytes": manifest.bytes, "rows": manifest.rows, "shards": len(manifest.shards)}
    examples = pipeline.dir("examples").manifest()
    seq128 = examples.shards_under("seq128/train/")
    out["seq128_train"] = {"bytes": sum(s.bytes for s in seq128), "rows": sum(s.rows for s in seq128)}
    return out


def child_train(root: str, corpus: str) -> dict:
    """Pretraining alone: stage start, workers start, first step, peak TMPDIR bytes."""
    import logging

    import pipelines.training.launch as launch
    from pipelines.registry import load_config
    from pipelines.runner import Pipeline

    tmp = tempfile.gettempdir()
    marks: dict[str, float] = {}
    peak = [0, 0]
    stop = threading.Event()

    def sizes() -> tuple[int, int]:
        """(bytes of every file under TMPDIR, of the examples shard copies among them)."""
        total = shards = 0
        for folder, _, files in os.walk(tmp):
            for name in files:
                try:
                    size = os.lstat(os.path.join(folder, name)).st_size
                except OSError:
                    continue
                total += size
                shards += size if name.endswith(".arrow") else 0
        return total, shards

    def sample() -> None:
        while not stop.is_set():
            total, shards = sizes()
            peak[0], peak[1] = max(peak[0], total), max(peak[1], shards)
            stop.wait(0.3)

    fit_once = launch._fit_once

    def marked(job):
        marks.setdefault("workers", time.time())
        return fit_once(job)

    launch._fit_once = marked

    class FirstStep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "step 1/" in record.getMessage() or "steps 1-" in record.getMessage():
                marks.setdefault("step1", time.time())

    logging.getLogger("pipelines.pretrain").addHandler(FirstStep())
    logging.getLogger("pipelines.pretrain").setLevel(logging.INFO)
    cfg = load_config(Path.cwd() / "configs" / "demo.yaml", overrides(root, Path(corpus)))
    pipeline = Pipeline(cfg)
    from pipelines.ray_runtime import ensure_ray

    ensure_ray(cfg.ray)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marks["start"] = time.time()
    manifest, _ = pipeline.run("pretrain", force=True)
    marks["end"] = time.time()
    stop.set()
    sampler.join()
    records = [json.loads(line) for line in pipeline.storage.read_text(f"{root}/pretrain/metrics.jsonl").splitlines()]
    waits = [r for r in records if r.get("data_wait_s") is not None and r["step"] > 1]
    share = sum(r["data_wait_s"] for r in waits) / sum(r["step_time_s"] for r in waits) if waits else None
    first = records[0].get("data_wait_s")
    return {
        **marks,
        "peak_disk": peak[0],
        "peak_shards": peak[1],
        "left_shards": sizes()[1],
        "data_wait": share,
        "first_wait": first,
        "steps": manifest.stats["steps"],
    }


def _settled(folder: str, quiet_s: float = 2.0) -> None:
    """Wait until no file under `folder` has changed size for `quiet_s` (downloads done)."""

    def size() -> int:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)

    last, since = size(), time.time()
    while time.time() - since < quiet_s:
        time.sleep(0.2)
        if (now := size()) != last:
            last, since = now, time.time()


def child_loader(root: str, corpus: str) -> dict:
    """Peak Python-allocated bytes (numpy included) of rank 0's seq128 loader of 2 ranks,
    built and 5 batches taken, as the version's training worker builds it; measured on a
    second loader once the first has fetched what it reads, so download buffers do not count."""
    import tracemalloc

    from pipelines.registry import load_config
    from pipelines.runner import Pipeline
    from pipelines.stage import Upstream
    from pipelines.training.launch import WorkerJob

    try:
        from pipelines.training.inputs import read_inputs
    except ImportError:  # the baseline's code: read_inputs lived in launch.py
        from pipelines.training.launch import read_inputs

    cfg = load_config(Path.cwd() / "configs" / "demo.yaml", overrides(root, Path(corpus)))
    pipeline = Pipeline(cfg)
    ups = {name: Upstream(pipeline.dir(name), pipeline.dir(name).manifest()) for name in ("examples", "vocab")}
    section, inputs = read_inputs(cfg.pretrain, ups["examples"], ups["vocab"], pipeline.storage)
    job = WorkerJob(section, None, cfg.run.seed, "bench", pipeline.storage, pipeline.dir("pretrain").uri, inputs)
    from bertcore.train.phase_data import WorkerContext, phase_loader

    data = job.phase_data()[0]  # the old code downloads every shard here (not measured: local disk is)
    first = phase_loader(section, data, section.phases[0], cfg.run.seed, WorkerContext(rank=0, world_size=2))
    for _, _ in zip(range(5), first):
        pass
    _settled(tempfile.gettempdir())
    tracemalloc.start()
    loader = phase_loader(section, data, section.phases[0], cfg.run.seed, WorkerContext(rank=0, world_size=2))
    for _, _ in zip(range(5), loader):
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    records = sum(getattr(s, "rows", 0) for s in ups["examples"].manifest.shards_under("seq128/train/"))
    return {"peak": peak, "records": records}


CHILDREN = {"data": child_data, "train": child_train, "loader": child_loader}


def run_child(code: Path, kind: str, root: str, corpus: Path, url: str, tmp: Path) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = dict(os.environ, PYTHONPATH=f"{code}:{ROOT / 'tests' / 'support'}", TMPDIR=str(tmp), RAY_TMPDIR=str(ray_tmp))
    env.update(ENV, AWS_ENDPOINT_URL=url)
    # from the code's own folder: Ray puts the driver's working directory first on its workers' path
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(code), root, str(corpus)],
        env=env,
        capture_output=True,
        text=True,
        cwd=code,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    if out.returncode != 0:
        sys.exit(f"{kind} with {code} at {root} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline_checkout(workdir: Path, ref: str) -> Path:
    target = workdir / f"baseline-{ref}"
    if not target.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(target), ref], check=True)
    return target


# -- the report ------------------------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def measure(code: Path, label: str, scale: int, corpus: Path, log: RequestLog, workdir: Path, trials: int) -> dict:
    """One version at one scale; the training run `trials` times (fresh TMPDIR each), the
    one that reached step 1 soonest kept (the least disturbed by other work)."""
    root = f"s3://{BUCKET}/{label}-{scale}x"
    prefix = f"{label}-{scale}x/"
    data = run_child(code, "data", root, corpus, log.url, workdir / "tmp" / f"{label}-{scale}-data")
    runs = [
        run_child(code, "train", root, corpus, log.url, workdir / "tmp" / f"{label}-{scale}-train-{k}")
        for k in range(trials)
    ]
    train = min(runs, key=lambda r: r["step1"] - r["start"])
    loader = run_child(code, "loader", root, corpus, log.url, workdir / "tmp" / f"{label}-{scale}-loader")
    driver = log.between(train["start"], train["workers"], "GET", rf"^/{BUCKET}/{re.escape(prefix)}examples/.*\.arrow$")
    gets = log.between(train["start"], train["end"], "GET", rf"^/{BUCKET}/{re.escape(prefix)}examples/seq128/train/")
    extra, published = scratch(log.url, prefix)
    return {
        "data": data,
        "peak_disk": train["peak_disk"],
        "peak_shards": train["peak_shards"],
        "left_shards": train["left_shards"],
        "first_wait": train["first_wait"],
        "loader_bytes_per_record": loader["peak"] / max(1, loader["records"]),
        "driver_bytes": sum(n for _, n in driver),
        "to_step1": train["step1"] - train["start"],
        "to_workers": train["workers"] - train["start"],
        "to_step1_trials": [round(r["step1"] - r["start"], 1) for r in runs],
        "data_wait": train["data_wait"],
        "gets_per_shard": len(gets) / max(1, len({p for p, _ in gets})),
        "scratch": extra / max(1, published),
        "scratch_bytes": extra,
    }


def report(results: dict, scales: list[int]) -> None:
    rows = [
        ("examples (seq128 train)", lambda r: mb(r["data"]["seq128_train"]["bytes"])),
        ("peak local disk, all files", lambda r: mb(r["peak_disk"])),
        ("peak local disk, examples shards", lambda r: mb(r["peak_shards"])),
        ("loader bytes/record", lambda r: f"{r['loader_bytes_per_record']:.1f}"),
        ("driver bytes before workers", lambda r: mb(r["driver_bytes"])),
        ("to step 1 (fastest of the trials)", lambda r: f"{r['to_step1']:.1f} s"),
        ("  of which the driver, before the workers", lambda r: f"{r['to_workers']:.1f} s"),
        ("  every trial", lambda r: " / ".join(f"{t:.1f}" for t in r["to_step1_trials"])),
        ("data wait, steps 2+", lambda r: "not recorded" if r["data_wait"] is None else f"{100 * r['data_wait']:.2f}%"),
        ("data wait, step 1", lambda r: "not recorded" if r["first_wait"] is None else f"{r['first_wait']:.2f} s"),
        ("GETs per seq128 shard", lambda r: f"{r['gets_per_shard']:.2f}"),
        ("store scratch / outputs", lambda r: f"{100 * r['scratch']:.1f}% ({mb(r['scratch_bytes'])})"),
        ("shard bytes left on local disk", lambda r: mb(r["left_shards"])),
    ]
    header = ["figure"] + [f"{v} {s}x" for s in scales for v in ("baseline", "bertpipe")]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, show in rows:
        cells = [show(results[(v, s)]) for s in scales for v in ("baseline", "bertpipe")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    lo, hi = min(scales), max(scales)
    new_lo, new_hi, old_hi = results[("bertpipe", lo)], results[("bertpipe", hi)], results[("baseline", hi)]
    examples_hi = new_hi["data"]["seq128_train"]["bytes"]
    goals = [
        (
            f"local disk at {hi}x within 2x of {lo}x plus the cache bound, and at most a quarter of the examples",
            new_hi["peak_shards"] <= 2 * new_lo["peak_shards"] + 4e9 and new_hi["peak_shards"] <= examples_hi / 4,
            (
                f"examples shards {mb(new_hi['peak_shards'])} vs {mb(new_lo['peak_shards'])} at {lo}x, all files "
                f"{mb(new_hi['peak_disk'])}; examples {mb(examples_hi)}"
            ),
        ),
        (
            "loader memory at most 4 bytes per record or flat",
            new_hi["loader_bytes_per_record"] <= 4
            or new_hi["loader_bytes_per_record"] * new_hi["data"]["seq128_train"]["rows"]
            <= 1.2 * new_lo["loader_bytes_per_record"] * new_lo["data"]["seq128_train"]["rows"],
            (
                f"{new_lo['loader_bytes_per_record']:.1f} -> {new_hi['loader_bytes_per_record']:.1f} bytes/record "
                f"(baseline {old_hi['loader_bytes_per_record']:.1f})"
            ),
        ),
        ("the driver reads no shard content before the workers start", new_hi["driver_bytes"] == 0, ""),
        (
            f"time to step 1 at {hi}x at most 1.5x of {lo}x",
            new_hi["to_step1"] <= 1.5 * new_lo["to_step1"],
            f"{new_hi['to_step1']:.1f} s vs {new_lo['to_step1']:.1f} s (baseline {old_hi['to_step1']:.1f} s)",
        ),
        (
            f"data wait at most 2% of step time at {lo}x (steps 2+; step 1 waits for the first window)",
            new_lo["data_wait"] is not None and new_lo["data_wait"] <= 0.02,
            f"{100 * (new_lo['data_wait'] or 0):.2f}%",
        ),
        ("scratch at most 5% of outputs", all(results[("bertpipe", s)]["scratch"] <= 0.05 for s in scales), ""),
    ]
    print("\nGoals:")
    for text, ok, detail in goals:
        print(f"- {text}: {'met' if ok else 'NOT met'}" + (f" ({detail})" if detail else ""))
    projection(new_hi, old_hi)


def projection(new: dict, old: dict) -> None:
    """English Wikipedia with configs/bert-base.yaml, and 160 GB of text, old and new."""
    from pipelines.registry import load_config

    print("\nProjection (per machine of 8 ranks; examples sizes from the issue's measurement of bert-base.yaml):")
    print("| corpus, recipe | examples | old: local disk / loader RAM per rank / driver reads | new: the same |")
    print("|---|---|---|---|")
    per_record_new = new["loader_bytes_per_record"] * new["data"]["seq128_train"]["rows"]  # flat: one window
    for name, recipe, factor in (
        ("English Wikipedia, bert-base.yaml", "bert-base.yaml", 1.0),
        ("160 GB of text, roberta-base.yaml", "roberta-base.yaml", TEXT_160_FACTOR),
        ("160 GB of text, bert-base.yaml", "bert-base.yaml", TEXT_160_FACTOR),
    ):
        cfg = load_config(ROOT / "configs" / recipe)
        examples_gb = WIKI_EXAMPLES_GB * factor
        records = WIKI_RECORDS * factor
        serial = examples_gb * 1e9 / 150e6  # 150 MB/s, one stream
        old_cells = (
            f"{examples_gb:,.0f} GB / {43 * records / 1e9:,.1f} GB / {examples_gb:,.0f} GB ({serial / 60:,.0f} min)"
        )
        new_cells = (
            f"<= {cfg.pretrain.data_cache_gb:g} GB (data_cache_gb) / about {per_record_new / 1e6:,.1f} MB (one window, "
            "flat) / 0 (one listing per 1,000 shards)"
        )
        print(f"| {name} | {examples_gb:,.0f} GB | {old_cells} | {new_cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--scales", default="1,8,32")
    parser.add_argument("--baseline", default="a3988bb")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=1, help="training runs per version and scale (fastest kept)")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "CODE", "ROOT", "CORPUS"))
    args = parser.parse_args()
    if args.child:
        kind, _, root, corpus = args.child
        print(json.dumps(CHILDREN[kind](root, corpus)))
        return
    if args.quick:
        args.docs, args.scales = 1_000, "1,2"
    scales = [int(s) for s in args.scales.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bertpipe-train-input-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    os.environ.update(ENV)
    baseline = baseline_checkout(workdir, args.baseline)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the request log is ours
    log = RequestLog()
    client(log.url).create_bucket(Bucket=BUCKET)
    results = {}
    try:
        for scale in scales:
            corpus = documents(workdir, args.docs * scale)
            for label, code in (("baseline", baseline), ("bertpipe", ROOT)):
                started = time.perf_counter()
                results[(label, scale)] = measure(code, label, scale, corpus, log, workdir, args.trials)
                print(f"{label} {scale}x: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        log.stop()
    print(f"\n{args.docs:,} documents at 1x; {STEPS} steps of the tiny model on 2 workers; baseline {args.baseline}\n")
    report(results, scales)


if __name__ == "__main__":
    main()
