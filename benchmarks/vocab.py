"""Vocabulary stage: time and peak memory on the demo corpus and on it repeated 10 times.

The stage trains a 30522-entry WordPiece vocabulary (vocab.vocab_size=30522 over the demo
recipe) on each corpus.

The x10 corpus is the demo corpus stage's output with every shard written 10 times under new
part numbers and with new doc_ids, plus a manifest listing them (`repeat_corpus`). Running
the corpus stage on a 10x input instead would need a per-copy text change to get past exact
dedup, and would then no longer be the same text 10 times; copying shards keeps the text
byte-identical and the shard sizes equal to what the stage cuts (shard_chars), which is what
the vocab stage reads. What repetition cannot reproduce: a real corpus 10 times larger has
more distinct words (Heaps' law), and the trainer's merge phase scales with distinct words,
so the x10 row understates that part; the script prints the distinct-word estimate.

Each measured run is a fresh process (with --trials N, runs alternate between the inputs
and the fastest of each is reported) with its own embedded local Ray (`ray.num_cpus` =
this machine's CPUs). Not timed: Ray's start, its workers' first imports, and the wait
until Ray's processes have settled (below 0.1 CPU s per s). Memory is sampled every 0.1 s
over the whole process tree (driver, raylet with the object store, GCS, agents, workers):
the peak of the summed PSS (shared pages split between the processes that map them, so
the object store is counted once) and the largest peak RSS of any one process (the
training worker). CPU time is summed over the same tree.

Also timed, in one process without Ray: the two library calls the stage makes
(count_alphabet, train_wordpiece) on the same sentences, to show where the time goes.

    python benchmarks/vocab.py [--repeat 10] [--trials 1] [--workdir DIR] [--skip-library]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
VOCAB_SIZE = 30522
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}


# -- memory and CPU time of a process tree ---------------------------------------------------


@dataclass
class TreeUsage:
    """Peak memory and CPU time of this process and all its descendants, sampled in a thread.

    CPU time (user + system, summed over the processes) is the steadier measure on a shared
    machine: wall time stretches when other jobs take the cores, CPU time much less. A
    process that exits between two samples loses at most one interval of CPU time.

    The sampling itself costs: reading a process's PSS (/proc/PID/smaps_rollup) takes the
    kernel up to ~7 ms for a Ray worker, so summing PSS over a dozen processes every 0.1 s
    would take a fifth of a core from the run being measured, more for rows with more
    processes. So RSS and CPU times (cheap) are read every `interval_s`, PSS every
    `pss_every` samples (and at the start and the end), and the sampler thread's own CPU
    time is subtracted from `cpu_s`."""

    interval_s: float = 0.1
    pss_every: int = 5
    peak_pss_mb: float = 0.0
    """max over samples of the summed PSS of the tree"""
    peak_rss_one_mb: float = 0.0
    """max over samples and processes of one process's RSS"""
    peak_rss_driver_mb: float = 0.0
    peak_rss_worker_mb: float = 0.0
    """max over samples and Ray worker processes (ray::...) of one worker's RSS"""
    samples: int = 0
    sampler_cpu_s: float = 0.0
    _base_cpu: dict[int, float] = field(default_factory=dict, repr=False)
    _workers: dict[int, bool] = field(default_factory=dict, repr=False)
    _last_cpu: dict[int, float] = field(default_factory=dict, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @staticmethod
    def processes() -> list:
        import psutil

        root = psutil.Process()
        return [root, *root.children(recursive=True)]

    @classmethod
    def snapshot(cls) -> float:
        """Summed PSS of the tree now, in MB."""
        import psutil

        total = 0.0
        for proc in cls.processes():
            try:
                total += proc.memory_full_info().pss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # a worker that just exited
        return total

    def _sample(self, pss: bool = True) -> None:
        import psutil

        total = 0.0
        for proc in self.processes():
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss / 2**20
                    times = proc.cpu_times()
                    if pss:
                        total += proc.memory_full_info().pss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self.peak_rss_one_mb = max(self.peak_rss_one_mb, rss)
            if proc.pid == os.getpid():
                self.peak_rss_driver_mb = max(self.peak_rss_driver_mb, rss)
            elif self._is_worker(proc):
                self.peak_rss_worker_mb = max(self.peak_rss_worker_mb, rss)
            self._last_cpu[proc.pid] = times.user + times.system
        if pss:
            self.peak_pss_mb = max(self.peak_pss_mb, total)
        self.samples += 1

    def _is_worker(self, proc) -> bool:
        import psutil

        if proc.pid not in self._workers:
            try:
                command = " ".join(proc.cmdline()[:3])
                self._workers[proc.pid] = command.startswith("ray::") or "default_worker.py" in command
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                return False
        return self._workers[proc.pid]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            start = time.thread_time()
            self._sample(pss=self.samples % self.pss_every == 0)
            self.sampler_cpu_s += time.thread_time() - start

    def __enter__(self) -> TreeUsage:
        start = time.thread_time()
        self._sample()
        self.sampler_cpu_s += time.thread_time() - start
        self._base_cpu = dict(self._last_cpu)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        start = time.thread_time()
        self._sample()
        self.sampler_cpu_s += time.thread_time() - start

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the tree, less the sampler's own."""
        return sum(t - self._base_cpu.get(pid, 0.0) for pid, t in self._last_cpu.items()) - self.sampler_cpu_s

    def report(self) -> dict:
        return {
            "peak_pss_mb": self.peak_pss_mb,
            "peak_rss_one_mb": self.peak_rss_one_mb,
            "peak_rss_driver_mb": self.peak_rss_driver_mb,
            "peak_rss_worker_mb": self.peak_rss_worker_mb,
            "cpu_s": self.cpu_s,
            "samples": self.samples,
        }


# -- Ray ------------------------------------------------------------------------------------------


def warm_workers(cpus: int) -> None:
    """Have `cpus` Ray workers import the stage modules, as the stages before this one in a
    flow (or earlier runs on a long-lived cluster) would have (a cold worker spends a second or more importing pyarrow
    and tokenizers)."""
    import ray

    @ray.remote(num_cpus=1)
    def warm() -> None:
        import pipelines.stages.corpus.work
        import pipelines.stages.examples.work
        import pipelines.stages.vocab.work  # noqa: F401 - imported to warm the worker

        time.sleep(2)  # hold the CPU so that each warm-up lands on its own worker

    ray.get([warm.remote() for _ in range(cpus)])


def settle(quiet_cpu_per_s: float = 0.1, max_s: float = 30.0) -> float:
    """Wait until Ray's processes are done starting up (the tree uses less than
    `quiet_cpu_per_s` CPU seconds per second, or `max_s` passed), so the measured run starts
    on a quiet cluster, as a long-lived one is; returns the last one-second CPU rate."""
    deadline = time.monotonic() + max_s
    while True:
        with TreeUsage() as usage:
            time.sleep(1.0)
        if usage.cpu_s < quiet_cpu_per_s or time.monotonic() > deadline:
            return usage.cpu_s


def run_stage_measured(stage: str, cfg) -> tuple:
    """(manifest, measurements) of one forced run of a stage ("vocab", "examples") on an
    embedded Ray whose workers are warm and whose processes have settled: wall seconds,
    Ray's idle PSS and CPU rate, the tree's peak memory and CPU time
    (`TreeUsage.report`), and the Ray task timeline."""
    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    ensure_ray(cfg.ray)
    warm_workers(cfg.ray.num_cpus)
    idle_cpu = settle()
    idle_pss = TreeUsage.snapshot()
    with TreeUsage() as memory:
        start, since = time.perf_counter(), time.time()
        manifest, _ = Pipeline(cfg).run(stage, force=True)
        seconds = time.perf_counter() - start
    measured = {"seconds": seconds, "idle_pss_mb": idle_pss, "idle_cpu_per_s": idle_cpu, **memory.report()}
    return manifest, {**measured, "tasks": ray_task_times(since)}


def ray_task_times(since: float) -> dict[str, list]:
    """Per Ray task function that started after `since` (time.time()), from Ray's timeline:
    [runs, summed run seconds, first start, last end (seconds after `since`)]."""
    import ray

    time.sleep(2)  # workers report task events to the GCS about once a second
    out: dict[str, list] = {}
    for event in ray.timeline():
        if not str(event.get("cat", "")).startswith("task::") or event["ts"] / 1e6 < since:
            continue
        start, seconds = event["ts"] / 1e6 - since, event["dur"] / 1e6
        entry = out.setdefault(event["name"].rsplit(".", 1)[-1], [0, 0.0, start, start + seconds])
        entry[0] += 1
        entry[1] += seconds
        entry[2], entry[3] = min(entry[2], start), max(entry[3], start + seconds)
    return out


def describe_tasks(tasks: dict[str, list]) -> str:
    return "; ".join(
        f"{name} x{n} busy {busy:.1f} s in {first:.1f}-{last:.1f} s" for name, (n, busy, first, last) in tasks.items()
    )


# -- inputs ------------------------------------------------------------------------------------


def demo_config(root: Path, overrides: list[str] = ()):
    """The demo recipe with its run under `root`, on all of this machine's CPUs."""
    from pipelines.registry import load_config

    return load_config(DEMO, [f"run.root={root}", f"ray.num_cpus={os.cpu_count() or 1}", *overrides])


def repeat_corpus(source_root: Path, target_root: Path, times: int) -> None:
    """Write `target_root/corpus/`: every shard of `source_root/corpus/` `times` times, copy k
    of shard i numbered k * n_shards + i per split, doc_ids rehashed with k so each copy is a
    distinct document; and a complete manifest listing the copies."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from pipelines.stage import fingerprint
    from pipelines.stage_dir import MANIFEST, Manifest, ShardInfo
    from pipelines.storage import sha256_file

    src, dst = source_root / "corpus", target_root / "corpus"
    source = Manifest.from_json(json.loads((src / MANIFEST).read_text()))
    if dst.exists():
        shutil.rmtree(dst)
    shards: list[ShardInfo] = []
    for split in ("train", "validation"):
        originals = [s for s in source.shards if s.path.startswith(split + "/")]
        (dst / split).mkdir(parents=True)
        for k in range(times):
            for i, shard in enumerate(originals):
                with pa.memory_map(str(src / shard.path)) as stream:
                    table = ipc.open_file(stream).read_all()
                ids = [
                    hashlib.blake2b(f"{d}\x1fcopy{k}".encode(), digest_size=12).hexdigest()
                    for d in table.column("doc_id").to_pylist()
                ]
                table = table.set_column(table.schema.get_field_index("doc_id"), "doc_id", pa.array(ids, pa.string()))
                relative = f"{split}/part-{k * len(originals) + i:05d}.arrow"
                with pa.OSFile(str(dst / relative), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table, max_chunksize=1024)
                path = dst / relative
                shards.append(replace(shard, path=relative, bytes=path.stat().st_size, sha256=sha256_file(str(path))))
    stats = json.loads(json.dumps(source.stats))
    for key in ("documents_read", "documents_kept", "sentences", "characters"):
        stats[key] = stats.get(key, 0) * times
    for split_stats in stats.get("splits", {}).values():
        for key in split_stats:
            split_stats[key] *= times
    manifest = replace(
        source,
        fingerprint=fingerprint(
            "corpus", source.code_version, source.config, {"repeated": source.fingerprint, "times": times}
        ),
        inputs={"repeated_from": source.fingerprint, "times": times},
        shards=shards,
        stats=stats,
        timings={},
    )
    (dst / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")


def prepare_demo_corpus(root: Path) -> None:
    """Run (or reuse) the demo corpus stage under `root`, in this process, then stop Ray."""
    import ray

    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    cfg = demo_config(root)
    ensure_ray(cfg.ray)
    Pipeline(cfg).run("corpus")
    ray.shutdown()


def corpus_sentences(root: Path, split: str = "train") -> list[list[str]]:
    """The documents (as sentence lists) of one split of the corpus under `root`, in shard order."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from pipelines.stage_dir import MANIFEST

    manifest = json.loads((root / "corpus" / MANIFEST).read_text())
    docs: list[list[str]] = []
    for shard in manifest["shards"]:
        if shard["path"].startswith(split + "/"):
            with pa.memory_map(str(root / "corpus" / shard["path"])) as stream:
                docs.extend(ipc.open_file(stream).read_all().column("sentences").to_pylist())
    return docs


def distinct_words(docs: list[list[str]]) -> int:
    """Distinct words as the vocab trainer sees them (BERT normalizer + pre-tokenizer)."""
    from tokenizers import pre_tokenizers

    from bertcore.vocab.tokenizer import VocabConfig, build_normalizer

    norm = build_normalizer(VocabConfig())
    pre = pre_tokenizers.BertPreTokenizer()
    words: set[str] = set()
    for doc in docs:
        words.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str("\n".join(doc))))
    return len(words)


