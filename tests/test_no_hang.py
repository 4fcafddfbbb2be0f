"""No silent hang where one line is owed (issue 18, cases 5 and 8): Prefect's temporary API
server that does not start in time, and a DeepSpeed op build whose lock outlived its
builder. Child processes run under a timeout that only guards against the old hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bertpipe(*args: str, env: dict | None = None, timeout: int = 300, cwd=ROOT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"bertpipe {' '.join(args)} hangs")


# -- case 5: Prefect's temporary API server on a busy machine ---------------------------------------


def test_a_prefect_server_that_does_not_start_in_time_ends_in_one_line_naming_the_setting(tmp_path):
    """The probe saw a 70-line RuntimeError twice at load average 10. A timeout of 0 makes
    Prefect give up at once, as it would after waiting on a busy machine."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"run: {{root: {tmp_path / 'run'}}}\ncorpus: {{inputs: [{tmp_path / 'in.txt'}]}}\n")
    env = {"PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0", "PREFECT_API_URL": ""}
    out = bertpipe("run", "-c", str(recipe), env=env)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        "bertpipe: error: Prefect's temporary API server did not answer within 0 s (a busy machine?); "
        "set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher, or PREFECT_API_URL to a running Prefect server"
    ], out.stderr[-3000:]
    assert "Traceback" not in out.stderr


def test_commands_wait_longer_for_prefects_server_unless_told(tmp_path):
    probe = ("import os, sys\nsys.argv = ['bertpipe', '--version']\nfrom flows import cli\n"
             "try:\n    cli.main()\nexcept SystemExit:\n    pass\nprint(os.environ['PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    default = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    chosen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**env, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600"})
    assert default.stdout.split()[-1] == "120" and chosen.stdout.split()[-1] == "600"
