"""No silent hang where one line is owed (issue 18, cases 5 and 8): Prefect's temporary API
server that does not start in time, and a DeepSpeed op build whose lock outlived its
builder. Child processes run under a timeout that only guards against the old hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from processes import migrated_prefect_home

ROOT = Path(__file__).resolve().parents[2]


def own_prefect(tmp_path: Path, **more: str) -> dict:
    """This environment with a Prefect home of its own and no API URL: the command starts
    its own temporary Prefect server, as a user's first run does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    return {**env, "PREFECT_HOME": str(migrated_prefect_home(tmp_path / "prefect")), **more}


def bertpipe(*args: str, env: dict | None = None, timeout: int = 300, cwd=ROOT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env or dict(os.environ),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"bertpipe {' '.join(args)} hangs")


# -- case 5: Prefect's temporary API server on a busy machine ---------------------------------------


def test_a_prefect_server_that_does_not_start_in_time_ends_in_one_line_naming_the_setting(tmp_path):
    """The probe saw a 70-line RuntimeError twice at load average 10. A timeout of 0 makes
    Prefect give up at once, as it would after waiting on a busy machine."""
    recipe = tmp_path / "recipe.yaml"
    (tmp_path / "in.txt").write_text(
        "One sentence here.\n"
    )  # a missing input would be refused first, before Prefect starts
    recipe.write_text(f"run: {{root: {tmp_path / 'run'}}}\ncorpus: {{inputs: [{tmp_path / 'in.txt'}]}}\n")
    out = bertpipe(
        "run", "-c", str(recipe), env=own_prefect(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")
    )
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        (
            "bertpipe: error: Prefect's temporary API server did not answer within 0 s (a busy machine?); "
            "set PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher, or PREFECT_API_URL to a running Prefect "
            "server"
        )
    ], out.stderr[-3000:]
    assert "Traceback" not in out.stderr


def test_commands_wait_longer_for_prefects_server_unless_told(tmp_path):
    probe = (
        "import os, sys\nsys.argv = ['bertpipe', '--version']\nfrom flows import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    "
        "pass\nprint(os.environ['PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"}
    default = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    chosen = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**env, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600"},
    )
    assert default.stdout.split()[-1] == "120" and chosen.stdout.split()[-1] == "600"


# -- case 8: a DeepSpeed op build killed part-way ------------------------------------------------


SHM_PROBE = r"""
import os, torch
os.environ.update(
    MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PROBE_PORT"], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
)
torch.distributed.init_process_group("gloo", rank=0, world_size=1)
from pipelines.training.launch import _quiet_deepspeed_comm
_quiet_deepspeed_comm()
from deepspeed.comm import comm
print("DONE", comm.cdb.shm_comm_op)
"""