# -- measured runs -----------------------------------------------------------------------------


def child(root: str) -> None:
    """One measured vocab stage run on the corpus under `root` (a fresh process)."""
    cfg = demo_config(Path(root), [f"vocab.vocab_size={VOCAB_SIZE}"])
    manifest, measured = run_stage_measured("vocab", cfg)
    stats = manifest.stats
    print(
        json.dumps(
            {
                **measured,
                "cpus": cfg.ray.num_cpus,
                "sentences": stats["corpus_train_sentences"],
                "probability": stats["sampled_sentences_probability"],
                "vocab_entries": stats["vocab_size"],
                "unk_rate": stats["unk_rate"],
            }
        )
    )


def child_library(root: str) -> None:
    """The library calls the stage's tasks make, timed one by one in this process: the
    alphabet count (one thread) and the trainer (the tokenizers library's threads), over
    the same sentences (held in memory first, not timed)."""
    import psutil

    from bertcore.vocab.tokenizer import count_alphabet, train_wordpiece

    cfg = demo_config(Path(root), [f"vocab.vocab_size={VOCAB_SIZE}"]).vocab
    sentences = [s for doc in corpus_sentences(Path(root)) for s in doc]
    held_mb = psutil.Process().memory_info().rss / 2**20
    with TreeUsage() as usage:
        start = time.perf_counter()
        alphabet = count_alphabet(sentences, cfg)
        alphabet_s = time.perf_counter() - start
        tokenizer = train_wordpiece(sentences, cfg, alphabet=alphabet)
        seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "alphabet_s": alphabet_s,
                "train_s": seconds - alphabet_s,
                "held_mb": held_mb,
                "vocab_entries": tokenizer.get_vocab_size(),
                **usage.report(),
            }
        )
    )


