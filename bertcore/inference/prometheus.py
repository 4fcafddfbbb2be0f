"""The service's counters and histograms, and their Prometheus text exposition (format
0.0.4: `# HELP`, `# TYPE`, one sample per line; histograms as cumulative `_bucket{le=...}`
samples with `_sum` and `_count`).

Each replica keeps its own `Metrics`; `snapshot()` is a plain dict (for sending between
processes) and `render` writes the snapshots of every replica, each sample labelled with
its replica, in one page.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds."""
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    """counter or histogram."""
    help: str
    buckets: tuple[float, ...] = ()


SPECS = {
    spec.name: spec
    for spec in (
        Spec("bertpipe_requests_total", "counter", "Requests answered, by endpoint and HTTP status code."),
        Spec(
            "bertpipe_texts_total",
            "counter",
            "Inputs in the requests a batch ran, by kind of work (embed, classify, fill_mask, tokenize).",
        ),
        Spec(
            "bertpipe_request_seconds",
            "histogram",
            "Time from a request's arrival at the server to its answer, by endpoint.",
            LATENCY_BUCKETS,
        ),
        Spec(
            "bertpipe_queue_seconds",
            "histogram",
            "Time a request waited for its batch to start, by kind of work.",
            LATENCY_BUCKETS,
        ),
        Spec(
            "bertpipe_unknown_tokens_total",
            "counter",
            "Tokens of the inputs that the vocabulary could not read ([UNK]), by kind of work.",
        ),
        Spec(
            "bertpipe_unreadable_inputs_total",
            "counter",
            "Inputs that were nothing but unknown tokens (answered and flagged, or refused), by kind of work.",
        ),
        Spec("bertpipe_batch_requests", "histogram", "Requests per batch.", SIZE_BUCKETS),
        Spec("bertpipe_call_rows", "histogram", "Rows (texts or windows) per model call.", SIZE_BUCKETS),
        Spec("bertpipe_call_tokens", "histogram", "Tokens per model call, padding included.", TOKEN_BUCKETS),
        Spec("bertpipe_call_seconds", "histogram", "Time of one model call (the forward pass).", LATENCY_BUCKETS),
    )
}


class Metrics:
    """One replica's metrics (see SPECS): `count` adds to a counter, `observe` records one
    value in a histogram, each under its labels."""

    def __init__(self) -> None:
        self._values: dict[str, dict[tuple[tuple[str, str], ...], list[float]]] = {name: {} for name in SPECS}

    def count(self, name: str, value: float = 1.0, **labels: str) -> None:
        series = self._series(name, "counter", labels)
        series[0] += value

    def observe(self, name: str, value: float, **labels: str) -> None:
        spec = SPECS[name]
        series = self._series(name, "histogram", labels)
        series[bisect.bisect_left(spec.buckets, value)] += 1  # the first bucket with value <= le; the last slot: +Inf
        series[-2] += value
        series[-1] += 1

    def _series(self, name: str, kind: str, labels: Mapping[str, str]) -> list[float]:
        spec = SPECS[name]
        if spec.kind != kind:
            raise ValueError(f"{name} is a {spec.kind}")
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        size = 1 if kind == "counter" else len(spec.buckets) + 3  # per bucket, +Inf, sum, count
        return self._values[name].setdefault(key, [0.0] * size)

    def snapshot(self) -> dict[str, list]:
        """{metric: [[labels as [key, value] pairs, values], ...]}: JSON-able, for `render`."""
        return {
            name: [[list(map(list, key)), list(values)] for key, values in series.items()]
            for name, series in self._values.items()
        }


def render(snapshots: Mapping[str, Mapping[str, list]]) -> str:
    """The Prometheus text page of the snapshots of every replica ({replica: snapshot})."""
    lines: list[str] = []
    for name, spec in SPECS.items():
        lines += [f"# HELP {name} {spec.help}", f"# TYPE {name} {spec.kind}"]
        for replica, snapshot in sorted(snapshots.items()):
            for pairs, values in sorted(snapshot.get(name, []), key=lambda item: item[0]):
                labels = [("replica", replica), *map(tuple, pairs)]
                if spec.kind == "counter":
                    lines.append(f"{name}{_labels(labels)} {_number(values[0])}")
                    continue
                cumulative = 0.0
                for bound, count in zip((*spec.buckets, math.inf), values):
                    cumulative += count
                    lines.append(f"{name}_bucket{_labels([*labels, ('le', _number(bound))])} {_number(cumulative)}")
                lines.append(f"{name}_sum{_labels(labels)} {_number(values[-2])}")
                lines.append(f"{name}_count{_labels(labels)} {_number(values[-1])}")
    return "\n".join(lines) + "\n"


def _labels(pairs) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in pairs) + "}"


def _escape(value: object) -> str:
    """A label value as the text format quotes it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))