def test_a_lock_left_by_a_killed_shm_op_build_no_longer_hangs_the_pretrain_workers(tmp_path):
    """The probe's case: a first run killed while DeepSpeed built its CPU communication op
    left `deepspeed_shm_comm/lock`, and every later run waited on it forever. The op is no
    longer built at all (training never uses it), so its lock is never waited on."""
    from processes import free_port

    extensions = tmp_path / "torch_extensions"
    (extensions / "deepspeed_shm_comm").mkdir(parents=True)
    (extensions / "deepspeed_shm_comm" / "lock").touch()
    env = {
        **os.environ,
        "TORCH_EXTENSIONS_DIR": str(extensions),
        "DS_ACCELERATOR": "cpu",
        "PROBE_PORT": str(free_port()),
    }
    try:
        out = subprocess.run(
            [sys.executable, "-c", SHM_PROBE], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail("setting up DeepSpeed's communication still waits on a dead build's lock")
    assert out.stdout.split()[-2:] == ["DONE", "None"], out.stderr[-3000:]
    assert sorted(os.listdir(extensions / "deepspeed_shm_comm")) == ["lock"], "nothing was built, nothing removed"


def test_a_stale_op_build_lock_ends_in_one_line_naming_the_file(tmp_path, monkeypatch, caplog):
    import logging

    from bertcore.train.op_builds import StaleBuildLock, ops_to_build, prepare_builds

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert ops_to_build(use_gpu=False, optimizer="adamw", torch_adam=False) == ["fused_adam"]
    assert ops_to_build(use_gpu=False, optimizer="adamw", torch_adam=True) == []
    # not built yet: said before DeepSpeed starts compiling
    with caplog.at_level(logging.INFO, logger="bertcore.train.op_builds"):
        prepare_builds(["fused_adam"])
    assert [r.getMessage() for r in caplog.records] == [
        (
            "DeepSpeed compiles its fused_adam op now, once for this machine and Python (a few minutes; cached "
            f"in {tmp_path / 'fused_adam'})"
        )
    ]
    # a lock that a running builder holds open: waited for, and said so
    lock = tmp_path / "fused_adam" / "lock"
    lock.parent.mkdir()
    caplog.clear()
    with open(lock, "w"), caplog.at_level(logging.INFO, logger="bertcore.train.op_builds"):
        prepare_builds(["fused_adam"])
    assert f"being built by process {os.getpid()}; waiting for it (lock {lock})" in caplog.records[0].getMessage()
    # the same lock once its builder is gone: one line naming it, no wait
    with pytest.raises(StaleBuildLock) as stale:
        prepare_builds(["fused_adam"])
    assert str(stale.value).startswith(
        f"{lock}: a build of DeepSpeed's fused_adam op left this lock and no running process holds it"
    )
    assert f"rm {lock}" in str(stale.value) and "\n" not in str(stale.value)


# -- Ctrl-C during a run ------------------------------------------------------------------------------


def _corpus_run_started(tmp_path: Path, gensim_data: Path) -> tuple[subprocess.Popen, Path, dict, Path]:
    """`bertpipe run --only corpus` in a session of its own, once its corpus stage has
    started: (the process, its recipe, its environment, the file its stderr goes to)."""
    import json
    import time

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "run": {"root": str(tmp_path / "run")},
                "ray": {"num_cpus": 2},
                "corpus": {"inputs": [{"uri": str(gensim_data / "lee_background.cor"), "format": "lines"}]},
            }
        )
    )
    env = own_prefect(tmp_path, BERTPIPE_CACHE_DIR=str(tmp_path / "cache"))
    err = tmp_path / "stderr.txt"
    with open(err, "w") as sink:
        run = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "run", "-c", str(recipe), "--only", "corpus"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while "corpus: start" not in err.read_text() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.poll() is None, err.read_text()[-2000:]
    return run, recipe, env, err


@pytest.mark.slow
def test_ctrl_c_during_a_run_ends_it_in_one_line_gives_the_root_back_and_a_rerun_finishes(tmp_path, gensim_data):
    """Ctrl-C reaches the whole process group, Prefect's temporary API server included; the
    old run then retried that dead server with a page of connection errors and never ended."""
    import signal

    run, recipe, env, err = _corpus_run_started(tmp_path, gensim_data)
    os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    try:
        run.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        pytest.fail("bertpipe run does not end after Ctrl-C")
    text = err.read_text()
    assert run.returncode == 130, text[-2000:]
    assert [line for line in text.splitlines() if "error" in line.lower()] == [
        "bertpipe: error: interrupted (SIGINT); finished work is kept: run the same command again to go on"
    ], text[-2000:]
    assert not (tmp_path / "run" / "_lease.json").exists(), "the lease was given back"
    again = bertpipe("run", "-c", str(recipe), "--only", "corpus", env=env, timeout=600)
    assert again.returncode == 0 and (tmp_path / "run" / "corpus" / "_manifest.json").exists(), again.stderr[-2000:]


@pytest.mark.slow
def test_a_sigkilled_run_leaves_no_process_behind_and_the_rerun_takes_the_root_at_once(tmp_path, gensim_data):
    """SIGKILL of `bertpipe run` (the OOM killer, `kill -9`): nothing of it may stay. Before,
    14 processes were alive 2 s later (both training workers among them, 1.2 GB each), 3 at
    32 s, and Prefect's temporary server until it was killed; the rerun was refused for the
    two minutes the dead run's lease had left."""
    import signal

    import psutil

    run, recipe, env, _ = _corpus_run_started(tmp_path, gensim_data)
    started = psutil.Process(run.pid).children(recursive=True)
    assert len(started) >= 3, started  # the watchdog, Prefect's server, Ray's processes
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=30)
    _, alive = psutil.wait_procs(started, timeout=20)
    try:
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:
        for process in alive:  # what this test started, by pid
            process.kill()
    assert (tmp_path / "run" / "_lease.json").exists()  # the killed run could not give it back
    again = bertpipe("run", "-c", str(recipe), "--only", "corpus", env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "its process is gone" in again.stderr and "is in use by" not in again.stderr
