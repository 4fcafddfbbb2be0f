"""Progress of a stage's work, logged at a steady cadence.

A `Progress` counts units done of a known total (with rows and input bytes where the
caller knows them) and logs one INFO line at most every `interval_s` seconds, and always
one when the last unit is done, so a stage shows progress whatever its length and a long
one does not flood the log. A line reads

    corpus: clean 4/6 units · 212 rows · 1.9 MB/s · 3.1s · ETA 1.6s

Where output is a terminal, a transient bar is drawn as well; the log lines are what
reaches Prefect's flow-run log and files.

The ETA goes by count, by input bytes, or, for tasks of unequal cost, by what is left to
compute (`Forecast`).
"""

from __future__ import annotations

import heapq
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from bertcore.figures import count, duration, size  # noqa: F401 - how figures are written, shared with bertcore

log = logging.getLogger(__name__)

INTERVAL_ENV = "BERTPIPE_PROGRESS_INTERVAL_S"
"""Environment variable that sets the seconds between progress lines (default 10)."""
DEFAULT_INTERVAL_S = 10.0


def interval_s() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


def byte_rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / max(seconds, 1e-9) / 1e6:.1f} MB/s"


def is_terminal() -> bool:
    return sys.stderr.isatty()


class Progress:
    """Units done of `total`, logged as `<label> k/n units · rows · MB/s · elapsed · ETA`.

    `total_bytes` (the input size of all units) turns on the MB/s figure and an ETA by
    bytes, which suits units of unequal size better than one by count; `eta` (seconds left,
    or None) replaces both with the caller's own (`Forecast`: by expected cost)."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "units",
        total_bytes: int | None = None,
        interval: float | None = None,
        logger: logging.Logger | None = None,
        bar: bool | None = None,
        eta: Callable[[], float | None] | None = None,
    ):
        self.label, self.total, self.unit = label, total, unit
        self._eta = eta
        self.total_bytes = total_bytes or None
        self.interval = interval_s() if interval is None else interval
        self.log = logger or log
        self.done = self.rows = self.bytes = 0
        self.started = self.last_line = time.perf_counter()
        show_bar = is_terminal() if bar is None else bar
        self._bar = (
            tqdm(total=total, desc=label, unit=unit[:-1] if unit.endswith("s") else unit, leave=False)
            if show_bar
            else None
        )

    def advance(self, n: int = 1, *, rows: int = 0, nbytes: int = 0) -> None:
        self.done += n
        self.rows += rows
        self.bytes += nbytes
        if self._bar is not None:
            self._bar.update(n)
        now = time.perf_counter()
        finished = n > 0 and self.done >= self.total  # the line that says all is done, once
        if finished or now - self.last_line >= self.interval:
            self.last_line = now
            self._emit(now - self.started)

    def eta(self, elapsed: float) -> float | None:
        if self.done >= self.total:
            return 0.0
        if self._eta is not None:
            return self._eta()
        if self.total_bytes and self.bytes:
            return elapsed * (self.total_bytes - self.bytes) / self.bytes
        if self.done:
            return elapsed * (self.total - self.done) / self.done
        return None

    def line(self, elapsed: float) -> str:
        parts = [f"{self.label} {self.done}/{self.total} {self.unit}"]
        if self.rows:
            parts.append(f"{count(self.rows)} rows")
        if self.total_bytes and self.bytes:
            parts.append(byte_rate(self.bytes, elapsed))
        parts.append(duration(elapsed))
        if self.done < self.total:
            parts.append(f"ETA {duration(self.eta(elapsed))}")
        return " · ".join(parts)

    def fields(self, elapsed: float) -> dict[str, Any]:
        """The line's figures as structured fields (for `--log-format json`)."""
        return {
            "event": "progress",
            "label": self.label,
            "done": self.done,
            "total": self.total,
            "rows": self.rows,
            "bytes": self.bytes,
            "elapsed_s": round(elapsed, 3),
            "eta_s": None if (eta := self.eta(elapsed)) is None else round(eta, 3),
        }

    def _emit(self, elapsed: float) -> None:
        message = self.line(elapsed)
        if self._bar is not None:
            with self._bar.external_write_mode():
                self.log.info(message, extra=self.fields(elapsed))
        else:
            self.log.info(message, extra=self.fields(elapsed))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- the ETA of tasks of unequal cost --------------------------------------------------------------


