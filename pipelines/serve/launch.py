"""Starting `bertpipe serve` in one of its two modes, then waiting until Ctrl-C or SIGTERM,
and taking it all down again.

- in-process (the default): one uvicorn process on `host:port` holds the app (app.py), the
  batcher and the model, which runs in a worker thread on `serve.threads` threads (every
  core by default). No Ray. On SIGTERM or Ctrl-C, uvicorn stops listening, answers the
  requests it holds (for at most serve.drain_timeout_s) and the process exits.
- Ray Serve (`--replicas N` > 1, or `ray.address` set): Ray (embedded, or the cluster at
  `ray.address`), Ray Serve's HTTP proxy on `host:port` and N replicas of the same app
  (replica.py). Each replica reserves `threads` CPUs in Ray and runs its model on that
  many threads (serve.threads; by default the cluster's CPUs divided among the replicas,
  at most one node's), so replicas never share cores; replicas that would need more CPUs
  than the cluster has are refused before anything starts. Ray's own processes stay on
  loopback as pipelines/ray_runtime.py binds them.

Either way the HTTP port listens where `host` says, 127.0.0.1 by default.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from bertcore.errors import BertpipeError, ConfigError

log = logging.getLogger(__name__)

APP = "bertpipe"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
STOP_TIMEOUT_S = 20
IN_PROCESS, RAY_SERVE = "in-process", "Ray Serve"


class ServeFailed(BertpipeError):
    """The server or its replicas did not start."""


def mode(cfg: Any, replicas: int) -> str:
    """Ray Serve for several replicas or a Ray cluster, else in-process."""
    return RAY_SERVE if replicas > 1 or cfg.ray.address else IN_PROCESS


def replica_threads(setting: int | None, replicas: int, node_cpus: list[float]) -> int:
    """Threads (and CPUs) per replica: `setting`, else the cluster's CPUs (`node_cpus`, one
    entry per node) divided among the replicas, at most one node's; ConfigError when the
    replicas do not fit."""
    total, biggest = int(sum(node_cpus)), int(max(node_cpus, default=0))
    threads = setting or max(1, min(biggest, total // replicas))
    if replicas * threads > total or threads > biggest:
        raise ConfigError(
            f"--replicas {replicas} x {threads} threads each (serve.threads) need {replicas * threads} CPUs, "
            f"at most {biggest} on one node; the Ray cluster has {total}: lower --replicas or serve.threads"
        )
    return threads


def _embedded_cpus(cfg: Any) -> list[float]:
    """The CPUs the embedded Ray will have (ray.num_cpus, else Ray's own count)."""
    try:
        from ray._private.utils import get_num_cpus
    except ImportError:  # pragma: no cover - another Ray
        return [float(cfg.ray.num_cpus or os.cpu_count() or 1)]
    return [float(cfg.ray.num_cpus or get_num_cpus())]


def serve(
    cfg: Any,
    storage: Any,
    source: Any,
    *,
    host: str,
    port: int,
    replicas: int,
    keys: Any,
    started: Callable[[str, int], None],
    on_ray: Callable[[], Any] = lambda: None,
) -> None:
    """Serve `source` until SIGINT or SIGTERM, in the mode `mode` names; `keys`: the API
    keys (keys.py); `started(url, threads)` is called once the server answers; with Ray
    Serve, `on_ray()` once Ray is up (the CLI routes Ray's relayed lines through its logging)."""
    if mode(cfg, replicas) == IN_PROCESS:
        _in_process(cfg, storage, source, host=host, port=port, keys=keys, started=started)
    else:
        _ray_serve(
            cfg, storage, source, host=host, port=port, replicas=replicas, keys=keys, started=started, on_ray=on_ray
        )


def _in_process(
    cfg: Any, storage: Any, source: Any, *, host: str, port: int, keys: Any, started: Callable[[str, int], None]
) -> None:
    import asyncio

    import uvicorn

    from bertcore.inference.engine import Engine
    from pipelines.serve.app import Server, build_app

    _check_port(host, port)
    threads = cfg.serve.threads or len(os.sched_getaffinity(0))
    engine = Engine(source.engine_spec(storage, cfg.serve.max_batch_tokens, threads, cfg.serve.unreadable))
    app = build_app(Server(engine, cfg.serve, source.identity), keys, threads)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=cfg.serve.drain_timeout_s,
    )
    web = uvicorn.Server(config)

    async def run() -> None:
        serving = asyncio.ensure_future(web.serve())  # uvicorn takes SIGINT and SIGTERM: stop listening, drain, exit
        while not web.started and not serving.done():
            await asyncio.sleep(0.02)
        if web.started:
            started(_url(host, port), threads)
        await serving
        if not web.started:
            raise ServeFailed(f"the server did not start on {host}:{port} (uvicorn's line above says why)")

    # uvicorn handles SIGINT and SIGTERM while it serves and raises them again once it has
    # stopped, to whatever handled them before: here nothing, so a drained stop exits 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn without its standard extras
        asyncio.run(run())
    else:
        uvloop.run(run())


