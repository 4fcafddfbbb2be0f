"""Adaptive batching: the checked requests of one server wait in one queue, and one worker
thread runs them through the model a batch at a time (`run`: Engine.run).

When is a batch cut? When the model is free, it takes every request queued then (at most
`max_batch_requests`), so batches grow with the load by themselves: requests that came
while the model computed form the next batch; or, when batching does not pay, the first
request alone (`serve.batching`: batch_choice.py decides, measuring each way's cost per
token as it serves). Waiting is adaptive:

- a request that finds the model free and nothing else queued runs at once, alone: at
  concurrency 1 batching costs nothing;
- when the last batch was larger than what is queued now, clients are likely still sending
  its successors (a closed loop answers a batch, then sends again), so the batch waits for
  as many, at most `batch_wait_ms` after its first request came.

Backpressure: a request that would make the queue hold more than `max_queued_texts`
inputs is refused at once (`Overloaded`, with the seconds the queue needs to drain at
the recent rate), so the latency of what is accepted stays bounded instead of growing
with the queue. `drain()` waits until everything accepted has its answer.

asyncio and one thread; nothing here knows of HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bertcore.inference.batch_choice import BATCHED, BatchChoice
from bertcore.inference.validate import Job

log = logging.getLogger(__name__)


class Overloaded(Exception):
    """The queue is full: try again after `retry_after` seconds."""

    def __init__(self, queued: int, limit: int, retry_after: int):
        super().__init__(
            f"the server is busy: {queued} inputs are queued (serve.max_queued_texts {limit}); "
            f"retry after {retry_after} s"
        )
        self.retry_after = retry_after


@dataclass
class _Waiting:
    job: Job
    arrived: float
    answer: asyncio.Future


class Batcher:
    """One server's queue and model thread (see the module docstring). `run(jobs)` returns
    (per job an answer or an exception to raise to its caller, what to record); `record`
    is called on the event loop with each batch's (items, started, record, answers); `tokens(record)`
    gives the tokens a run read, which `choice` (the batching setting) weighs its cost by."""

    def __init__(
        self,
        run: Callable[[Sequence[Job]], tuple[list[Any], Any]],
        *,
        max_batch_requests: int,
        batch_wait_ms: float,
        max_queued_texts: int,
        record: Callable[[list[_Waiting], float, Any, list[Any]], None] | None = None,
        choice: BatchChoice | None = None,
        tokens: Callable[[Any], int] | None = None,
    ):
        self._run, self._record = run, record
        self.choice = choice or BatchChoice("on")
        self._tokens = tokens or (lambda record: 0)
        self.max_batch_requests, self.wait_s, self.max_queued_texts = (
            max_batch_requests,
            batch_wait_ms / 1000,
            max_queued_texts,
        )
        self._queue: deque[_Waiting] = deque()
        self.queued_texts = 0
        self._last_batch = 1
        self._rate = 0.0  # inputs per second, a moving average over recent batches
        self._arrived: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="bertpipe-model")

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._arrived, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def submit(self, job: Job, arrived: float | None = None) -> Any:
        """The job's answer once its batch ran; Overloaded at once when the queue is full."""
        if self.queued_texts and self.queued_texts + job.size > self.max_queued_texts:
            drain_s = self.queued_texts / self._rate if self._rate > 0 else 1.0
            raise Overloaded(self.queued_texts, self.max_queued_texts, max(1, math.ceil(drain_s)))
        waiting = _Waiting(
            job, time.perf_counter() if arrived is None else arrived, asyncio.get_running_loop().create_future()
        )
        self._queue.append(waiting)
        self.queued_texts += job.size
        self._idle.clear()
        self._arrived.set()
        answer = await waiting.answer
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def drain(self) -> None:
        """Wait until every accepted request has its answer."""
        await self._idle.wait()

    async def stop(self) -> None:
        """Answer what is queued, then stop the worker and its thread."""
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._thread.shutdown(wait=True)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._idle.set()
                self._arrived.clear()
                await self._arrived.wait()
            way = self.choice.way()
            if way == BATCHED:
                await self._gather()
            waiting = len(self._queue)
            batch = [
                self._queue.popleft() for _ in range(min(waiting, self.max_batch_requests if way == BATCHED else 1))
            ]
            self.queued_texts -= sum(w.job.size for w in batch)
            self._last_batch = len(batch)
            started = time.perf_counter()
            try:
                answers, record = await loop.run_in_executor(self._thread, self._run, [w.job for w in batch])
            except Exception as exc:  # noqa: BLE001 - the batch's requests fail, the server stays
                answers, record = [exc] * len(batch), None
            seconds = time.perf_counter() - started
            if waiting > 1 and record is not None:  # a choice between the ways was made: its cost counts
                self.choice.record(way, self._tokens(record), seconds)
            texts = sum(w.job.size for w in batch)
            self._rate = texts / seconds if self._rate == 0 else 0.8 * self._rate + 0.2 * texts / max(seconds, 1e-6)
            for waiting, answer in zip(batch, answers):
                if not waiting.answer.done():  # its client may have gone
                    waiting.answer.set_result(answer)
            if self._record is not None:
                try:
                    self._record(batch, started, record, answers)
                except Exception:  # metrics must not stop the worker
                    log.exception("bertpipe serve: recording a batch's metrics failed")

    async def _gather(self) -> None:
        """The adaptive wait (see the module docstring)."""
        expected = min(self._last_batch, self.max_batch_requests)
        deadline = self._queue[0].arrived + self.wait_s
        while len(self._queue) < expected and self.wait_s > 0:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return
