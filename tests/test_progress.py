"""Progress lines (pipelines/progress.py, pipelines/pretrain_progress.py): a steady cadence,
always a last line, rates and an ETA that add up, short lines. No Ray needed."""

from __future__ import annotations

import logging
import time

import pytest

from pipelines.pretrain_progress import StepWindow, step_line
from pipelines.progress import Progress, count, duration


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger="pipelines")

    def messages() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name.startswith("pipelines")]

    return messages


def test_a_long_interval_still_logs_the_last_unit(lines):
    with Progress("corpus: clean", 5, interval=3600, bar=False) as progress:
        for _ in range(5):
            progress.advance(rows=10)
    records = lines()
    assert len(records) == 1
    assert records[0].getMessage().startswith("corpus: clean 5/5 units · 50 rows")
    assert records[0].done == 5 and records[0].total == 5 and records[0].eta_s == 0.0


def test_rows_that_arrive_after_the_last_unit_do_not_repeat_the_done_line(lines):
    with Progress("corpus: clean", 2, interval=3600, bar=False) as progress:
        progress.advance(rows=5)
        progress.advance(rows=5)
        progress.advance(0, rows=3)  # late rows (a streamed unit's last batch)
    assert [r.getMessage().split(" · ")[0] for r in lines()] == ["corpus: clean 2/2 units"]


def test_a_short_interval_logs_while_it_runs_with_an_eta_by_bytes(lines):
    with Progress("examples: tokenize", 4, total_bytes=4_000_000, interval=0, bar=False) as progress:
        time.sleep(0.2)
        progress.advance(nbytes=1_000_000)
        progress.advance(3, nbytes=3_000_000)
    first, last = lines()
    assert first.getMessage().startswith("examples: tokenize 1/4 units") and "MB/s" in first.getMessage() and "ETA" in first.getMessage()
    # a quarter of the bytes took t: the other three quarters take 3t
    assert first.eta_s == pytest.approx(3 * first.elapsed_s, abs=0.01)
    assert last.done == 4 and "ETA" not in last.getMessage()


def test_the_eta_follows_units_when_sizes_are_unknown(lines):
    with Progress("evaluate", 10, unit="jobs", interval=0, bar=False) as progress:
        time.sleep(0.2)
        progress.advance(2)
    (record,) = lines()
    assert "2/10 jobs" in record.getMessage()
    assert record.eta_s == pytest.approx(4 * record.elapsed_s, abs=0.01)


def test_numbers_read_short():
    assert [count(n) for n in (7, 9999, 12_345, 4_560_000)] == ["7", "9,999", "12.3k", "4.56M"]
    assert [duration(s) for s in (3.14, 65, 7325)] == ["3.1s", "1m05s", "2h02m"]


def _step(step: int, loss: float, tokens: int = 1000, seconds: float = 0.5, mfu=None) -> dict:
    return {"step": step, "phase": "seq128", "loss": loss, "mlm_accuracy": 0.1, "tokens": tokens, "step_time_s": seconds, "mfu": mfu}


def test_a_step_window_summarises_the_steps_since_the_last_line():
    window = StepWindow(total_steps=100)
    for step, loss in ((1, 8.0), (2, 6.0)):
        window.add(_step(step, loss))
    summary = window.summary()
    assert summary["loss"] == 7.0 and summary["step"] == 2
    assert summary["tokens_per_s"] == pytest.approx(2000 / 1.0)
    assert summary["eta_s"] == pytest.approx(98 * 0.5)  # 98 steps left at the window's pace
    assert summary["mfu"] is None
    line = step_line(summary)
    assert line == "pretrain: step 2/100 seq128 · loss 7.000 · MLM acc 10.0% · 2,000 tokens/s · ETA 49.0s"
    window.add(_step(100, 5.0, mfu=0.25))
    last = step_line(window.summary())
    assert last.endswith("MFU 25.0% · done") and len(last) < 200
