"""`bertpipe status` while a run writes the root: the stage at work shows as
`running (pid P, host H, since T)` from the root's lease (it showed `missing`); a lease
whose holder is dead, or no lease, shows the stage as it is on disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

from typer.testing import CliRunner

from pipelines.lease import LEASE, RootLease
from pipelines.registry import load_config
from pipelines.runner import Pipeline

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")


def _started_vocab(tmp_path):
    """A root whose vocab stage has begun: its directory holds work, no manifest."""
    root = tmp_path / "run"
    (root / "vocab" / "_progress").mkdir(parents=True)
    (root / "vocab" / "_progress" / "sample.json").write_text("{}")
    return str(root), load_config(DEMO, [f"run.root={root}"])


def test_the_stage_a_live_run_is_writing_shows_as_running_with_pid_host_and_time(tmp_path):
    from flows.cli import app

    root, cfg = _started_vocab(tmp_path)
    pipeline = Pipeline(cfg)
    assert {r["stage"]: r["state"] for r in pipeline.status()}["vocab"] == "missing"
    with RootLease(pipeline.storage, root, "flow run nightly (1234)") as lease:
        rows = {r["stage"]: r for r in Pipeline(cfg).status()}
        assert (
            rows["vocab"]["state"] == "running"
            and rows["corpus"]["state"] == "missing"
            and rows["examples"]["state"] == "missing"
        )
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lease.record.acquired_at))
        assert rows["vocab"]["running"] == {
            "holder": "flow run nightly (1234)",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": since,
        }
        result = CliRunner().invoke(app, ["status", "-c", DEMO, "--set", f"run.root={root}"])
        assert result.exit_code == 0, result.output
        line = next(line for line in result.stdout.splitlines() if line.startswith("vocab "))
        assert f"running (pid {os.getpid()}, host {socket.gethostname()}, since {since})" in line
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["vocab"] == "missing"


def test_a_lease_whose_holder_is_dead_shows_no_stage_running(tmp_path):
    root, cfg = _started_vocab(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    now = time.time()
    record = {
        "holder": "flow run killed",
        "host": socket.gethostname(),
        "pid": dead.pid,
        "token": "t",
        "acquired_at": now,
        "heartbeat_at": now,
        "expires_at": now + 120,
    }
    (tmp_path / "run" / LEASE).write_text(json.dumps(record))
    assert {r["stage"]: r["state"] for r in Pipeline(cfg).status()}["vocab"] == "missing"
