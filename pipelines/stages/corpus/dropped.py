"""What the corpus stage's filters removed: counts per filter and per language, and a few
samples of dropped text that `bertpipe inspect corpus --dropped FILTER` shows.

Samples are kept deterministically, whatever the number of workers, the order tasks end
in or their retries: for each filter (a drop reason, or a quality family for the lines it
removed from kept documents), every task keeps the `SAMPLES` documents with the smallest
keyed hash of their document id (a bottom-k sample), and the driver keeps the `SAMPLES`
smallest of the tasks' samples. The bottom k of a union is the bottom k of the parts'
bottom k, so the result is the same as one task over the whole corpus, and the driver
holds at most `SAMPLES` documents per filter, never per-document data.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

from bertcore.text.clean import SAMPLE_CHARS, Cleaned, Dropped
from bertcore.text.reader import RawDocument

SAMPLES = 10
"""Samples kept per filter (the most `inspect --dropped --n` shows)."""
_KEY = b"bertpipe-dropped-sample"


def sample_rank(identity: str, reason: str) -> str:
    """The keyed hash that orders a document among a filter's samples (hex, compared as text)."""
    return hashlib.blake2b(f"{reason}\x1f{identity}".encode(), key=_KEY, digest_size=8).hexdigest()


@dataclass
class Samples:
    """Per filter: the SAMPLES documents with the smallest rank, as small dicts."""

    by_filter: dict[str, list[dict]] = field(default_factory=dict)

    def offer(self, reason: str, sample: dict) -> None:
        kept = self.by_filter.setdefault(reason, [])
        if len(kept) >= SAMPLES and sample["rank"] >= kept[-1]["rank"]:
            return
        kept.append(sample)
        kept.sort(key=lambda s: (s["rank"], s["doc_id"]))
        del kept[SAMPLES:]

    def merge(self, other: Samples, leave_out: set[int] = frozenset()) -> Samples:
        """Add another task's samples (but those of files in `leave_out`)."""
        for reason, samples in other.by_filter.items():
            for sample in samples:
                if sample["file"] not in leave_out:
                    self.offer(reason, sample)
        return self

    def to_json(self) -> dict:
        return {reason: list(samples) for reason, samples in sorted(self.by_filter.items())}

    @classmethod
    def from_json(cls, data: dict) -> Samples:
        return cls({reason: list(samples) for reason, samples in data.items()})


def _sample(
    identity: str,
    reason: str,
    file: int,
    raw: RawDocument,
    text: str,
    rule: str = "",
    detail: str = "",
    language: str = "",
) -> dict:
    return {
        "rank": sample_rank(identity, reason),
        "doc_id": identity,
        "file": file,
        "title": raw.title,
        "url": raw.url,
        "rule": rule,
        "detail": detail,
        "language": language,
        "text": text[:SAMPLE_CHARS],
    }


def record_outcome(
    outcome: Cleaned | Dropped,
    identity: str,
    file: int,
    raw: RawDocument,
    filters: Counter,
    languages: Counter,
    samples: Samples,
) -> None:
    """Count what cleaning one document removed, by filter ("c4/documents", "c4/characters",
    "c4/lines", "c4/rule:curly_braces") and by language ("de/read", "de/kept"), and offer
    it as a sample of its filter."""
    language = outcome.language or "unknown"
    languages[f"{language}/read"] += 1
    if isinstance(outcome, Dropped):
        reason = outcome.reason
        filters[f"{reason}/documents"] += 1
        filters[f"{reason}/characters"] += outcome.chars
        if outcome.rule:
            filters[f"{reason}/rule:{outcome.rule}"] += 1
        samples.offer(
            reason, _sample(identity, reason, file, raw, outcome.text, outcome.rule, outcome.detail, outcome.language)
        )
        return
    languages[f"{language}/kept"] += 1
    for family, lines in outcome.removed.items():
        filters[f"{family}/lines"] += len(lines)
        filters[f"{family}/characters"] += sum(map(len, lines))
        samples.offer(
            family,
            _sample(
                identity, family, file, raw, "\n".join(lines), "lines", f"{len(lines)} lines removed", outcome.language
            ),
        )


def summarise(filters: Counter, languages: Counter) -> tuple[dict, dict]:
    """(per filter {documents, lines, characters, rules}, per language {read, kept}) from
    the counters of `record_outcome` added up over tasks."""
    per_filter: dict[str, dict] = {}
    for key, n in sorted(filters.items()):
        reason, what = key.split("/", 1)
        entry = per_filter.setdefault(reason, {"documents": 0, "lines": 0, "characters": 0, "rules": {}})
        if what.startswith("rule:"):
            entry["rules"][what[5:]] = n
        else:
            entry[what] = n
    per_language: dict[str, dict] = {}
    for key, n in sorted(languages.items()):
        language, what = key.rsplit("/", 1)
        per_language.setdefault(language, {"read": 0, "kept": 0})[what] = n
    ordered = dict(sorted(per_language.items(), key=lambda item: (-item[1]["read"], item[0])))
    return per_filter, ordered


def top_filters(per_filter: dict, n: int = 3) -> str:
    """'c4 1.2M, language 800k, gopher_quality 90k': the filters that removed the most
    characters, for the stage's end line."""
    from pipelines.progress import count

    top = sorted(
        ((e["characters"], name) for name, e in per_filter.items() if e["characters"]), key=lambda t: (-t[0], t[1])
    )[:n]
    return ", ".join(f"{name} {count(chars)}" for chars, name in top) or "none"
