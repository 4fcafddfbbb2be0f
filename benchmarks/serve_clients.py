"""The services and the load generator of benchmarks/serve.py: a server subprocess on
127.0.0.1 (stopped by pid), closed-loop asyncio clients (aiohttp, on uvloop when
installed) against it, the figures of what they saw, the CPU they and the server used
meanwhile, and the replica-kill phase."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class Service:
    """A server subprocess on 127.0.0.1, stopped by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, command: list[str], port: int, ready: str | None):
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        deadline = time.monotonic() + 600
        while not self._ready(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n" + "".join(self.lines)[-4000:])
            time.sleep(0.5)

    def _ready(self, line: str | None) -> bool:
        if line is not None:
            return any(out.startswith(line) for out in self.lines)
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server's process tree so far (the living processes)."""
        import psutil

        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for process in [root, *root.children(recursive=True)]:
                try:
                    times = process.cpu_times()
                    total += times.user + times.system
                except psutil.NoSuchProcess:
                    pass
        except psutil.NoSuchProcess:
            pass
        return total

    def info(self) -> dict:
        with urllib.request.urlopen(self.url + "/info", timeout=10) as response:
            return json.load(response)

    def stop(self) -> None:
        import psutil

        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def load(service, pool: list[str], concurrency: int, requests: int, seconds: float, warmup: int) -> dict:
    """Closed-loop clients; returns the timed requests' figures, with the CPU the clients
    (this process) and the server used meanwhile."""
    import aiohttp

    url = service.url
    records: list[tuple[float, float, str]] = []  # (sent, answered, outcome), seconds from the start
    counter = iter(range(10**9))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int) -> str:
            try:
                async with session.post(url + "/embed", json={"inputs": [pool[i % len(pool)]]}) as response:
                    await response.read()
                    return str(response.status)
            except (TimeoutError, aiohttp.ClientError) as exc:
                return type(exc).__name__

        async def worker(stop_at: float, budget: int, keep: bool, origin: float) -> None:
            while time.perf_counter() < stop_at:
                i = next(counter)
                if i >= budget:
                    return
                sent = time.perf_counter()
                outcome = await one(i)
                if keep:
                    records.append((sent - origin, time.perf_counter() - origin, outcome))

        start = time.perf_counter()
        await asyncio.gather(*(worker(start + 120, max(warmup, concurrency), False, start) for _ in range(concurrency)))
        counter = iter(range(10**9))
        client_cpu, server_cpu, origin = time.process_time(), service.cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(worker(origin + seconds, requests, True, origin) for _ in range(concurrency)))
        wall = time.perf_counter() - origin
        client_cpu, server_cpu = time.process_time() - client_cpu, service.cpu_seconds() - server_cpu
    cores = len(os.sched_getaffinity(0))
    return {**figures(records), "client_share": client_cpu / wall / cores, "server_share": server_cpu / wall / cores}


def figures(records: list[tuple[float, float, str]]) -> dict:
    ok = [(sent, done) for sent, done, outcome in records if outcome == "200"]
    latency = np.array([done - sent for sent, done in ok]) * 1e3
    elapsed = max((done for _, done, _ in records), default=0.0)
    errors: dict[str, int] = {}
    for _, _, outcome in records:
        if outcome != "200":
            errors[outcome] = errors.get(outcome, 0) + 1
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": errors,
        "seconds": elapsed,
        "throughput": len(ok) / elapsed if elapsed else 0.0,
        **{f"p{q}": float(np.percentile(latency, q)) if len(latency) else float("nan") for q in (50, 95, 99)},
    }


async def kill_phase(service, pool: list[str], seconds: float) -> dict:
    """8 clients for `seconds`; one replica is SIGKILLed after 3 s. What the clients saw."""
    import aiohttp

    known = {service.info()["replica"]["pid"] for _ in range(12)}  # the replicas (/info answers from either)
    before = min(known)
    records: list[tuple[float, float, str]] = []
    origin = time.perf_counter()
    killed_at: list[float] = []
    replaced_at: list[float] = []

    async def killer() -> None:
        await asyncio.sleep(3.0)
        os.kill(before, signal.SIGKILL)  # the replica: a descendant of the server this benchmark started
        killed_at.append(time.perf_counter() - origin)
        while time.perf_counter() - origin < seconds:
            await asyncio.sleep(0.25)
            try:
                pid = (await asyncio.to_thread(service.info))["replica"]["pid"]
            except OSError:
                continue
            if pid not in known:  # a replica that was not there before the kill
                replaced_at.append(time.perf_counter() - origin)
                return

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=8), timeout=aiohttp.ClientTimeout(total=60)
    ) as session:

        async def worker(k: int) -> None:
            i = k
            while time.perf_counter() - origin < seconds:
                sent = time.perf_counter() - origin
                try:
                    async with session.post(service.url + "/embed", json={"inputs": [pool[i % len(pool)]]}) as response:
                        await response.read()
                        outcome = str(response.status)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    outcome = type(exc).__name__
                records.append((sent, time.perf_counter() - origin, outcome))
                i += 8
                if outcome != "200":
                    await asyncio.sleep(0.05)  # a client backs off a little after an error

        await asyncio.gather(killer(), *(worker(k) for k in range(8)))
    kill = killed_at[0]
    after = [r for r in records if r[0] >= kill or r[1] >= kill]
    failed = [r for r in after if r[2] != "200"]
    recovered = min((done for sent, done, outcome in records if outcome == "200" and sent > kill), default=None)
    return {
        "killed_at": kill,
        "replaced_at": replaced_at[0] if replaced_at else None,
        "first_success_after": recovered,
        "requests_after_kill": len(after),
        "failed": len(failed),
        "failures": {o: sum(1 for r in failed if r[2] == o) for o in sorted({r[2] for r in failed})},
        "longest_wait_s": max((done - sent for sent, done, _ in after), default=0.0),
    }


def run_async(coroutine):
    """The load generator's event loop: uvloop when installed (less CPU per request)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)
