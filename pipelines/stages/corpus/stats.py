"""The corpus stage's statistics: what was read, kept and dropped per source, how many
bytes of each input were read and decompressed, and how long sentences are."""

from __future__ import annotations

from collections import Counter, defaultdict

from bertcore.text.lengths import Lengths
from pipelines.stages.corpus.dropped import Samples, summarise

SPLITS = ("train", "validation")
_FILE_COUNTS = ("long_sentences_split", "boilerplate_chars")
_DEDUP_REASONS = ("duplicate", "near_duplicate")


def _per_source(files, results, failed: dict, plans) -> dict:
    per_source: dict[str, dict] = defaultdict(
        lambda: {
            "read": 0,
            "kept": 0,
            "dropped": Counter(),
            "sentences": 0,
            "characters": 0,
            **dict.fromkeys(_FILE_COUNTS, 0),
        }
    )
    for result in results:
        for index, n in result.read.items():
            if index not in failed:
                per_source[files[index].source]["read"] += n
        for index, dropped in result.dropped.items():
            if index not in failed:
                per_source[files[index].source]["dropped"].update(dropped)
        for index, counts in result.files.items():
            if index not in failed:
                for key in _FILE_COUNTS:
                    per_source[files[index].source][key] += counts.get(key, 0)
    for plan in plans:  # what deduplication removed and what was kept, per input file
        for index, counts in plan.files.items():
            entry = per_source[files[index].source]
            for reason in _DEDUP_REASONS:
                if counts[reason]:
                    entry["dropped"][reason] += counts[reason]
            for key in ("kept", "sentences", "characters"):
                entry[key] += counts[key]
    return per_source


def _inputs(files, plan, results) -> dict:
    """Per input file: its size and the bytes read from it, decompressed, and read by the
    driver to plan it; what a cut-off tail lost."""
    counts: dict[int, Counter] = defaultdict(Counter)
    for result in results:
        for index, c in result.files.items():
            counts[index].update({k: v for k, v in c.items() if k not in _FILE_COUNTS})
    warc_keys = sorted({k for c in counts.values() for k in c if k.startswith("warc_")})
    units = Counter(index for unit in plan.units for index in unit.files)
    out = {}
    for file in files:
        c = counts[file.index]
        out[file.uri] = {
            "size": file.size,
            "units": units[file.index],
            "compressed_bytes_read": c["compressed_bytes_read"],
            "decompressed_bytes": c["decompressed_bytes"],
            "planning_bytes": plan.planning_bytes.get(file.index, 0),
            **(
                {"truncated_records": c["truncated_records"], "truncated_bytes": c["truncated_bytes"]}
                if c["truncated_bytes"]
                else {}
            ),
            # WARC/WET: records per kind, documents, malformed records (counted and skipped)
            **({"warc_records": {k[5:]: c[k] for k in warc_keys if c[k]}} if any(c[k] for k in warc_keys) else {}),
        }
    return out


def statistics(files, plan, results, failed: dict, plans, shards) -> dict:
    per_source = _per_source(files, results, failed, plans)
    splits = {}
    for split in SPLITS:
        split_shards = [s for s in shards if s.path.startswith(split + "/")]
        splits[split] = {
            "documents": sum(s.rows for s in split_shards),
            "sentences": sum(s.extra["sentences"] for s in split_shards),
            "characters": sum(s.extra["chars"] for s in split_shards),
            "shards": len(split_shards),
        }
    dropped_total = Counter()
    for entry in per_source.values():
        dropped_total.update(entry["dropped"])
        entry["dropped"] = dict(sorted(entry["dropped"].items()))
    chars, words = Lengths(), Lengths(1024)
    for result in results:
        chars.merge(result.chars)
        words.merge(result.words)
    inputs = _inputs(files, plan, results)
    filters, languages, samples = Counter(), Counter(), Samples()
    for result in results:
        for index in set(result.filters) | set(result.languages):
            if index not in failed:
                filters.update(result.filters.get(index, {}))
                languages.update(result.languages.get(index, {}))
        samples.merge(result.samples, leave_out=set(failed))
    per_filter, per_language = summarise(filters, languages)
    return {
        "documents_read": sum(e["read"] for e in per_source.values()),
        "documents_kept": sum(e["kept"] for e in per_source.values()),
        "dropped": dict(sorted(dropped_total.items())),
        "splits": splits,
        "sentences": sum(v["sentences"] for v in splits.values()),
        "characters": sum(v["characters"] for v in splits.values()),
        "long_sentences_split": sum(e["long_sentences_split"] for e in per_source.values()),
        # per drop reason or quality filter: documents dropped, lines removed from kept ones, characters of both
        "filters": per_filter,
        "languages": per_language,  # documents read and kept (before deduplication) per detected language
        "dropped_samples": samples.to_json(),  # bertpipe inspect corpus --dropped FILTER
        # before deduplication: every sentence of every document that passed the filters
        "sentence_lengths": {"characters": chars.summary(over=(500, 1000)), "words": words.summary(over=(64, 128))},
        "per_source": dict(sorted(per_source.items())),
        "bytes": {
            "input": sum(f.size for f in files),
            "compressed_read": sum(v["compressed_bytes_read"] for v in inputs.values()),
            "decompressed": sum(v["decompressed_bytes"] for v in inputs.values()),
            "planning": sum(v["planning_bytes"] for v in inputs.values()),
        },
        "inputs": inputs,
        "files": len(files),
        "work_units": len(plan.units),
        "streamed_units": sum(u.streamed for u in plan.units),
    }
