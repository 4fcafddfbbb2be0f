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

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """What an item is expected to cost: `units` of work (compared only between items that
    share a key, or when nothing closer has finished), and its keys, most specific first."""

    units: float
    keys: tuple[str, ...] = ()


class Forecast:
    """The ETA of items with `costs`, run at most `slots` at a time (see the module docstring)."""

    def __init__(self, costs: Sequence[Cost], slots: int):
        self.costs, self.slots = list(costs), max(1, slots)
        self._started: dict[int, float] = {}
        self._done: set[int] = set()
        self._spent: dict[str, list[float]] = {}  # key -> [seconds, units, items] of its finished items
        self._all = [0.0, 0.0, 0]
        self._fixed: float | None = None  # the shortest finished item's seconds

    def start(self, item: int, now: float) -> None:
        self._started[item] = now

    def finish(self, item: int, now: float) -> None:
        seconds = now - self._started.pop(item, now)
        cost = self.costs[item]
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
        free = [0.0] * max(0, self.slots - len(self._started))  # when each slot is free, seconds from now
        for item, started in self._started.items():
            free.append(max(0.0, self.expected(item) - (now - started)))
        heapq.heapify(free)
        end = max(free, default=0.0)
        for item in range(len(self.costs)):
            if item in self._done or item in self._started:
                continue
            ends = heapq.heappop(free) + self.expected(item)
            heapq.heappush(free, ends)
            end = max(end, ends)
        return end
