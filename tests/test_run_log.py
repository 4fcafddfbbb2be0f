"""The flow run's own log under run.root (flows/run_log.py): a real `bertpipe run`, whose
console lines the file must hold, in order, with the summary and the outcome last."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_writes_the_consoles_lines_and_its_summary_under_the_root(tmp_path):
    root = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PREFECT_LOGGING_LEVEL", None)
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--config", "configs/demo.yaml", "--only", "corpus",
         "--set", f"run.root={root}", "--set", "corpus.inputs=[{uri: '{demo_data}/lee_background.cor', format: lines}]"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = (root / "_logs").glob("flow-run-*.log")
    lines = path.read_text(encoding="utf-8").splitlines()
    console = out.stderr.splitlines()

    # the file starts where the flow's code starts, and from there holds the console's lines
    first = next(i for i, line in enumerate(console) if "attempt 1 on" in line and str(path) in line)
    ended = next(i for i, line in enumerate(lines) if line.endswith("run ended: Completed"))
    table = out.stdout.splitlines()[1 : 1 + 2]  # 'stage state time key figures' and the corpus row
    logged = lines[: ended - len(table)]
    assert logged == console[first : first + len(logged)]
    assert any("corpus: done in" in line for line in logged) and any("Task run 'corpus' - Finished in state Completed" in line for line in logged)
    # then the summary `bertpipe run` printed, and how the run ended
    assert [line.split(" ", 1)[1] for line in lines[ended - len(table) : ended]] == table
    assert table[0].startswith("stage") and table[1].startswith("corpus")
    assert lines[-1] == lines[ended]


def test_an_object_store_log_is_uploaded_while_the_run_goes_on_and_at_the_end(s3_bucket, monkeypatch):
    """The buffer of a remote log reaches the store every UPLOAD_EVERY_S, so a killed run
    leaves what it logged until then; a second attempt of the same flow run appends."""
    import time

    from bertcore.config import StorageConfig
    from flows import run_log
    from pipelines.storage import Storage

    endpoint, bucket = s3_bucket
    storage = Storage(StorageConfig(endpoint_url=endpoint))
    uri = f"s3://{bucket}/run/_logs/flow-run-20260101-000000-test.log"
    monkeypatch.setattr(run_log, "UPLOAD_EVERY_S", 0.2)
    record = logging.LogRecord("pipelines.x", logging.INFO, __file__, 1, "corpus: start", None, None)

    handler = run_log.RunLog(storage, uri, logging.Formatter("%(message)s"))
    handler.emit(record)
    deadline = time.monotonic() + 20
    while not storage.exists(uri) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert storage.read_text(uri) == "corpus: start\n"  # uploaded while the handler is still open
    handler.note("run ended: Completed")
    handler.close()
    assert storage.read_text(uri) == "corpus: start\nrun ended: Completed\n"

    again = run_log.RunLog(storage, uri, logging.Formatter("%(message)s"))
    again.note("attempt 2")
    again.close()
    assert storage.read_text(uri).splitlines() == ["corpus: start", "run ended: Completed", "attempt 2"]
    assert not os.path.exists(handler.buffer) and not os.path.exists(again.buffer)
