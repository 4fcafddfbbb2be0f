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


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@contextlib.contextmanager
def listening_sockets(every: float = 0.2):
    """While the block runs, polls every listening TCP socket of this process's descendants
    (an embedded Ray's GCS, raylet, agents and workers, the Ray Train workers' torch store
    among them); yields {process name: {address, ...}}, filled as they are seen."""
    seen: dict[str, set[str]] = {}
    stop_polling = threading.Event()

    def poll() -> None:
        while not stop_polling.is_set():
            for process in psutil.Process().children(recursive=True):
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
        subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], check=True, capture_output=True,
                       env={**env, "PREFECT_HOME": str(template), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}, timeout=600)
        _MIGRATED.append(template / "prefect.db")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "prefect.db").exists():
        shutil.copyfile(_MIGRATED[0], folder / "prefect.db")
    return folder
