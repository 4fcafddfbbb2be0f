"""Helpers for tests that start their own servers: a free port and a clean stop."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading

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
