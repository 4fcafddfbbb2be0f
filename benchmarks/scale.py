"""Real inputs at real scale: the corpus and examples stages on a Wikipedia dump of
`--xml-mb` megabytes of XML (default 1024), built from the shipped enwiki sample.

Input: the sample's 206 pages repeated with new page ids and titles and a first sentence
that names the copy ("This is copy 17 of the article."), so exact deduplication keeps
every copy, until the XML reaches --xml-mb. It is written three times: as one bzip2 stream
(`single`, level 9: tasks decode the bzip2 blocks of their compressed byte ranges), as
Wikimedia publishes big dumps, 100 pages per stream with the `-index.txt.bz2` beside it
(`multi`, level 9), and as one gzip stream (`gzip`, level 6: one task decompresses it
with Python's gzip and hands chunks of whole pages to the cleaning tasks). The x1 input is the
sample itself, written the same three ways.

Runs, each in a fresh process on an embedded local Ray with `ray.num_cpus` = the number of
workers (benchmarks/vocab.py's run_stage_measured: workers warm, Ray settled, not timed):
- corpus stage: multi, single and gzip at full size with 1 and 2 workers, each at x1 with
  2; `corpus.split_bytes` = compressed size / 8, rounded up (at least 1 MiB), so each has several
  units (the multistream and bzip2 block ranges; the gzip file's cleaning batches);
- vocab stage once on the full multi corpus (not measured), then the examples stage on it
  with 1 and 2 workers (seq128, dupe_factor 1, as benchmarks/examples.py), and at x1;
- `Tokenizer.encode_batch_fast` over every sentence of the same corpus with the same
  tokenizer, in one process (benchmarks/examples.py's run_tokenizer): the baseline.

Printed: MB of XML per second per core (wall) and per CPU-second (the process tree's
CPU time: steadier when other work shares the machine), scaling efficiency 1 -> 2 workers
(t1 / t2 / 2) of each form, bytes decompressed / XML bytes (what the decompressors handed
out, the tasks alone, and with the bytes the driver decompressed to plan), peak RSS of the
driver and of the largest Ray worker at x1 and at full size, the examples stage's corpus
tokens per CPU-second against encode_batch_fast's, and a markdown table projecting wall
time and cost for the English Wikipedia plus a BookCorpus-sized book set on 1, 8 and 64
nodes, computed from the rates measured here (the assumptions are printed with it).

    python benchmarks/scale.py [--xml-mb 1024] [--workdir DIR] [--trials 1]
        [--cores-per-node 32] [--node-hour-usd 1.5] [--loader-json loader.json]

A check at small size: `python benchmarks/scale.py --xml-mb 40`.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not an installed package

from benchmarks.examples import EXAMPLES, run_tokenizer
from benchmarks.vocab import ENV, demo_config, measure, run_stage_measured

NAME = "enwiki-20990101-pages-articles-multistream"
# what the projection scales to
ENWIKI_XML_GB = 90.0  # English Wikipedia pages-articles, uncompressed (about 22 GB as multistream .bz2)
BOOKS_TEXT_GB = 4.6  # a BookCorpus-sized set: about 11,000 books, about 1 billion words


# -- the input --------------------------------------------------------------------------------


def copies_of(pages: list[tuple[int, str, bytes]], copies: int):
    """The pages `copies` times: copy k has ids + k * 10^8, titles "T (k)" and a sentence
    naming the copy at the end of its text (so no copy is an exact duplicate)."""
    for k in range(copies):
        for page_id, title, page in pages:
            if k:
                new_title = f"{title} ({k})"
                page = page.replace(f"<title>{title}</title>".encode(), f"<title>{new_title}</title>".encode(), 1)
                page = re.sub(
                    rb"<id>(\d+)</id>",
                    lambda m: b"<id>%d</id>" % (int(m.group(1)) + k * 10**8),  # noqa: B023 - re.sub calls it at once
                    page,
                    count=1,
                )
                # at the start of the text: the end is back matter (References, ...), which is dropped
                page = re.sub(
                    rb"(<text[^>]*>)",
                    lambda m: m.group(1) + f"This is copy {k} of the article.\n\n".encode(),  # noqa: B023 - run at once
                    page,
                    count=1,
                )
                page_id, title = page_id + k * 10**8, new_title
            yield page_id, title, page


FORMS = ("multi", "single", "gzip")


def build(folder: Path, xml_mb: float) -> dict[str, Path]:
    """single/NAME.xml.bz2, multi/NAME.xml.bz2 (+ index) and gzip/NAME.xml.gz of about
    `xml_mb` MB of XML (xml_mb <= 0: the sample as shipped). Reused when already there."""
    from bertcore.sample_data import ENWIKI_DUMP, gensim_data_dir
    from bertcore.text.multistream import split_dump, write_multistream

    paths = {
        "single": folder / "single" / f"{NAME}.xml.bz2",
        "multi": folder / "multi" / f"{NAME}.xml.bz2",
        "gzip": folder / "gzip" / f"{NAME}.xml.gz",
    }
    done = folder / "built.json"
    if done.exists() and all(p.exists() for p in paths.values()):
        return {**paths, **json.loads(done.read_text())}
    header, pages, footer = split_dump(bz2.decompress((gensim_data_dir() / ENWIKI_DUMP).read_bytes()))
    one = sum(len(p) for _, _, p in pages)
    copies = max(1, round(xml_mb * 2**20 / one)) if xml_mb > 0 else 1
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    size = len(header) + len(footer)
    compressor = bz2.BZ2Compressor(9)
    with open(paths["single"], "wb") as out, gzip.GzipFile(paths["gzip"], "wb", compresslevel=6, mtime=0) as gz:
        out.write(compressor.compress(header))
        gz.write(header)
        for _, _, page in copies_of(pages, copies):
            out.write(compressor.compress(page))
            gz.write(page)
            size += len(page)
        out.write(compressor.compress(footer) + compressor.flush())
        gz.write(footer)
    index = folder / "multi" / f"{NAME}-index.txt"
    with open(paths["multi"], "wb") as out, open(index, "wb") as index_out:
        write_multistream(header, copies_of(pages, copies), footer, out, index_out)
    index.with_suffix(".txt.bz2").write_bytes(bz2.compress(index.read_bytes()))
    index.unlink()
    facts = {"xml_bytes": size, "copies": copies, "build_s": round(time.perf_counter() - start, 1)}
    done.write_text(json.dumps(facts))
    return {**paths, **facts}


# -- measured runs (each in a fresh process) -------------------------------------------------------


def corpus_overrides(dump: Path, workers: int) -> list[str]:
    split = max(
        2**20, -(-dump.stat().st_size // 8)
    )  # rounded up: 8 byte ranges, not 9 (a ninth would run alone at the end)
    return [
        f"ray.num_cpus={workers}",
        f"corpus.inputs=[{{uri: '{dump}', name: enwiki}}]",
        f"corpus.split_bytes={split}",
        "corpus.validation_fraction=0.01",
    ]


def child_corpus(root: str, dump: str, workers: int) -> dict:
    manifest, measured = run_stage_measured("corpus", demo_config(Path(root), corpus_overrides(Path(dump), workers)))
    return {
        **measured,
        "stats": {
            k: manifest.stats[k]
            for k in ("bytes", "work_units", "streamed_units", "characters", "sentences", "documents_kept")
        },
    }


def child_examples(root: str, dump: str, workers: int) -> dict:
    overrides = [*corpus_overrides(Path(dump), workers), *EXAMPLES]
    manifest, measured = run_stage_measured("examples", demo_config(Path(root), overrides))
    phase = manifest.stats["phases"]["seq128"]
    return {
        **measured,
        "out_tokens": sum(s["tokens"] for s in phase.values()),
        "sentence_tokens": manifest.stats["sentence_tokens"],
    }


def child_tokenizer(root: str, dump: str, workers: int) -> dict:
    return run_tokenizer(Path(root), workers, "encode_batch_fast")


CHILDREN = {"corpus": child_corpus, "examples": child_examples, "tokenizer": child_tokenizer}


def prepare_vocab(root: Path, dump: Path) -> None:
    """The vocab stage on the corpus under `root` (not measured)."""
    import ray

    from pipelines.ray_runtime import ensure_ray
    from pipelines.runner import Pipeline

    cfg = demo_config(root, corpus_overrides(dump, os.cpu_count() or 1))
    ensure_ray(cfg.ray)
    Pipeline(cfg).run("vocab")
    ray.shutdown()


# -- report -------------------------------------------------------------------------------------


def loader_row(path: Path | None) -> str | None:
    """The projection's last row: loader cores one GPU needs (benchmarks/loader.py --json)."""
    if path is None:
        return None
    cores = {(c["model"], c["seq"], c["masking"]): c["bertpipe"] for c in json.loads(path.read_text())["cores_per_gpu"]}

    def cell(size: str) -> str:
        parts = [
            f"{cores[(size, seq, 'dynamic-wwm')]:.2f} (seq{seq})"
            for seq in (128, 512)
            if cores.get((size, seq, "dynamic-wwm")) is not None
        ]
        return f"BERT-{size}: " + ", ".join(parts)

    return (
        f"| loader cores per GPU (H100 at 50% MFU, dynamic whole-word masking; benchmarks/loader.py) | {cell('base')} "
        f"| {cell('large')} | {cell('small')} | {cell('mini')} |"
    )


