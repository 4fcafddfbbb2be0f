"""Corpus stage throughput against WikiExtractor on the shipped English Wikipedia dump, and
(`--web`) on web input against datatrove.

Both run on one core in a fresh process over the same decompressed XML: bertpipe's cleaning
(mwparserfromhell + sentence splitting with sentencex, exactly what a corpus Ray task runs)
and WikiExtractor's Extractor (markup removal only, no sentence splitting). Each is run on
the dump as shipped and on the dump repeated 10 times, to show whether peak memory grows
with the input. Also reported: the whole stage on the embedded local Ray with all CPUs.

Web input (`--web`): the shipped WARC ({web_data}/sample.warc.gz, 82 pages) repeated
`--repeat` times, read on one core in a fresh process by bertpipe (warcio, resiliparse,
lingua, the Gopher and C4 filters and sentence splitting: exactly what a corpus task runs),
with its filters on (language identification and quality filters) and off (extraction and
sentence splitting only), and by datatrove's WarcReader and Trafilatura extractor, with its
Gopher repetition and quality filters (on) and without (off). datatrove's extractor runs
in a sandbox subprocess, so CPU time (the process and its children) is what is divided by:
MB of decompressed WARC per CPU-second. Without datatrove, trafilatura alone is the baseline.

    python benchmarks/corpus.py [--repeat 10] [--skip-stage]
    python benchmarks/corpus.py --web [--repeat 5]
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_input(dump: Path, repeat: int, directory: Path) -> Path:
    """The dump's XML with its pages repeated `repeat` times (one header, one footer)."""
    xml = bz2.decompress(dump.read_bytes())
    head_end = xml.index(b"<page>")
    tail_start = xml.rindex(b"</page>") + len(b"</page>")
    path = directory / f"enwiki-x{repeat}.xml"
    with open(path, "wb") as out:
        out.write(xml[:head_end])
        for _ in range(repeat):
            out.write(xml[head_end:tail_start])
        out.write(xml[tail_start:])
    return path


def run_bertpipe(path: str) -> dict:
    from bertcore.text.clean import Cleaned, clean_document
    from bertcore.text.config import CorpusConfig
    from bertcore.text.records import iter_raw_documents

    cfg = CorpusConfig(inputs=[path])
    kept = sentences = 0
    start = time.perf_counter()
    with open(path, "rb") as stream:
        for raw in iter_raw_documents(stream, "wikipedia", name=os.path.basename(path)):
            outcome = clean_document(raw, cfg, "en")
            if isinstance(outcome, Cleaned):
                kept += 1
                sentences += len(outcome.sentences)
    return {"seconds": time.perf_counter() - start, "documents": kept, "sentences": sentences}


def run_wikiextractor(path: str) -> dict:
    """WikiExtractor's own page collector and Extractor, in this process, with no template
    definitions loaded (its fastest mode; the CLI default also expands templates)."""
    import io

    import wikiextractor.WikiExtractor as wx
    from wikiextractor.extract import Extractor

    # process_dump() sets this from the dump's <namespace key="10">; without it every
    # title "starts with" the empty prefix and collect_pages yields nothing
    wx.templateNamespace = "Template"
    kept = 0
    start = time.perf_counter()
    with open(path, encoding="utf-8") as lines:
        for page_id, revid, title, page in wx.collect_pages(lines):  # main namespace, no redirects
            out = io.StringIO()
            Extractor(page_id, revid, "", title, page).extract(out)
            kept += bool(out.getvalue())
    return {"seconds": time.perf_counter() - start, "documents": kept, "sentences": None}


def _warc_documents(path: str):
    from bertcore.text.gzmembers import GzipMembers
    from bertcore.text.records import iter_raw_documents

    with open(path, "rb") as raw:
        yield from iter_raw_documents(GzipMembers(raw), "warc", name=os.path.basename(path))


def run_bertpipe_web(path: str, filters: bool) -> dict:
    from bertcore.text.clean import Cleaned, clean_document
    from bertcore.text.config import CorpusConfig
    from bertcore.text.screen import Screen

    off = {"enabled": False}
    # filters on: language identification too (off by default since the corpus stage made it opt-in), so that
    # the German pages meet German stop words, as they do in the stage with `languages` set
    cfg = (
        CorpusConfig(inputs=[path], detect_language=True)
        if filters
        else CorpusConfig(
            inputs=[path], detect_language=False, quality={"gopher_repetition": off, "gopher_quality": off, "c4": off}
        )
    )
    screen = Screen.of(cfg)
    kept = sentences = 0
    for raw in _warc_documents(path):
        outcome = clean_document(raw, cfg, "en", None, screen)
        if isinstance(outcome, Cleaned):
            kept += 1
            sentences += len(outcome.sentences)
    return {"documents": kept, "sentences": sentences}


def run_datatrove(path: str, filters: bool) -> dict:
    """datatrove's own steps chained in this process, as its executors chain them."""
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import WarcReader

    # a long timeout: no page is skipped for time on a busy machine
    reader = WarcReader(os.path.dirname(path), glob_pattern=os.path.basename(path))
    steps = [reader, Trafilatura(favour_precision=True, timeout=60)]
    if filters:
        steps += [GopherRepetitionFilter(), GopherQualityFilter()]
    data = None
    for step in steps:
        data = step(data, 0, 1)
    kept = sum(1 for _ in data)
    return {"documents": kept, "sentences": None}


def run_trafilatura(path: str, filters: bool) -> dict:
    import trafilatura

    kept = 0
    for raw in _warc_documents(path):
        kept += bool(trafilatura.extract(raw.text, favor_precision=True))
    return {"documents": kept, "sentences": None}


WEB_TOOLS = {"bertpipe": run_bertpipe_web, "datatrove": run_datatrove, "trafilatura": run_trafilatura}


