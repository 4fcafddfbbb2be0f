"""Progress lines (pipelines/progress.py, pipelines/training/reporting.py): a steady cadence,
always a last line, rates and an ETA that add up, short lines. No Ray needed."""

from __future__ import annotations

import logging
import time

import pytest

from pipelines.progress import Progress, count, duration
from pipelines.training.reporting import StepReporter, budget_line, jump_line, step_line


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
    assert (
        first.getMessage().startswith("examples: tokenize 1/4 units")
        and "MB/s" in first.getMessage()
        and "ETA" in first.getMessage()
    )
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
    return {
        "step": step,
        "phase": "seq128",
        "loss": loss,
        "mlm_accuracy": 0.1,
        "tokens": tokens,
        "step_time_s": seconds,
        "mfu": mfu,
    }


def test_a_progress_line_is_the_interval_summary_the_trackers_get():
    from bertcore.train.metrics_log import Interval

    interval = Interval(every=2)
    for step, loss in ((1, 8.0), (2, 6.0)):
        interval.add(_step(step, loss))
    assert interval.ends(2, final=False) and not interval.ends(3, final=False) and interval.ends(3, final=True)
    summary = interval.close()
    assert summary["loss"] == 7.0 and (summary["first_step"], summary["step"]) == (1, 2)
    assert summary["tokens_per_s"] == pytest.approx(2000 / 1.0) and summary["mfu"] is None
    reporter_line = {
        **summary,
        "total_steps": 100,
        "eta_s": 98 * 0.5,
    }  # what StepReporter sends: 98 steps left at 0.5 s
    line = step_line(reporter_line)
    assert line == "pretrain: steps 1-2/100 seq128 · loss 7.000 · MLM acc 10.0% · 2,000 tokens/s · ETA 49.0s"
    interval.add(_step(100, 5.0, mfu=0.25))
    last = step_line({**interval.close(), "total_steps": 100, "eta_s": 0.0})
    assert (
        last.startswith("pretrain: step 100/100 seq128 · loss 5.000")
        and last.endswith("MFU 25.0% · done")
        and len(last) < 100
    )
    jump = {"step": 95, "loss": 13.8, "running_mean": 7.62, "factor": 13.8 / 7.62}
    assert jump_line(jump).startswith(
        "pretrain: the loss jumped to 13.80 at step 95, 1.8x its running mean of 7.62; training goes on"
    )


class _ListQueue:
    """What StepReporter puts on Ray's queue, kept in a list."""

    def __init__(self):
        self.items: list[dict] = []

    def put_nowait(self, item: dict) -> None:
        self.items.append(item)


def test_the_eta_is_the_time_budget_left_when_the_budget_ends_training_first():
    from bertcore.train.metrics_log import Interval

    queue = _ListQueue()
    reporter = StepReporter(queue, total_steps=400, stage="distill")
    interval = Interval(every=2)
    for step, loss in ((1, 2.0), (2, 1.5)):
        interval.add(_step(step, loss))
    summary = interval.close()  # 0.5 s a step: 398 steps left take 199 s
    reporter({**summary, "budget_left_s": 60.0})
    reporter({**summary, "budget_left_s": 500.0})
    reporter({**summary, "budget_left_s": None})
    by_budget, by_steps, no_budget = queue.items
    assert (by_budget["eta_s"], by_budget["eta_by"]) == (60.0, "time_budget") and "budget_left_s" not in by_budget
    assert step_line(by_budget).endswith("ETA 1m00s (time budget)")
    assert by_steps["eta_s"] == no_budget["eta_s"] == pytest.approx(199.0) and step_line(by_steps).endswith("ETA 3m19s")
    reporter({"event": "time_budget", "step": 132, "total_steps": 400, "time_budget_s": 240})
    assert budget_line(queue.items[-1]) == "distill: stopped at step 132 of 400: the time budget of 4m00s is spent"


