"""Whether the requests that wait together run as one batch (`serve.batching`): `on`, `off`,
or `auto`, which measures as it serves what a token costs each way and batches only while
batches measure cheaper.

Why measure: a batch pads its rows to its longest, so on a CPU, batches of texts of mixed
lengths can cost more per text than the same texts one at a time (benchmarks/serve.py
measured batching at 0.68-0.85x the throughput of one request at a time on a 2-core
CPU), while a device that computes a batch in parallel is the other way round. Which way
pays depends on the hardware, the model and the traffic, so `auto` finds out:

- a cost is the model thread's seconds per token read (padding not counted: the padding is
  part of what a batch costs), over each way's recent runs (sums that halve every
  HALF_LIFE_TOKENS tokens of that way);
- only runs made while more than one request waited count (a lone request runs alone
  whichever way is chosen, and runs at low load are not comparable with runs under load);
- it starts alone (the engine runs on the CPU), measures MIN_TOKENS that way, then
  MIN_TOKENS batched, then takes the cheaper way, and runs the other way once whenever
  the chosen way has run EXPLORE_RATIO times the tokens of the other way's last run, so
  about 1/(1 + EXPLORE_RATIO) of the work keeps the other figure fresh and a change in
  load or texts can turn the choice.

No clock or thread here: the batcher (batcher.py) asks `way()` before each batch and
reports each run's tokens and seconds to `record`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

ALONE, BATCHED = "alone", "batched"
SETTINGS = ("auto", "on", "off")
MIN_TOKENS = 2048
"""Tokens measured each way before auto compares them."""
HALF_LIFE_TOKENS = 16_000
EXPLORE_RATIO = 19


@dataclass
class _Cost:
    seconds: float = 0.0
    tokens: float = 0.0
    measured: int = 0
    """Tokens measured in all (not decayed)."""
    last: int = 0
    """Tokens of the last run."""

    def add(self, tokens: int, seconds: float) -> None:
        keep = 0.5 ** (tokens / HALF_LIFE_TOKENS)
        self.seconds = self.seconds * keep + seconds
        self.tokens = self.tokens * keep + tokens
        self.measured += tokens
        self.last = tokens

    @property
    def per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens else None


class BatchChoice:
    """One server's choice between running waiting requests batched or alone (see the
    module docstring)."""

    def __init__(self, setting: str = "auto"):
        if setting not in SETTINGS:
            raise ValueError(f"batching must be one of {', '.join(SETTINGS)}, got {setting!r}")
        self.setting = setting
        self.costs = {ALONE: _Cost(), BATCHED: _Cost()}
        self.chosen = BATCHED if setting == "on" else ALONE
        self._since = 0  # tokens run the chosen way since the other way last ran

    @classmethod
    def of(cls, section) -> BatchChoice:
        """The choice the serve: section sets: `batching`, off when max_batch_requests is 1."""
        return cls("off" if section.max_batch_requests == 1 else section.batching)

    def way(self) -> str:
        """How the next batch runs when more than one request waits: BATCHED or ALONE."""
        if self.setting != "auto":
            return self.chosen
        for way in (ALONE, BATCHED):  # measure each way first
            if self.costs[way].measured < MIN_TOKENS:
                return way
        other = BATCHED if self.chosen == ALONE else ALONE
        return other if self._since >= EXPLORE_RATIO * max(1, self.costs[other].last) else self.chosen

    def record(self, way: str, tokens: int, seconds: float) -> None:
        """A run made `way` while more than one request waited: `tokens` read in `seconds`."""
        if self.setting != "auto" or tokens <= 0:
            return
        self.costs[way].add(tokens, seconds)
        self._since = self._since + tokens if way == self.chosen else 0
        alone, batched = self.costs[ALONE], self.costs[BATCHED]
        if min(alone.measured, batched.measured) < MIN_TOKENS:
            return
        best = BATCHED if batched.per_token < alone.per_token else ALONE
        if best != self.chosen:
            self.chosen, self._since = best, 0
            log.info("bertpipe serve: batching (auto) now runs requests %s: %s", best, self.figures())

    def figures(self) -> str:
        """What was measured, for a log line: ms per 1,000 tokens each way."""
        return ", ".join(
            f"{way} not measured" if cost.per_token is None else f"{way} {1e6 * cost.per_token:.1f} ms per 1k tokens"
            for way, cost in self.costs.items()
        )

    def describe(self) -> str:
        """The start line's words for the setting."""
        if self.setting == "on":
            return "batching on"
        if self.setting == "off":
            return "batching off (each request alone)"
        return "batching auto (starts alone; batches only while batches measure cheaper per token)"

    def state(self) -> dict:
        """/info's `batching` figures: the setting, the way chosen now, and what each way measured."""
        return {
            "setting": self.setting,
            "now": self.chosen,
            "measured": {
                way: {
                    "ms_per_1k_tokens": None if cost.per_token is None else round(1e6 * cost.per_token, 3),
                    "tokens": cost.measured,
                }
                for way, cost in self.costs.items()
            }
            if self.setting == "auto"
            else None,
        }
