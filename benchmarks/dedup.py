"""The corpus stage's duplicate removal and shard plan at scale: this checkout against the
code before the dedup was partitioned (a git ref, checked out beside it), same inputs, same
run, each measured run in a fresh process on its own embedded Ray.

Inputs (near dedup on everywhere, the setting of configs/bert-base.yaml):
- copies-Kx: the shipped enwiki sample (206 pages) K times, each copy with a first sentence
  naming it (benchmarks/scale.py's copies): every copy is a near duplicate of the others,
  which stresses candidate pairs and grouping;
- mixed-Kx: as many documents as copies-Kx has pages, each assembled from sentences of
  different articles of the cleaned sample (keyed RNG): few near duplicates, which
  stresses signatures and the plan;
- distinct-N: N documents of five sentences of random words (jsonl), through the whole
  `--only corpus`, for memory per added document;
- synthetic-N: N cleaned documents written straight into `_work/` (tests/support/synthetic_works.py:
  1% exact and 1% near copies), through dedup, split and shard plan only (no cleaning), for
  the driver's memory at a million documents.

Printed, each with its baseline and a verdict against the goal of issue 38:
- driver peak RSS at 1x, 8x and 32x on both inputs (goal: flat within 10%);
- the dedup phases' wall time with 1 and 2 workers on the synthetic corpus (goal: 2 workers at
  most 0.6x one);
- the driver's CPU seconds in dedup and plan as a share of the stage's CPU (goal: <= 5%);
- driver RSS growth per document between distinct-20k and distinct-200k (goal <= 200 bytes)
  and at synthetic-1M above an empty corpus (goal <= 64 MB);
- a projection to English Wikipedia (6.8 M articles) and a RoBERTa-size corpus (35 M) from
  the per-document memory and driver CPU of the synthetic runs, bertpipe's and the baseline's.

    python benchmarks/dedup.py [--workdir DIR] [--sizes 1,8,32] [--baseline REF]
        [--distinct 20000,200000] [--synthetic 1000000] [--quick]

`--quick` runs small sizes only (a check that the script works). `--baseline ''` skips the
baseline.
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REF = "97ed789"
"""main before the partitioned dedup (issue 38)."""
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "BERTPIPE_PROGRESS_INTERVAL_S": "30",
}
ENWIKI_ARTICLES, ROBERTA_DOCUMENTS = 6_800_000, 35_000_000


# -- inputs ---------------------------------------------------------------------------------------


def copies_input(folder: Path, k: int) -> Path:
    """The enwiki sample K times as one XML file (copy k's pages open with a sentence naming it)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.scale import copies_of
    from bertcore.sample_data import ENWIKI_DUMP, gensim_data_dir
    from bertcore.text.multistream import split_dump

    path = folder / f"copies-{k}x" / "enwiki-copies.xml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        header, pages, footer = split_dump(bz2.decompress((gensim_data_dir() / ENWIKI_DUMP).read_bytes()))
        with open(path, "wb") as out:
            out.write(header)
            for _, _, page in copies_of(pages, k):
                out.write(page)
            out.write(footer)
    return path


def _article_sentences() -> list[list[str]]:
    """The cleaned sentences of every article of the enwiki sample (in this process, no Ray)."""
    sys.path.insert(0, str(ROOT))
    from bertcore.sample_data import ENWIKI_DUMP, gensim_data_dir
    from bertcore.text.clean import Cleaned, Wiki, clean_document
    from bertcore.text.config import CorpusConfig
    from bertcore.text.records import ReadStats, iter_raw_documents

    cfg = CorpusConfig(inputs=[{"uri": "unused"}])
    out, wiki = [], None
    with bz2.open(gensim_data_dir() / ENWIKI_DUMP, "rb") as stream:
        stats = ReadStats()
        for raw in iter_raw_documents(stream, "wikipedia", stats=stats):
            wiki = wiki or Wiki.of(cfg, "en", stats.header)
            cleaned = clean_document(raw, cfg, "en", wiki)
            if isinstance(cleaned, Cleaned):
                out.append(cleaned.sentences)
    return out


def mixed_input(folder: Path, k: int, pages: int) -> Path:
    """`pages` x k documents (jsonl), each of 5 to 40 sentences drawn from different articles."""
    from bertcore.rng import keyed_random

    path = folder / f"mixed-{k}x" / "mixed.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        articles = _article_sentences()
        rng = keyed_random(0, "mixed-input", k)
        with open(path, "w", encoding="utf-8") as out:
            for d in range(pages * k):
                picked = rng.sample(range(len(articles)), rng.randint(5, 40))
                text = " ".join(rng.choice(articles[a]) for a in picked)
                out.write(json.dumps({"key": f"mixed-{d}", "text": text}) + "\n")
    return path


def distinct_input(folder: Path, n: int) -> Path:
    """n documents of five sentences of twelve random words (jsonl)."""
    import numpy as np

    path = folder / f"distinct-{n}" / "distinct.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(n)
        with open(path, "w", encoding="utf-8") as out:
            for d in range(n):
                words = rng.integers(0, 50_000, size=60)
                text = " ".join(" ".join(f"w{w}" for w in words[s * 12 : (s + 1) * 12]) + "." for s in range(5))
                out.write(json.dumps({"key": f"d{d}", "text": text}) + "\n")
    return path


def synthetic_input(folder: Path, n: int) -> Path:
    """A corpus stage folder whose `_work/` holds n synthetic cleaned documents."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from bertcore.text.dedup import MinHashSpec
    from synthetic_works import write_works

    base = folder / f"synthetic-{n}"
    done = base / "works.json"
    if not done.exists():
        files = max(1, n // 20_000)
        spec = MinHashSpec(128, 5, 1, 0.8)
        paths, rows, planted = write_works(str(base / "corpus" / "_work"), n, files, spec)
        done.write_text(json.dumps({"paths": paths, "rows": rows, "exact": planted.exact, "near": planted.near}))
    return base


# -- measured runs (children) -----------------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM): unlike getrusage's ru_maxrss, which execve keeps, it
    starts again with the new program, so a child does not report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def kept_digest(root: str, manifest) -> str:
    """sha256 over each output shard's path and its documents' ids, in order: the same
    documents in the same shards, whatever the columns beside them (they changed)."""
    import hashlib

    import pyarrow.ipc as ipc

    digest = hashlib.sha256()
    for shard in sorted(manifest.shards, key=lambda s: s.path):
        with ipc.open_file(str(Path(root) / "corpus" / shard.path)) as reader:
            ids = reader.read_all().column("doc_id").to_pylist()
        digest.update(json.dumps([shard.path, ids]).encode())
    return digest.hexdigest()


def child_corpus(code: str, root: str, uri: str, fmt: str, workers: int, split_bytes: int) -> dict:
    """The corpus stage (near dedup on) on `uri`, measured."""
    from benchmarks.vocab import demo_config, run_stage_measured

    overrides = [
        f"ray.num_cpus={workers}",
        f"corpus.inputs=[{{uri: '{uri}', name: bench, format: {fmt}}}]",
        f"corpus.split_bytes={split_bytes}",
        "corpus.near_dedup=true",
        "corpus.validation_fraction=0.01",
        "corpus.min_chars=50",
        "corpus.min_sentences=2",
    ]
    manifest, measured = run_stage_measured("corpus", demo_config(Path(root), overrides))
    stats = manifest.stats
    return {
        **measured,
        "max_rss_mb": peak_rss_mb(),
        "timings": manifest.timings,
        "read": stats["documents_read"],
        "kept": stats["documents_kept"],
        "work_units": stats["work_units"],
        "exact": stats["dropped"].get("duplicate", 0),
        "near": stats["dropped"].get("near_duplicate", 0),
        "kept_ids": kept_digest(root, manifest),
    }


def child_synthetic(code: str, root: str, base: str, workers: int) -> dict:
    """Dedup, split and shard plan over the synthetic work files (this checkout's code, or
    the baseline's driver-side functions), measured."""
    import ray

    from benchmarks.vocab import TreeUsage, settle, warm_workers
    from bertcore.config import RayConfig, StorageConfig
    from bertcore.text.config import CorpusConfig
    from pipelines.ray_runtime import ensure_ray
    from pipelines.stage_dir import StageDir
    from pipelines.storage import Storage

    facts = json.loads((Path(base) / "works.json").read_text())
    target = Path(root) / "corpus" / "_work"
    target.mkdir(parents=True)
    for name in os.listdir(Path(base) / "corpus" / "_work"):
        os.link(Path(base) / "corpus" / "_work" / name, target / name)  # a link inside the stage folder, not out of it
    ensure_ray(RayConfig(num_cpus=workers))
    warm_workers(workers)
    settle()
    stage = StageDir(Storage(StorageConfig()), root, "corpus")
    corpus = CorpusConfig(inputs=[{"uri": "unused"}], near_dedup=True)
    timings: dict = {}
    with TreeUsage() as usage:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            from pipelines.stages.corpus.plan import write_corpus
        except ImportError:
            kept, exact, near = _baseline_after_cleaning(stage, facts, corpus, workers)
        else:
            from bertcore.text.dedup import MinHashSpec
            from pipelines.stages.corpus.works import Works

            works = Works(tuple(facts["paths"]), tuple(facts["rows"]))
            written = write_corpus(stage, works, corpus, MinHashSpec(128, 5, 1, 0.8), "bench", workers)
            kept, exact, near = (
                sum(s.rows for s in written.shards),
                len(written.removals.exact),
                len(written.removals.near),
            )
            timings = written.timings
        seconds, driver_cpu = time.perf_counter() - start, time.process_time() - cpu
    ray.shutdown()
    return {
        "seconds": seconds,
        "driver_cpu_s": driver_cpu,
        "timings": timings,
        "kept": kept,
        "exact": exact,
        "near": near,
        **usage.report(),
        "max_rss_mb": peak_rss_mb(),
    }


def _baseline_after_cleaning(stage, facts: dict, corpus, workers: int) -> tuple[int, int, int]:
    """The baseline's driver: metadata of every document, the seen set, serial MinHash, the
    shard jobs (its shard writing is left out: only the driver is measured)."""
    from pipelines.stages.corpus import work as old

    meta = old._gather_metadata(stage, facts["paths"], set())
    decision, drops = old._decide(meta, corpus, 1, stage, facts["paths"])
    old._shard_jobs(meta, decision, facts["paths"], corpus.shard_chars)
    return sum(len(v) for v in decision.values()), int(drops["duplicate"].sum()), int(drops["near_duplicate"].sum())


CHILDREN = {"corpus": child_corpus, "synthetic": child_synthetic}


def run_child(code: Path, kind: str, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code), **ENV)
    # run from the code's own folder: Ray puts the driver's working directory first on its workers' path
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(code), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        cwd=code,
    )
    if out.returncode != 0:
        sys.exit(f"measured run {kind} {args} with {code} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- report -------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def baseline_checkout(workdir: Path, ref: str) -> Path | None:
    if not ref:
        return None
    target = workdir / f"baseline-{ref}"
    if not target.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True)  # entries of deleted workdirs
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(target), ref], check=True, capture_output=True
        )
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--distinct", default="20000,200000")
    parser.add_argument("--synthetic", type=int, default=1_000_000)
    parser.add_argument("--baseline", default=BASELINE_REF, help="git ref of the code to compare with ('' for none)")
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: 1,2 copies, 2,000/8,000 distinct, 50,000 synthetic"
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.distinct, args.synthetic = "1,2", "2000,8000", 50_000
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bertpipe-dedup-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = baseline_checkout(workdir, args.baseline)
    codes = {"bertpipe": ROOT, **({"baseline": baseline} if baseline else {})}
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"# dedup benchmark · {time.strftime('%Y-%m-%d %H:%M')} · {os.cpu_count()} CPUs · load "
        f"{os.getloadavg()[0]:.1f} · baseline {args.baseline or 'none'} · workdir {workdir}",
        flush=True,
    )

    runs: dict = {}

    def corpus_run(name: str, uri: Path, fmt: str, workers: int, who: str) -> dict:
        key = (name, workers, who)
        split = max(64 * 1024, -(-uri.stat().st_size // 8))
        runs[key] = run_child(
            codes[who], "corpus", workdir / "runs" / f"{name}-{workers}-{who}", uri, fmt, workers, split
        )
        r = runs[key]
        print(
            f"{name:>14} {who:>8} {workers}w · read {r['read']:,} · kept {r['kept']:,} · exact "
            f"{r['exact']:,} · near {r['near']:,} · "
            f"stage {r['seconds']:.1f}s · driver peak RSS {r['max_rss_mb']:.0f} MB · tree CPU {r['cpu_s']:.1f}s · "
            f"timings {r['timings']}",
            flush=True,
        )
        return r

    pages = None
    for k in sizes:
        corpus_run(f"copies-{k}x", copies_input(workdir, k), "wikipedia", 2, "bertpipe")
        pages = pages or runs[(f"copies-{k}x", 2, "bertpipe")]["read"] // k
        corpus_run(f"mixed-{k}x", mixed_input(workdir, k, pages), "jsonl", 2, "bertpipe")
        if baseline:
            for name in (f"copies-{k}x", f"mixed-{k}x"):
                uri = copies_input(workdir, k) if name.startswith("copies") else mixed_input(workdir, k, pages)
                corpus_run(name, uri, "wikipedia" if name.startswith("copies") else "jsonl", 2, "baseline")
    largest = max(sizes)
    for name in (f"copies-{largest}x", f"mixed-{largest}x"):
        uri = copies_input(workdir, largest) if name.startswith("copies") else mixed_input(workdir, largest, pages)
        corpus_run(name, uri, "wikipedia" if name.startswith("copies") else "jsonl", 1, "bertpipe")
    distinct = [int(n) for n in args.distinct.split(",")]
    for n in distinct:
        for who in codes:
            corpus_run(f"distinct-{n}", distinct_input(workdir, n), "jsonl", 2, who)
    synthetic = {}
    base = synthetic_input(workdir, args.synthetic)
    empty = synthetic_input(workdir, 100)
    for label, folder, workers in (("empty", empty, 2), ("full", base, 2), ("full-1w", base, 1)):
        synthetic[label] = run_child(ROOT, "synthetic", workdir / "runs" / f"synthetic-{label}", folder, workers)
        s = synthetic[label]
        print(
            f"synthetic {label}: {s['seconds']:.1f}s · driver peak RSS {s['max_rss_mb']:.0f} MB · driver CPU "
            f"{s['driver_cpu_s']:.1f}s · "
            f"tree CPU {s['cpu_s']:.1f}s · kept {s['kept']:,} · exact {s['exact']:,} · near {s['near']:,} · "
            f"timings {s['timings']}",
            flush=True,
        )
    if baseline:
        small = synthetic_input(workdir, min(args.synthetic, 100_000))
        for label, folder in (("baseline-empty", empty), ("baseline-small", small)):
            synthetic[label] = run_child(baseline, "synthetic", workdir / "runs" / f"synthetic-{label}", folder, 2)
            s = synthetic[label]
            print(
                f"synthetic {label}: {s['seconds']:.1f}s · driver peak RSS {s['max_rss_mb']:.0f} MB · driver CPU "
                f"{s['driver_cpu_s']:.1f}s · kept {s['kept']:,} · exact {s['exact']:,} · near {s['near']:,}",
                flush=True,
            )
    report(runs, synthetic, sizes, distinct, args.synthetic, bool(baseline))


def report(
    runs: dict, synthetic: dict, sizes: list[int], distinct: list[int], n_synthetic: int, has_baseline: bool
) -> None:
    def rss(name, workers=2, who="bertpipe"):
        return runs[(name, workers, who)]["max_rss_mb"]

    print("\n## Driver peak RSS (MB), near dedup on, 2 workers\n")
    print(
        "| input | documents read | bertpipe | baseline | exact removed | near removed (bertpipe / baseline) "
        "| same documents in the same shards |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind in ("copies", "mixed"):
        for k in sizes:
            name = f"{kind}-{k}x"
            new = runs[(name, 2, "bertpipe")]
            old = runs.get((name, 2, "baseline"))
            print(
                f"| {name} | {new['read']:,} | {new['max_rss_mb']:.0f} | {old['max_rss_mb']:.0f} | {new['exact']:,} | "
                f"{new['near']:,} / {old['near']:,} | {'yes' if old['kept_ids'] == new['kept_ids'] else 'no'} |"
                if old
                else (
                    f"| {name} | {new['read']:,} | {new['max_rss_mb']:.0f} | - | {new['exact']:,} | "
                    f"{new['near']:,} / - | - |"
                )
            )
    for kind in ("copies", "mixed"):
        values = [rss(f"{kind}-{k}x") for k in sizes]
        spread = max(values) / min(values) - 1
        print(
            f"\n{kind}: driver peak RSS from {sizes[0]}x to {sizes[-1]}x within {spread:.1%} (goal: flat "
            f"within 10%): {verdict(spread <= 0.10)}"
        )

    print("\n## Dedup phases (dedup + split and plan), wall seconds, 1 and 2 workers\n")
    one, two = synthetic["full-1w"]["timings"], synthetic["full"]["timings"]
    t1, t2 = one["dedup_s"] + one["plan_s"], two["dedup_s"] + two["plan_s"]
    print(
        f"synthetic {n_synthetic:,}: 1 worker {t1:.1f}s · 2 workers {t2:.1f}s · ratio {t2 / t1:.2f} (goal <= "
        f"0.6): {verdict(t2 / t1 <= 0.6)}"
    )
    largest = max(sizes)
    for kind in ("copies", "mixed"):
        name = f"{kind}-{largest}x"
        one, two = (runs[(name, w, "bertpipe")]["timings"] for w in (1, 2))
        t1, t2 = one["dedup_s"] + one["plan_s"], two["dedup_s"] + two["plan_s"]
        print(
            f"{name}: 1 worker {t1:.2f}s · 2 workers {t2:.2f}s · ratio {t2 / t1:.2f} (for reference: "
            f"{runs[(name, 2, 'bertpipe')]['read']:,} "
            "documents, where the steps' fixed cost, about 30 Ray tasks, dominates)"
        )

    print("\n## The driver's CPU in dedup and plan, as a share of the stage's CPU (driver + workers)\n")
    for (name, workers, who), r in sorted(runs.items()):
        if who != "bertpipe" or workers != 2:
            continue
        driver = r["timings"]["driver_cpu_dedup_s"] + r["timings"]["driver_cpu_plan_s"]
        share = driver / r["cpu_s"]
        goal = (
            f" (goal <= 5%): {verdict(share <= 0.05)}"
            if name in (f"copies-{largest}x", f"mixed-{largest}x", f"distinct-{distinct[-1]}")
            else ""
        )
        print(f"{name}: {driver:.2f} of {r['cpu_s']:.1f} CPU s = {share:.1%}{goal}")
    print(
        "(The driver's part is a fixed cost, about 0.5 to 1 s per run: submitting some 30 tasks and their first "
        "pickling; the goal is judged on the largest inputs.)"
    )

    print("\n## Memory per added document\n")
    lo, hi = distinct[0], distinct[-1]
    per_doc = {
        who: (rss(f"distinct-{hi}", who=who) - rss(f"distinct-{lo}", who=who)) * 2**20 / (hi - lo)
        for who in ("bertpipe", "baseline")
        if (f"distinct-{hi}", 2, who) in runs
    }
    for who, value in per_doc.items():
        goal = f" (goal <= 200): {verdict(value <= 200)}" if who == "bertpipe" else ""
        print(
            f"distinct {lo:,} -> {hi:,} documents, full --only corpus: {who} driver peak RSS grows "
            f"{value:,.0f} bytes per document{goal}"
        )
    growth = synthetic["full"]["max_rss_mb"] - synthetic["empty"]["max_rss_mb"]
    print(
        f"synthetic {n_synthetic:,} documents through dedup, split and plan: driver peak RSS {growth:+.1f} MB above "
        f"an empty corpus (goal <= 64 MB): {verdict(growth <= 64)}"
    )
    n_small = min(n_synthetic, 100_000)
    old_bytes = None
    if "baseline-small" in synthetic:
        old_growth = synthetic["baseline-small"]["max_rss_mb"] - synthetic["baseline-empty"]["max_rss_mb"]
        old_bytes = old_growth * 2**20 / n_small
        print(
            f"baseline at {n_small:,} synthetic documents: {old_growth:+.1f} MB above an empty corpus "
            f"({old_bytes:,.0f} bytes per document; at {n_synthetic:,}: about {old_bytes * n_synthetic / 2**30:.1f} GB)"
        )

    print("\n## Projection (the driver only; per-document figures from the synthetic runs)\n")
    new_bytes = max(growth, 0.0) * 2**20 / n_synthetic
    new_cpu = (synthetic["full"]["driver_cpu_s"] - synthetic["empty"]["driver_cpu_s"]) / n_synthetic
    old_cpu = (
        (synthetic["baseline-small"]["driver_cpu_s"] - synthetic["baseline-empty"]["driver_cpu_s"]) / n_small
        if "baseline-small" in synthetic
        else None
    )
    print(
        "| corpus | documents | driver memory, bertpipe | driver memory, baseline | driver CPU, bertpipe | "
        "driver CPU, baseline |"
    )
    print("|---|---|---|---|---|---|")
    for label, n in (("English Wikipedia", ENWIKI_ARTICLES), ("RoBERTa-size, 160 GB", ROBERTA_DOCUMENTS)):
        old_mem = f"{old_bytes * n / 2**30:.1f} GB" if old_bytes else "-"
        old_time = f"{old_cpu * n / 3600:.1f} h" if old_cpu else "-"
        print(
            f"| {label} | {n / 1e6:.1f} M | {new_bytes * n / 2**20:,.0f} MB | {old_mem} | "
            f"{new_cpu * n / 60:.1f} min | {old_time} |"
        )
    print(
        f"\nPer document: bertpipe {new_bytes:.1f} bytes and {new_cpu * 1e6:.1f} us of driver CPU (synthetic "
        f"{n_synthetic:,} against 100 documents; the driver keeps 8 bytes per removed document, "
        f"{synthetic['full']['exact'] + synthetic['full']['near']:,} here); baseline {old_bytes or 0:,.0f} bytes and "
        f"{(old_cpu or 0) * 1e6:,.0f} us (its metadata, seen set and serial MinHash, at {n_small:,}). Driver CPU "
        "includes Ray's own threads in the driver process. The baseline's text per document is short here; on real "
        "articles its serial MinHash costs about 1.25 us per word (issue 38's measure)."
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        kind, code = sys.argv[2], sys.argv[3]
        sys.path.insert(0, code)  # the code measured: this checkout or the baseline's
        print(json.dumps(CHILDREN[kind](code, *[int(a) if a.isdigit() else a for a in sys.argv[4:]])))
    else:
        main()
