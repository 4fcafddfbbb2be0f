"""The command's log formats (flows/logs.py): short text lines for people, one JSON object
per line with the record's fields for machines."""

from __future__ import annotations

import json
import logging
import sys

from flows.logs import JsonFormatter, TextFormatter, level_for


def record(message: str, level: int = logging.INFO, name: str = "pipelines.stage_log", **extra) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, message, None, None)
    made.__dict__.update(extra)
    return made


def test_text_lines_show_the_level_only_when_it_is_not_info_and_prefects_run_name():
    text = TextFormatter()
    assert text.format(record("corpus: done in 4.1s")).split(" ", 1)[1] == "corpus: done in 4.1s"
    assert text.format(record("slow disk", logging.WARNING)).split(" ", 1)[1] == "WARNING slow disk"
    finished = record("Finished in state Cached(type=COMPLETED)", name="prefect.task_runs", task_run_name="vocab")
    assert text.format(finished).split(" ", 1)[1] == "Task run 'vocab' - Finished in state Cached(type=COMPLETED)"


def test_json_lines_carry_the_records_fields_and_the_exception():
    line = JsonFormatter().format(record("corpus: clean 2/5 units", event="progress", done=2, total=5, eta_s=1.5))
    data = json.loads(line)
    assert "\n" not in line
    assert (
        data["message"] == "corpus: clean 2/5 units"
        and data["level"] == "INFO"
        and data["logger"] == "pipelines.stage_log"
    )
    assert (data["event"], data["done"], data["total"], data["eta_s"]) == ("progress", 2, 5, 1.5)
    assert data["time"].endswith("Z") and "T" in data["time"]
    try:
        raise ValueError("bad shard")
    except ValueError:
        failed = logging.LogRecord("pipelines", logging.ERROR, __file__, 1, "stage failed", None, sys.exc_info())
    data = json.loads(JsonFormatter().format(failed))
    assert "ValueError: bad shard" in data["exception"] and data["level"] == "ERROR"


def test_verbosity_levels():
    assert [level_for(v) for v in (-1, 0, 1, 2)] == [logging.WARNING, logging.INFO, logging.DEBUG, logging.DEBUG]


def test_the_handler_follows_stderr_when_a_caller_swaps_and_closes_it(monkeypatch):
    """A command run in-process (a test's CliRunner) sets logging up while stderr is a
    temporary stream that is closed afterwards: later records must reach the stderr of the
    moment, not the closed stream."""
    import io

    from flows.logs import StderrHandler

    handler = StderrHandler()
    handler.setFormatter(TextFormatter())
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    handler.emit(record("while the command ran"))
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    handler.emit(record("after it returned"))
    assert second.getvalue().endswith("after it returned\n")


def test_an_error_in_process_leaves_the_prefect_api_it_runs_under(prefect_harness, tmp_path):
    """A command's error stops the temporary server Prefect started for it, never one that
    PREFECT_API_URL names: CI's later flow tests failed on 'Connection refused' after an
    in-process `verify` had stopped the session's test harness."""
    from prefect import get_client
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["status", "-c", str(tmp_path / "no-such-recipe.yaml")])
    assert result.exit_code == 2, result.output
    with get_client(sync_client=True) as client:
        assert client.api_healthcheck() is None  # None: the API answered