def child(tool: str, path: str) -> None:
    if ":" in tool:  # web tools: name:on|off
        name, mode = tool.split(":")
        start, cpu = time.perf_counter(), _cpu()
        result = WEB_TOOLS[name](path, mode == "on")
        result["seconds"] = time.perf_counter() - start
        result["cpu_seconds"] = _cpu() - cpu
        print(json.dumps(result))
        return
    result = {"bertpipe": run_bertpipe, "wikiextractor": run_wikiextractor}[tool](path)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(tool: str, path: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, __file__, "--child", tool, str(path)], env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["mb"] = path.stat().st_size / 2**20
    result["mb_per_s_per_core"] = result["mb"] / result["seconds"]
    return result


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def web_main(repeat: int) -> None:
    import gzip

    from bertcore.sample_data import WEB_DATA

    sample = (WEB_DATA / "sample.warc.gz").read_bytes()
    mb = len(gzip.decompress(sample)) * repeat / 2**20
    try:
        import datatrove  # noqa: F401 - only whether it is installed

        baseline = "datatrove"
    except ImportError:
        baseline = "trafilatura"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"web-x{repeat}.warc.gz"
        path.write_bytes(sample * repeat)  # concatenated per-record gzip files are one such file
        results = {}
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        for tool in (f"{baseline}:off", f"{baseline}:on", "bertpipe:off", "bertpipe:on"):
            command = [sys.executable, __file__, "--child", tool, str(path)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            results[tool] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"web input: the shipped WARC x{repeat}, {mb:.1f} MB decompressed, one core each")
    print(f"{'tool':<18} {'CPU s':>7} {'wall s':>7} {'MB/s/core':>10} {'docs kept':>10}")
    for tool, r in results.items():
        r["mb_per_s_per_core"] = mb / r["cpu_seconds"]
        speed = r["mb_per_s_per_core"]
        print(f"{tool:<18} {r['cpu_seconds']:7.2f} {r['seconds']:7.2f} {speed:10.2f} {r['documents']:>10}")
    for mode in ("off", "on"):
        ratio = results[f"bertpipe:{mode}"]["mb_per_s_per_core"] / results[f"{baseline}:{mode}"]["mb_per_s_per_core"]
        print(
            f"speed ratio bertpipe / {baseline}, filters {mode}: {ratio:.2f}  (bertpipe also splits sentences"
            f"{' and identifies languages' if mode == 'on' else ''})"
        )


def stage_run(dump: Path, workdir: Path) -> dict:
    from pipelines.ray_runtime import ensure_ray
    from pipelines.registry import parse_config
    from pipelines.runner import Pipeline

    cpus = os.cpu_count() or 1
    cfg = parse_config(
        {
            "run": {"root": str(workdir / "run")},
            "ray": {"num_cpus": cpus},
            "corpus": {"inputs": [{"uri": str(dump), "format": "wikipedia"}], "split_bytes": 400_000},
        }
    )
    ensure_ray(cfg.ray)
    Pipeline(cfg).run("corpus", force=True)  # warm-up: Ray workers start and import
    start = time.perf_counter()
    manifest, _ = Pipeline(cfg).run("corpus", force=True)
    seconds = time.perf_counter() - start
    mb = len(bz2.decompress(dump.read_bytes())) / 2**20
    return {
        "cpus": cpus,
        "seconds": seconds,
        "mb": mb,
        "mb_per_s_per_core": mb / seconds / cpus,
        "documents": manifest.rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--skip-stage", action="store_true", help="skip the whole-stage run on local Ray")
    parser.add_argument("--web", action="store_true", help="web input (the shipped WARC) against datatrove")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.web:
        web_main(args.repeat)
        return

    from bertcore.sample_data import ENWIKI_DUMP, gensim_data_dir

    dump = gensim_data_dir() / ENWIKI_DUMP
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = []
        for repeat in (1, args.repeat):
            path = make_input(dump, repeat, tmp)
            for tool in ("wikiextractor", "bertpipe"):
                r = measure(tool, path)
                rows.append((tool, repeat, r))
        print(f"{'tool':<14} {'input':>7} {'MB xml':>7} {'s':>7} {'MB/s/core':>10} {'peak RSS MB':>12} {'docs':>6}")
        for tool, repeat, r in rows:
            print(
                f"{tool:<14} {'x' + str(repeat):>7} {r['mb']:7.1f} {r['seconds']:7.2f} "
                f"{r['mb_per_s_per_core']:10.2f} {r['peak_rss_mb']:12.0f} {r['documents']:>6}"
            )
        by = {(t, rep): r for t, rep, r in rows}
        for repeat in (1, args.repeat):
            ratio = by[("bertpipe", repeat)]["mb_per_s_per_core"] / by[("wikiextractor", repeat)]["mb_per_s_per_core"]
            print(
                f"speed ratio bertpipe / wikiextractor (x{repeat}): {ratio:.2f}  (bertpipe includes sentence splitting)"
            )
        for tool in ("wikiextractor", "bertpipe"):
            growth = by[(tool, args.repeat)]["peak_rss_mb"] / by[(tool, 1)]["peak_rss_mb"]
            print(f"peak RSS growth x1 -> x{args.repeat}, {tool}: {growth:.2f}")
        if not args.skip_stage:
            s = stage_run(dump, tmp)
            print(
                f"whole corpus stage on local Ray, warm workers ({s['cpus']} CPUs, dedup + split + shards): "
                f"{s['seconds']:.1f} s, "
                f"{s['mb']:.1f} MB xml, {s['mb_per_s_per_core']:.2f} MB/s/core, {s['documents']} documents"
            )


if __name__ == "__main__":
    main()
