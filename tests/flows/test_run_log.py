"""The flow run's log under an object-store run.root (flows/run_log.py). What a local run's log
holds is checked on the demo run of tests/flows/test_cli.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_full_disk_ends_the_log_file_with_one_warning_and_no_traceback(tmp_path, capsys, caplog):
    """Under a run root on a full disk every record failed to write and printed a 'Logging
    error' traceback, and closing the file raised, so the run's last line was that OSError
    instead of its own error (issue 26's turn-3 probe: a run root on a 3 MB file system)."""
    from bertcore.config import StorageConfig
    from flows import run_log
    from pipelines.storage import Storage

    handler = run_log.RunLog(
        Storage(StorageConfig()), str(tmp_path / "_logs" / "flow-run.log"), logging.Formatter("%(message)s")
    )
    handler._file.close()
    handler._file = open("/dev/full", "a", encoding="utf-8", buffering=1)  # every write: ENOSPC
    top = logging.getLogger()
    top.addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING, logger="flows.run_log"):
            for n in range(3):
                logging.getLogger("pipelines.x").warning("pretrain: step %d", n)
    finally:
        top.removeHandler(handler)
    handler.close()  # no OSError
    assert "Logging error" not in capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records if r.name == "flows.run_log"]
    assert len(said) == 1 and said[0].startswith("the run log stopped at ") and "No space left on device" in said[0], (
        said
    )