def projection(
    rate_per_core: float,
    efficiency: float,
    tokens_per_char: float,
    chars_per_xml_byte: float,
    examples_tokens_per_cpu_s: float,
    cores: int,
    usd: float,
    loader: str | None = None,
) -> str:
    """Markdown: wall time and cost of corpus + examples for English Wikipedia and a
    BookCorpus-sized book set on 1, 8 and 64 nodes of `cores` cores; with `loader`, a last
    row of the loader cores one GPU needs."""
    from pipelines.progress import duration

    xml_mb = ENWIKI_XML_GB * 1024
    text_chars = ENWIKI_XML_GB * 2**30 * chars_per_xml_byte + BOOKS_TEXT_GB * 2**30
    tokens = text_chars * tokens_per_char
    lines = [
        (
            f"| nodes ({cores} cores each) | corpus stage | examples stage (seq128, 1 pass) | node-hours | cost "
            f"at ${usd:.2f}/node-hour |"
        ),
        "|---|---|---|---|---|",
    ]
    for nodes in (1, 8, 64):
        workers = nodes * cores
        corpus_s = (xml_mb + BOOKS_TEXT_GB * 1024) / (rate_per_core * workers * efficiency)
        examples_s = tokens / (examples_tokens_per_cpu_s * workers * efficiency)
        hours = (corpus_s + examples_s) / 3600
        lines.append(
            f"| {nodes} | {duration(corpus_s)} | {duration(examples_s)} | {hours * nodes:.2f} | "
            f"${hours * nodes * usd:,.2f} |"
        )
    if loader:
        lines.append(loader)
    return "\n".join(lines)