@dataclass(frozen=True)
class Cost:
    """What an item is expected to cost: `units` of work (compared only between items that
    share a key, or when nothing closer has finished), and its keys, most specific first."""

    units: float
    keys: tuple[str, ...] = ()


class Forecast:
    """When tasks of unequal cost will be done: the ETA of `run_tasks` (pipelines/ray_runtime.py)
    for a stage whose items differ in what they cost (the evaluate stage: a word-similarity
    score takes a second, a cross-validated fine-tuning minutes).

    A count-based ETA (elapsed x items left / items done) is as wrong as the items are unequal:
    the demo's evaluation finishes 40 cheap jobs first, then said "56/63 jobs · ETA 2.6s" with
    30 s of fine-tuning left. Here each item comes with a `Cost`: its expected work in units of
    its own kind (say, examples x epochs) and keys that group it with items like it, most
    specific first (`("finetune/polarity/1.0", "finetune/polarity", "finetune")`). An item is
    expected to take a fixed part, what every item costs whatever its size (loading a model:
    the shortest finished item's time), plus its units times the seconds per unit that the
    finished items under its most specific key with one finished measured beyond that fixed
    part (every finished item's when none has). So a job of the whole training file is
    expected from its 20% jobs' rate, not from their time. The ETA is when the last item would
    end if the items not started ran in order, each on the first of `slots` to free (the items
    running hold theirs for what their expectation has left). Nothing is expected before the
    first item is done (no ETA).
    """

    def __init__(self, costs: Sequence[Cost], slots: int):
        self.costs, self.slots = list(costs), max(1, slots)
        self._running: dict[int, float] = {}  # item -> when it got a slot
        self._queued: dict[int, float] = {}  # submitted, waiting for a slot (in order) -> when submitted
        self._done: set[int] = set()
        self._spent: dict[str, list[float]] = {}  # key -> [seconds, units, items] of its finished items
        self._all = [0.0, 0.0, 0]
        self._fixed: float | None = None  # the shortest finished item's seconds
        self._last = 0.0  # when the last item finished

    def start(self, item: int, now: float) -> None:
        """`item` was submitted: it runs once one of the `slots` is free (submitting more
        than run at once, as Ray queues them, does not start them)."""
        if len(self._running) < self.slots:
            self._running[item] = now
        else:
            self._queued[item] = now

    def finish(self, item: int, now: float) -> None:
        # an item that was queued ran before one submitted earlier: from the last finish on, at the latest
        started = self._running.pop(item) if item in self._running else max(self._queued.pop(item, now), self._last)
        self._last = now
        while self._queued and len(self._running) < self.slots:
            waiting = next(iter(self._queued))
            del self._queued[waiting]
            self._running[waiting] = now
        seconds, cost = now - started, self.costs[item]
        self._done.add(item)
        for spent in [*(self._spent.setdefault(key, [0.0, 0.0, 0]) for key in cost.keys), self._all]:
            spent[0] += seconds
            spent[1] += cost.units
            spent[2] += 1
        self._fixed = seconds if self._fixed is None else min(self._fixed, seconds)

    def expected(self, item: int) -> float | None:
        """Seconds `item` is expected to take (None before any item has finished)."""
        if self._fixed is None:
            return None
        cost = self.costs[item]
        seconds, units, items = next((self._spent[k] for k in cost.keys if k in self._spent), self._all)
        if units <= 0:
            return seconds / items
        return self._fixed + cost.units * max(0.0, seconds - items * self._fixed) / units

    def eta(self, now: float) -> float | None:
        """Seconds until every item is done, or None while nothing has finished."""
        if not self._done:
            return None
        free = [0.0] * max(0, self.slots - len(self._running))  # when each slot is free, seconds from now
        for item, started in self._running.items():
            free.append(max(0.0, self.expected(item) - (now - started)))
        heapq.heapify(free)
        end = max(free, default=0.0)
        begun = self._done | self._running.keys() | self._queued.keys()
        waiting = [*self._queued, *(i for i in range(len(self.costs)) if i not in begun)]
        for item in waiting:  # the queued first, then the rest in order
            ends = heapq.heappop(free) + self.expected(item)
            heapq.heappush(free, ends)
            end = max(end, ends)
        return end
