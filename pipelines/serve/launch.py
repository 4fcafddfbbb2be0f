"""Starting `bertpipe serve`: Ray (embedded, or the cluster at `ray.address`), Ray Serve's
HTTP proxy on `host:port`, the replicas; then waiting until Ctrl-C or SIGTERM, and taking
it all down again.

The proxy listens where `host` says, 127.0.0.1 by default; Ray's own processes stay on
loopback as pipelines/ray_runtime.py binds them. Each replica reserves `threads` CPUs in Ray
and runs its model on that many threads (serve.threads; by default the cluster's CPUs
divided among the replicas, at most one node's), so replicas never share cores; replicas
that would need more CPUs than the cluster has are refused before anything starts.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import ray

from bertcore.errors import BertpipeError, ConfigError
from pipelines.ray_runtime import ensure_ray

log = logging.getLogger(__name__)

APP = "bertpipe"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
STOP_TIMEOUT_S = 20


class ServeFailed(BertpipeError):
    """The replicas did not start."""


def replica_threads(setting: int | None, replicas: int, node_cpus: list[float]) -> int:
    """Threads (and CPUs) per replica: `setting`, else the cluster's CPUs (`node_cpus`, one
    entry per node) divided among the replicas, at most one node's; ConfigError when the
    replicas do not fit."""
    total, biggest = int(sum(node_cpus)), int(max(node_cpus, default=0))
    threads = setting or max(1, min(biggest, total // replicas))
    if replicas * threads > total or threads > biggest:
        raise ConfigError(
            f"--replicas {replicas} x {threads} threads each (serve.threads) need {replicas * threads} CPUs, at most {biggest} on one node; "
            f"the Ray cluster has {total}: lower --replicas or serve.threads"
        )
    return threads


def _embedded_cpus(cfg: Any) -> list[float]:
    """The CPUs the embedded Ray will have (ray.num_cpus, else Ray's own count)."""
    try:
        from ray._private.utils import get_num_cpus
    except ImportError:  # pragma: no cover - another Ray
        import os

        return [float(cfg.ray.num_cpus or os.cpu_count() or 1)]
    return [float(cfg.ray.num_cpus or get_num_cpus())]


def serve(
    cfg: Any, storage: Any, source: Any, *, host: str, port: int, replicas: int,
    started: Callable[[str, int], None], on_ray: Callable[[], Any] = lambda: None,
) -> None:
    """Serve `source` until SIGINT or SIGTERM; `on_ray()` is called once Ray is up (the CLI
    routes Ray's relayed lines through its logging), `started(url, threads)` once the
    replicas answer."""
    from ray import serve as ray_serve

    from pipelines.serve.app import Board, Replica

    embedded = not cfg.ray.address
    if embedded:  # the proxy and the replicas run here: refuse a taken port or too few CPUs before Ray starts
        _check_port(host, port)
        threads = replica_threads(cfg.serve.threads, replicas, _embedded_cpus(cfg))
    ensure_ray(cfg.ray)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # after ray.init, whose core worker installs its own SIGTERM handler (it aborts)
        signal.signal(signum, lambda *_: stop.set())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its start-up lines: the start line below says what matters
    try:
        on_ray()
        if not embedded:
            threads = replica_threads(cfg.serve.threads, replicas, [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")])
        ray_serve.start(
            http_options={"host": host, "port": port},
            proxy_location="HeadOnly",
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        board = Board.remote()
        app = Replica.options(
            num_replicas=replicas,
            max_ongoing_requests=max(cfg.serve.max_ongoing_requests, cfg.serve.max_batch_requests),
            ray_actor_options={"num_cpus": threads},
        ).bind(source, storage, cfg.serve, threads, board)
        try:
            ray_serve.run(app, name=APP, route_prefix="/", blocking=False)
        except RuntimeError as exc:
            reason = " ".join(str(exc).split())
            raise ServeFailed(f"the replicas did not start: {reason[-400:]} (Ray's session logs, serve/ folder, have the traceback)") from None
        started(f"http://{'[' + host + ']' if ':' in host else host}:{port}", threads)
        stop.wait()
    finally:
        _shutdown(ray_serve, embedded=embedded)


def _check_port(host: str, port: int) -> None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}); choose another --port, or stop what holds it") from None


def _shutdown(ray_serve, *, embedded: bool) -> None:
    """The app, and with an embedded Ray, Ray Serve and Ray (on a cluster, Serve and its
    other apps stay); whatever is left after STOP_TIMEOUT_S goes with this process."""
    done = threading.Event()

    def down() -> None:
        for step in (lambda: ray_serve.delete(APP), ray_serve.shutdown if embedded else None, ray.shutdown):
            try:
                if step is not None:
                    step()
            except Exception as exc:  # noqa: BLE001 - stopping: what is left goes with the process
                log.debug("bertpipe serve: while stopping: %s", exc)
        done.set()

    threading.Thread(target=down, daemon=True).start()
    if not done.wait(STOP_TIMEOUT_S):
        log.warning("bertpipe serve: Ray Serve did not stop within %d s; exiting", STOP_TIMEOUT_S)


def start_line(identity: dict, url: str, host: str, replicas: int, threads: int) -> str:
    """What the command prints once it serves: the model, its run, where, and how."""
    what = f"{identity['model_name']} ({identity['stage']} stage, {identity['format']}{' ' + identity['quantize'] if identity['quantize'] else ''})"
    where = url if host in LOOPBACK_HOSTS else f"{url}, listening on {host}: reachable from other machines, not only this one"
    return (
        f"bertpipe serve: {what} of run {identity['run']} at {where}; {replicas} replica(s) x {threads} thread(s); "
        f"POST /embed /classify /fill-mask, GET /health /metrics /info; Ctrl-C stops"
    )