def measure(script: str, jobs: dict, trials: int) -> dict:
    """Run each job (key -> arguments of `script`) `trials` times, each in a fresh process,
    round-robin so that a burst of load from other jobs on a shared machine hits every job
    alike; per job, the fastest run (the least disturbed), with every trial listed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **ENV)
    runs: dict = {key: [] for key in jobs}
    for _ in range(trials):
        for key, arguments in jobs.items():
            out = subprocess.run([sys.executable, script, *arguments], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"measured run {key} failed:\n{out.stderr[-4000:]}")
            runs[key].append(json.loads(out.stdout.strip().splitlines()[-1]) | {"load": os.getloadavg()[0]})
    best = {}
    for key, results in runs.items():
        best[key] = min(results, key=lambda r: r["seconds"])
        # every trial as wall s / CPU s @ the 1-minute load average when it ended
        best[key]["trials"] = ",".join(f"{r['seconds']:.1f}/{r['cpu_s']:.1f}@{r['load']:.1f}" for r in results)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=1, help="runs per input; the fastest is reported")
    parser.add_argument(
        "--workdir", type=Path, help="keep the corpora here (reused by later runs); default: a temporary folder"
    )
    parser.add_argument("--skip-library", action="store_true", help="skip the in-process timing of the library calls")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-library", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.child_library:
        child_library(args.child_library)
        return
    os.environ.update(ENV)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        x1, xn = work / "x1", work / f"x{args.repeat}"
        prepare_demo_corpus(x1)
        repeat_corpus(x1, xn, args.repeat)

        inputs = {"x1": x1, f"x{args.repeat}": xn}
        rows = list(
            measure(__file__, {name: ["--child", str(root)] for name, root in inputs.items()}, args.trials).items()
        )
        cpus = rows[0][1]["cpus"]
        print(f"vocab stage, vocab_size={VOCAB_SIZE}, embedded local Ray with {cpus} CPUs, Ray start not timed")
        print(
            f"{'corpus':<7} {'sentences':>10} {'entries':>8} {'s':>7} {'CPU s':>7} "
            f"{'PSS idle MB':>12} {'PSS peak MB':>12} {'RSS 1 proc MB':>14} {'RSS driver MB':>14} "
            f"{'idle CPU s/s':>13}  trials wall s/CPU s@load"
        )
        for name, r in rows:
            print(
                f"{name:<7} {r['sentences']:>10} {r['vocab_entries']:>8} {r['seconds']:7.1f} {r['cpu_s']:7.1f} "
                f"{r['idle_pss_mb']:12.0f} {r['peak_pss_mb']:12.0f} {r['peak_rss_one_mb']:14.0f} "
                f"{r['peak_rss_driver_mb']:14.0f} {r['idle_cpu_per_s']:13.2f}  {r['trials']}"
            )
        for name, r in rows:
            print(f"{name} Ray tasks (fastest trial; seconds after the stage started): {describe_tasks(r['tasks'])}")
        a, b = rows[0][1], rows[1][1]
        print(
            f"growth x1 -> x{args.repeat}: time {b['seconds'] / a['seconds']:.2f}, CPU time "
            f"{b['cpu_s'] / a['cpu_s']:.2f}, peak PSS (all processes) {b['peak_pss_mb'] / a['peak_pss_mb']:.2f}, peak "
            f"PSS above idle {(b['peak_pss_mb'] - b['idle_pss_mb']) / (a['peak_pss_mb'] - a['idle_pss_mb']):.2f}, "
            f"largest process RSS {b['peak_rss_one_mb'] / a['peak_rss_one_mb']:.2f}"
        )

        if not args.skip_library:
            print("library calls in one process (count_alphabet, then train_wordpiece), sentences already in memory:")
            print(
                f"{'corpus':<7} {'alphabet s':>11} {'train s':>8} {'CPU s':>7} {'RSS held MB':>12} "
                f"{'RSS peak MB':>12}  trials wall s/CPU s@load"
            )
            library = measure(
                __file__, {name: ["--child-library", str(root)] for name, root in inputs.items()}, args.trials
            )
            for name, r in library.items():
                print(
                    f"{name:<7} {r['alphabet_s']:11.1f} {r['train_s']:8.1f} {r['cpu_s']:7.1f} "
                    f"{r['held_mb']:12.0f} {r['peak_rss_one_mb']:12.0f}  {r['trials']}"
                )

        docs = corpus_sentences(x1)
        half, full = distinct_words(docs[::2]), distinct_words(docs)
        beta = math.log(full / half) / math.log(2)
        print(
            f"distinct words (BERT pre-tokenizer): every other document {half}, demo corpus {full} "
            f"(Heaps exponent {beta:.2f}); x{args.repeat} by repetition {full}, a real corpus "
            f"{args.repeat}x larger about {full * args.repeat**beta:,.0f}"
        )


if __name__ == "__main__":
    main()