def _ray_serve(
    cfg: Any,
    storage: Any,
    source: Any,
    *,
    host: str,
    port: int,
    replicas: int,
    keys: Any,
    started: Callable[[str, int], None],
    on_ray: Callable[[], Any],
) -> None:
    import ray
    from ray import serve as ray_serve

    from pipelines.ray_runtime import ensure_ray
    from pipelines.serve.replica import Board, Replica

    embedded = not cfg.ray.address
    if embedded:  # the proxy and the replicas run here: refuse a taken port or too few CPUs before Ray starts
        _check_port(host, port)
        threads = replica_threads(cfg.serve.threads, replicas, _embedded_cpus(cfg))
    try:
        ensure_ray(cfg.ray)
    except Exception as exc:  # noqa: BLE001 - e.g. a raylet that timed out on a busy machine: one line, not a traceback
        reason = " ".join(str(exc).split())[:300]
        raise ServeFailed(
            f"Ray did not start ({reason}); try again, or serve in-process (no --replicas, no ray.address)"
        ) from None
    stop = threading.Event()
    for signum in (
        signal.SIGINT,
        signal.SIGTERM,
    ):  # after ray.init, whose core worker installs its own SIGTERM handler (it aborts)
        signal.signal(signum, lambda *_: stop.set())
    logging.getLogger("ray.serve").setLevel(
        logging.WARNING
    )  # its start-up lines: the start line below says what matters
    try:
        on_ray()
        if not embedded:
            threads = replica_threads(
                cfg.serve.threads, replicas, [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
            )
        ray_serve.start(
            http_options={"host": host, "port": port},
            proxy_location="HeadOnly",
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        board = Board.remote()
        app = Replica.options(
            num_replicas=replicas,
            max_ongoing_requests=max(cfg.serve.max_ongoing_requests, cfg.serve.max_batch_requests),
            graceful_shutdown_timeout_s=cfg.serve.drain_timeout_s,
            ray_actor_options={"num_cpus": threads},
        ).bind(source, storage, cfg.serve, threads, board, keys)
        try:
            ray_serve.run(app, name=APP, route_prefix="/", blocking=False)
        except RuntimeError as exc:
            reason = " ".join(str(exc).split())
            raise ServeFailed(
                f"the replicas did not start: {reason[-400:]} (Ray's session logs, serve/ folder, have the traceback)"
            ) from None
        started(_url(host, port), threads)
        stop.wait()
    finally:
        _shutdown(ray_serve, embedded=embedded, drain_s=cfg.serve.drain_timeout_s)


def _url(host: str, port: int) -> str:
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _check_port(host: str, port: int) -> None:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
                "choose another --port, or stop what holds it"
            ) from None


def _shutdown(ray_serve, *, embedded: bool, drain_s: float) -> None:
    """The app (its replicas answer what they hold, for at most `drain_s`), and with an
    embedded Ray, Ray Serve and Ray (on a cluster, Serve and its other apps stay);
    whatever is left after drain_s + STOP_TIMEOUT_S goes with this process."""
    import ray

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
    if not done.wait(drain_s + STOP_TIMEOUT_S):
        log.warning("bertpipe serve: Ray Serve did not stop within %d s; exiting", drain_s + STOP_TIMEOUT_S)


def start_line(
    identity: dict, url: str, host: str, serving: str, replicas: int, threads: int, keyed: bool, batching: str = ""
) -> str:
    """What the command prints once it serves: the model, its run, where, how, whether it
    needs a key, and how it batches (`batching`: BatchChoice.describe())."""
    quantize = " " + identity["quantize"] if identity["quantize"] else ""
    what = f"{identity['model_name']} ({identity['stage']} stage, {identity['format']}{quantize})"
    where = url
    if host not in LOOPBACK_HOSTS:
        where += f", listening on {host}: reachable from other machines, not only this one"
        if not keyed:
            where += "; WARNING: no API key, so anyone who reaches it can use it (--api-key or BERTPIPE_API_KEY)"
    how = (
        f"in-process, {threads} thread(s)"
        if serving == IN_PROCESS
        else f"Ray Serve, {replicas} replica(s) x {threads} thread(s)"
    )
    return (
        f"bertpipe serve: {what} of run {identity['run']} at {where}; {how}; "
        f"{'API key required' if keyed else 'no API key'}; {f'{batching}; ' if batching else ''}"
        "POST /v1/embeddings /embed / /predict /tokenize /fill-mask, "
        "GET /health /metrics /info (what this model answers); Ctrl-C stops"
    )