def report(args, inputs, results) -> None:
    xml_mb = inputs["full"]["xml_bytes"] / 2**20
    sizes = ", ".join(f"{form} {inputs['full'][form].stat().st_size / 2**20:.0f} MB" for form in FORMS)
    print(
        f"input: {xml_mb:.0f} MB of XML ({inputs['full']['copies']} copies of the sample; built in "
        f"{inputs['full']['build_s']} s), x1 {inputs['x1']['xml_bytes'] / 2**20:.1f} MB; compressed: {sizes}"
    )
    print(
        f"{'run':<26} {'s':>8} {'CPU s':>8} {'MB/s/core':>10} {'MB/CPU-s':>9} {'decompressed/XML':>17} "
        f"{'+planning':>10} {'RSS driver MB':>14} {'RSS worker MB':>14}  trials"
    )
    for key, r in results.items():
        kind, size, form, workers = key
        mb = (inputs[size]["xml_bytes"] / 2**20) if kind == "corpus" else None
        line = f"{kind + ' ' + size + ' ' + form + ' w' + str(workers):<26} {r['seconds']:8.1f} {r['cpu_s']:8.1f} "
        if kind == "corpus":
            b = r["stats"]["bytes"]
            line += (
                f"{mb / r['seconds'] / workers:10.2f} {mb / r['cpu_s']:9.2f} "
                f"{b['decompressed'] / inputs[size]['xml_bytes']:17.4f} "
                f"{(b['decompressed'] + b['planning']) / inputs[size]['xml_bytes']:10.4f} "
            )
        else:
            line += f"{'':>10} {'':>9} {'':>17} {'':>10} "
        line += f"{r['peak_rss_driver_mb']:14.0f} {r.get('peak_rss_worker_mb', 0):14.0f}  {r['trials']}"
        print(line)
    for form in FORMS:
        t1, t2 = results[("corpus", "full", form, 1)]["seconds"], results[("corpus", "full", form, 2)]["seconds"]
        print(f"corpus {form}: scaling efficiency 1 -> 2 workers {t1 / t2 / 2:.2f} (goal >= 0.85)")
    for form in FORMS:
        a, b = results[("corpus", "x1", form, 2)], results[("corpus", "full", form, 2)]
        print(
            f"corpus {form}: peak RSS x1 -> full ({xml_mb / (inputs['x1']['xml_bytes'] / 2**20):.0f}x the input): "
            f"driver {b['peak_rss_driver_mb'] / a['peak_rss_driver_mb']:.2f}, largest worker "
            f"{b['peak_rss_worker_mb'] / a['peak_rss_worker_mb']:.2f} (goal <= 1.1)"
        )
    if args.corpus_only:
        return
    tok = results[("tokenizer", "full", "multi", os.cpu_count() or 1)]
    scaling = (
        results[("examples", "full", "multi", 1)]["seconds"] / results[("examples", "full", "multi", 2)]["seconds"]
    )
    for workers in (1, 2):
        ex = results[("examples", "full", "multi", workers)]
        busy = ex["cpu_s"] - ex["idle_cpu_per_s"] * ex["seconds"]  # less what Ray's own processes burn when idle
        print(
            f"examples w{workers}: corpus tokens per CPU-second {tok['tokens'] / ex['cpu_s']:,.0f} vs "
            f"encode_batch_fast {tok['tokens'] / tok['cpu_s']:,.0f}: ratio {tok['cpu_s'] / ex['cpu_s']:.2f} "
            f"(goal >= 1.0), {tok['cpu_s'] / busy:.2f} less Ray's idle CPU ({ex['idle_cpu_per_s']:.2f} s/s); "
            f"scaling 1 -> 2 {scaling / 2:.2f}"
        )
    ex1, ex2 = results[("examples", "x1", "multi", 2)], results[("examples", "full", "multi", 2)]
    print(
        f"examples: peak RSS x1 -> full: driver {ex2['peak_rss_driver_mb'] / ex1['peak_rss_driver_mb']:.2f}, "
        f"largest worker {ex2['peak_rss_worker_mb'] / ex1['peak_rss_worker_mb']:.2f}"
    )
    print(f"examples tokens per sentence (full corpus): {json.dumps(ex2['sentence_tokens'])}")

    multi1, multi2 = results[("corpus", "full", "multi", 1)], results[("corpus", "full", "multi", 2)]
    rate = xml_mb / multi1["seconds"]
    efficiency = min(1.0, multi1["seconds"] / multi2["seconds"] / 2)
    chars_per_xml_byte = multi2["stats"]["characters"] / inputs["full"]["xml_bytes"]
    tokens_per_char = tok["tokens"] / multi2["stats"]["characters"]
    examples_rate = tok["tokens"] / results[("examples", "full", "multi", 1)]["cpu_s"]
    print()
    print(
        f"Projection (markdown): English Wikipedia ({ENWIKI_XML_GB:.0f} GB of XML as a multistream dump) + a "
        "BookCorpus-sized "
        f"book set ({BOOKS_TEXT_GB} GB of text, counted at the Wikipedia XML rate: book text needs no "
        "wikitext parsing, so "
        f"this is an upper bound), from this run: {rate:.2f} MB of XML/s per core (1 worker, multistream), scaling "
        f"efficiency {efficiency:.2f} applied to every node count (measured 1 -> 2 workers only), "
        f"{chars_per_xml_byte:.3f} "
        f"characters of corpus text per XML byte, {tokens_per_char:.3f} tokens per character, "
        f"{examples_rate:,.0f} corpus "
        f"tokens per CPU-second in the examples stage; {args.cores_per_node} cores per node, "
        f"${args.node_hour_usd}/node-hour; "
        "the vocab stage (sampled, one node) and reading from object storage are not included."
    )
    print()
    print(
        projection(
            rate,
            efficiency,
            tokens_per_char,
            chars_per_xml_byte,
            examples_rate,
            args.cores_per_node,
            args.node_hour_usd,
            loader_row(args.loader_json),
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xml-mb", type=float, default=1024, help="MB of XML of the full-size input")
    parser.add_argument(
        "--workdir", type=Path, help="keep inputs and runs here (inputs are reused); default: a temporary folder"
    )
    parser.add_argument("--trials", type=int, default=1, help="runs per row; the fastest is reported")
    parser.add_argument("--cores-per-node", type=int, default=32)
    parser.add_argument("--node-hour-usd", type=float, default=1.5)
    parser.add_argument(
        "--loader-json", type=Path, help="benchmarks/loader.py --json output: adds the loader cores per GPU row"
    )
    parser.add_argument(
        "--corpus-only", action="store_true", help="the corpus stage's rows only (no examples stage, no projection)"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, root, dump, workers = args.child
        print(json.dumps(CHILDREN[kind](root, dump, int(workers))))
        return
    os.environ.update(ENV)
    with tempfile.TemporaryDirectory(prefix="bertpipe-scale-") as tmp:
        work = args.workdir or Path(tmp)
        inputs = {"x1": build(work / "input-x1", 0), "full": build(work / f"input-{args.xml_mb:g}mb", args.xml_mb)}
        jobs = {}
        for size, form, workers in [("x1", form, 2) for form in FORMS] + [
            ("full", form, w) for form in FORMS for w in (1, 2)
        ]:
            jobs[("corpus", size, form, workers)] = [
                "--child",
                "corpus",
                str(work / f"run-{size}-{form}"),
                str(inputs[size][form]),
                str(workers),
            ]
        results = measure(__file__, jobs, args.trials)
        if args.corpus_only:
            report(args, inputs, results)
            return
        for size in ("x1", "full"):
            prepare_vocab(work / f"run-{size}-multi", inputs[size]["multi"])
        jobs = {
            ("examples", size, "multi", w): [
                "--child",
                "examples",
                str(work / f"run-{size}-multi"),
                str(inputs[size]["multi"]),
                str(w),
            ]
            for size, w in (("x1", 2), ("full", 1), ("full", 2))
        }
        cpus = os.cpu_count() or 1
        jobs[("tokenizer", "full", "multi", cpus)] = [
            "--child",
            "tokenizer",
            str(work / "run-full-multi"),
            str(inputs["full"]["multi"]),
            str(cpus),
        ]
        results.update(measure(__file__, jobs, args.trials))
        report(args, inputs, results)


if __name__ == "__main__":
    main()
