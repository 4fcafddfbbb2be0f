"""The ETA of tasks of unequal cost (pipelines/progress.py), on a simulated evaluation shaped
like the demo's: 40 word-similarity jobs of a second, then a classification task's
fine-tuning at 5%, 20% and 100% of its training file, run two at a time."""

from __future__ import annotations

import heapq

import pytest

from pipelines.progress import Cost, Forecast

FIXED = 0.8
"""Seconds every job costs whatever its size (a model loaded, a process started)."""


def _jobs() -> list[tuple[Cost, float]]:
    """(cost, true seconds) per job, in submission order."""
    jobs = [(Cost(200, ("finetune/simlex/1.0", "finetune/simlex", "finetune")), FIXED + 0.2) for _ in range(40)]
    for fraction in (0.05, 0.2, 1.0):
        units = 3 * 4 * 160 * fraction * 3 * 64  # folds x training share x epochs x tokens, forward and backward
        for _ in range(6):
            jobs.append(
                (
                    Cost(units, (f"finetune/polarity/{fraction}", "finetune/polarity", "finetune")),
                    FIXED + units / 20_000,
                )
            )
    return jobs


def _run(jobs, slots: int, submit_all: bool = False) -> list[tuple[float, float | None, float, int]]:
    """At each finish: (now, the forecast's ETA, the true seconds left, jobs done). The jobs
    run `slots` at a time, in order; submit_all: all are submitted at once (as the evaluate
    stage submits its jobs to Ray, which queues what it cannot run yet)."""
    forecast = Forecast([cost for cost, _ in jobs], slots)
    if submit_all:
        for job in range(len(jobs)):
            forecast.start(job, 0.0)
    running: list[tuple[float, int]] = []  # (ends, job)
    now, nxt, seen = 0.0, 0, []
    while nxt < len(jobs) and len(running) < slots:
        if not submit_all:
            forecast.start(nxt, now)
        heapq.heappush(running, (now + jobs[nxt][1], nxt))
        nxt += 1
    finished = 0
    ends_all = []
    while running:
        now, job = heapq.heappop(running)
        forecast.finish(job, now)
        finished += 1
        if nxt < len(jobs):
            if not submit_all:
                forecast.start(nxt, now)
            heapq.heappush(running, (now + jobs[nxt][1], nxt))
            nxt += 1
        seen.append((now, forecast.eta(now), finished))
        ends_all.append(now)
    end = max(ends_all)
    return [(now, eta, end - now, done) for now, eta, done in seen]


@pytest.mark.parametrize("submit_all", [False, True])
def test_the_eta_follows_the_cost_left_where_a_count_would_be_ten_times_low(submit_all):
    jobs = _jobs()
    seen = _run(jobs, slots=2, submit_all=submit_all)
    assert seen[0][1] is not None and seen[-1][1] == pytest.approx(0.0)
    # once the whole-file jobs are under way (the 20% jobs have calibrated the task's rate)
    tail = [(eta, left) for now, eta, left, done in seen if 46 <= done < len(jobs)]
    for eta, left in tail:
        assert 0.7 * left <= eta <= 1.4 * left, (eta, left)
    # the count-based ETA the stage printed before, at the same moments: far too low
    counted = [(now * (len(jobs) - done) / done, left) for now, _, left, done in seen if 46 <= done < len(jobs) - 2]
    assert min(count / left for count, left in counted) < 0.2


def test_no_eta_before_anything_is_done_and_a_job_past_its_expectation_counts_as_ending():
    forecast = Forecast([Cost(1.0), Cost(1.0), Cost(4.0)], slots=1)
    forecast.start(0, 0.0)
    assert forecast.eta(0.5) is None
    forecast.finish(0, 2.0)
    forecast.start(1, 2.0)
    assert forecast.eta(2.0) == pytest.approx(2.0 + 2.0)  # job 1 (2 s), then job 2 (fixed 2 s, nothing per unit)
    assert forecast.eta(9.0) == pytest.approx(2.0)  # job 1 ran past its 2 s: only job 2 is left