def test_intervals_final_and_a_resumed_interval_are_one_definition():
    """Every place that shows a training figure reads it from bertcore.train.metrics_log: the
    intervals are fixed by the step numbers, so the console (Interval during training), the
    trackers and the report (intervals of metrics.jsonl) agree, a resume included."""
    from bertcore.train.metrics_log import Interval, at_step, final, intervals, steps_text

    records = [_step(s, float(s)) for s in range(1, 12)]
    summaries = intervals(records, 4)
    assert [(s["first_step"], s["step"], s["loss"]) for s in summaries] == [(1, 4, 2.5), (5, 8, 6.5), (9, 11, 10.0)]
    assert final(records, 4) == summaries[-1] and steps_text(summaries[-1]) == "mean of steps 9-11"
    assert at_step(records, 6, 4)["loss"] == 5.5 and at_step(records, 8, 4) == summaries[1]
    # a run resumed at step 6 (its checkpoint) closes the interval 5-8 on the same records as one that never stopped
    resumed = Interval(4).resumed(records[:7], 6)  # metrics.jsonl also held step 7 from the crashed attempt: dropped
    for record in records[6:8]:
        resumed.add(record)
    assert resumed.ends(8, final=False) and resumed.close() == summaries[1]
    jumped = {**_step(3, 9.0), "loss_jump": {"running_mean": 4.0, "factor": 2.25}}
    assert intervals([records[0], jumped], 4)[0]["loss_jumps"] == [
        {"step": 3, "loss": 9.0, "running_mean": 4.0, "factor": 2.25}
    ]


def test_the_loss_watch_reports_jumps_after_its_grace_and_acts_only_on_spikes():
    from bertcore.train.loss_watch import LossWatch

    watch = LossWatch(factor=4.0, grace=3, alpha=0.5)
    assert [watch.observe(loss) for loss in (8.0, 8.0, 8.0)] == [None, None, None]
    jump = watch.observe(13.0)
    assert jump == {"running_mean": 8.0, "factor": 13.0 / 8.0} and not watch.is_spike(13.0)
    assert watch.observe(9.0) is None and watch.is_spike(100.0)


def test_the_start_line_of_a_continued_run_names_its_folder_and_shape():
    from bertcore.model.config import ModelConfig
    from bertcore.train.config import PretrainConfig
    from pipelines.external import ExternalFolder
    from pipelines.stages.pretrain.work import _start_line

    phases = [{"name": "seq128", "steps": 600, "batch_size": 32, "max_seq_length": 128}]
    cfg = PretrainConfig(model_size="tiny", num_workers=2, zero_stage=2, phases=phases, init_from="/models/minilm")
    shape = ModelConfig(vocab_size=30522, num_hidden_layers=6, hidden_size=384, num_attention_heads=12)
    init = ExternalFolder("/models/minilm", ["config.json", "model.safetensors"], {})
    line = _start_line(cfg, shape, init, None)
    assert line.startswith(
        "pretrain: the model in /models/minilm (6 layers, hidden 384, from its config.json) continued on 2 CPU workers"
    )
    assert "tiny" not in line and "from scratch" not in line
    assert "resuming from step 200" in _start_line(cfg, shape, init, {"step": 200})
    fresh = _start_line(cfg.model_copy(update={"init_from": None}), ModelConfig.named("tiny", 8000), None, None)
    assert fresh.startswith(
        "pretrain: tiny model (2 layers, hidden 128) from scratch on 2 CPU workers, ZeRO-2 fp32 adamw; "
        "seq128 600 steps x 32"
    )


def test_the_progress_relay_ends_quietly_when_its_queue_goes_with_ray(ray_cluster):
    """Ctrl-C during distillation stopped Ray under the relay thread, which then printed a
    page of ActorDiedError after the run's one error line."""
    import threading

    import ray
    from ray.util.queue import Queue

    from pipelines.training.reporting import relay_progress

    queue = Queue(maxsize=10, actor_options={"num_cpus": 0})
    ray.kill(queue.actor)
    raised: list = []
    previous = threading.excepthook
    threading.excepthook = lambda hook_args: raised.append(hook_args.exc_value)
    try:
        relay = threading.Thread(target=relay_progress, args=(queue, threading.Event()), daemon=True)
        relay.start()
        relay.join(timeout=30)
    finally:
        threading.excepthook = previous
    assert not relay.is_alive()
    assert raised == []
