"""Length distributions (characters, words or tokens per sentence) that many tasks count
and one driver adds up: exact counts per length up to a cap, one bucket above it."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Lengths:
    def __init__(self, cap: int = 8192):
        self.cap = cap
        self.counts = np.zeros(cap + 1, dtype=np.int64)  # counts[cap]: every length >= cap
        self.total = 0  # sum of all lengths
        self.max = 0

    def add(self, lengths: Iterable[int] | np.ndarray) -> None:
        values = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
        if values.size == 0:
            return
        self.counts += np.bincount(np.minimum(values, self.cap), minlength=self.cap + 1)
        self.total += int(values.sum())
        self.max = max(self.max, int(values.max()))

    def merge(self, other: Lengths) -> Lengths:
        self.counts += other.counts
        self.total += other.total
        self.max = max(self.max, other.max)
        return self

    # sparse form for task results and manifests: {"counts": {length: n}, "total", "max", "cap"}
    def to_json(self) -> dict:
        nonzero = np.flatnonzero(self.counts)
        return {
            "cap": self.cap,
            "total": self.total,
            "max": self.max,
            "counts": {int(i): int(self.counts[i]) for i in nonzero},
        }

    @classmethod
    def from_json(cls, data: dict) -> Lengths:
        out = cls(data["cap"])
        for length, n in data["counts"].items():
            out.counts[int(length)] = n
        out.total, out.max = data["total"], data["max"]
        return out

    def summary(self, over: Iterable[int] = ()) -> dict:
        """count, mean, p50/p90/p99, max; per threshold t in `over`: the share of items
        longer than t and the share of all length (characters, tokens) they hold."""
        n = int(self.counts.sum())
        if n == 0:
            return {"count": 0}
        cumulative = np.cumsum(self.counts)
        out: dict = {"count": n, "mean": round(self.total / n, 2)}
        for q in (50, 90, 99):
            out[f"p{q}"] = int(np.searchsorted(cumulative, q / 100 * n))
        out["max"] = self.max
        lengths = np.arange(self.cap + 1)
        below_sum = np.cumsum(self.counts * lengths)
        for t in over:
            t = min(t, self.cap - 1)
            items = n - int(cumulative[t])
            held = self.total - int(below_sum[t])
            out[f"over_{t}"] = {
                "share": round(items / n, 5),
                "share_of_length": round(held / self.total, 5) if self.total else 0.0,
            }
        return out
