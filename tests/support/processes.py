"""Helpers for tests that start their own servers: a free port and a clean stop."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(*procs: subprocess.Popen, timeout: float = 30) -> None:
    """Stop processes this test started (the last one first) and everything they started:
    SIGTERM, then SIGKILL for whatever is left, children included, by pid."""
    descendants = []
    for proc in procs:
        try:
            descendants += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def state_api_address(ray) -> str:
    """The dashboard (state API) address of the Ray this driver joined, as ensure_ray hands
    it to the workers. A state API call without it guesses among the Rays running on the
    machine and fails where there are several (a test's own, or one a killed driver left)."""
    import os

    return ray.get(ray.remote(num_cpus=0)(lambda: os.environ["RAY_API_SERVER_ADDRESS"]).remote())


def job_actors(ray) -> list:
    """The alive actors of this driver's job (Ray's ActorState records, with detail), from
    the state API at `state_api_address`."""
    from ray.util.state import list_actors

    job = ray.get_runtime_context().get_job_id()
    return list_actors(
        address=state_api_address(ray), filters=[("job_id", "=", job), ("state", "=", "ALIVE")], detail=True, limit=1000
    )


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@contextlib.contextmanager
def listening_sockets(every: float = 0.2, roots: list[int] | None = None):
    """While the block runs, polls every listening TCP socket of this process's descendants
    (an embedded Ray's GCS, raylet, agents and workers, the Ray Train workers' torch store
    among them); yields {process name: {address, ...}}, filled as they are seen. `roots`:
    only these processes (pids, the list may be filled once the block runs) and theirs."""
    seen: dict[str, set[str]] = {}
    stop_polling = threading.Event()

    def poll() -> None:
        while not stop_polling.is_set():
            for process in _tree(roots):
                try:
                    name = process.name()
                    for conn in process.net_connections(kind="inet"):
                        if conn.status == psutil.CONN_LISTEN:
                            seen.setdefault(name, set()).add(conn.laddr.ip)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            stop_polling.wait(every)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield seen
    finally:
        stop_polling.set()
        poller.join()


def _tree(roots: list[int] | None) -> list[psutil.Process]:
    if roots is None:
        return psutil.Process().children(recursive=True)
    found = []
    for pid in list(roots):
        try:
            root = psutil.Process(pid)
            found += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return found


def training_workers() -> list[psutil.Process]:
    """The Ray Train worker processes among this process's descendants (an embedded Ray's)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if " ".join(process.cmdline()).startswith("ray::RayTrainWorker"):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


_MIGRATED: list[Path] = []


def migrated_prefect_home(folder: Path) -> Path:
    """`folder` as a Prefect home whose SQLite database already has its tables: a copy of one
    that `prefect server database upgrade` made once per test process. A temporary server or
    `prefect server start` there skips the migrations, about 12 CPU-s each on this machine."""
    if not _MIGRATED:
        template = Path(tempfile.mkdtemp(prefix="bertpipe-prefect-home-"))
        atexit.register(shutil.rmtree, template, True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        subprocess.run(
            [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
            check=True,
            capture_output=True,
            env={**env, "PREFECT_HOME": str(template), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
            timeout=600,
        )
        _MIGRATED.append(template / "prefect.db")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "prefect.db").exists():
        shutil.copyfile(_MIGRATED[0], folder / "prefect.db")
    return folder


# Runs a stage (default examples) on an embedded Ray; prints one RESULT line with the manifest.
STAGE_DRIVER = r"""
import json, sys
from pipelines.ray_runtime import ensure_ray
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline

cfg = PipelineConfig.model_validate_json(open(sys.argv[1]).read())
ensure_ray(cfg.ray)
manifest, computed = Pipeline(cfg).run(sys.argv[2] if len(sys.argv) > 2 else "examples")
print("RESULT " + json.dumps(manifest.to_json()))
"""


def start_stage(cfg, tmp_path: Path, stage: str = "examples") -> subprocess.Popen:
    """A subprocess running one stage of `cfg` on its own embedded Ray; it prints one
    `RESULT <manifest JSON>` line at the end."""
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.model_dump_json())
    return subprocess.Popen(
        [sys.executable, "-c", STAGE_DRIVER, str(config_file), stage],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def tasks_running(driver: subprocess.Popen, name: str | tuple[str, ...]) -> list[psutil.Process]:
    """Ray workers under this driver executing task `name` or one of several (Ray titles
    them `ray::<name>`)."""
    prefixes = tuple(f"ray::{n}" for n in ((name,) if isinstance(name, str) else name))
    found = []
    try:
        children = psutil.Process(driver.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if command and command[0].startswith(prefixes):
            found.append(child)
    return found


def kill_one_task(
    driver: subprocess.Popen, task: str | tuple[str, ...], when=lambda: True
) -> tuple[list[int], str, str]:
    """Let the driver run to its end, SIGKILLing one worker running `task` (the first seen
    once `when()` holds); returns (the pids killed, stdout, stderr)."""
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while driver.poll() is None:
            assert time.monotonic() < deadline, "the stage did not finish"
            if not killed and when():
                for worker in tasks_running(driver, task)[:1]:
                    worker.send_signal(signal.SIGKILL)
                    killed.append(worker.pid)
            time.sleep(0.02)
        out, err = driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            kill_tree(driver)
    return killed, out, err


def kill_tree(driver: subprocess.Popen) -> None:
    """SIGKILL the driver and everything it started (its Ray's processes), by pid."""
    try:
        tree = psutil.Process(driver.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    driver.kill()
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    driver.communicate(timeout=30)
