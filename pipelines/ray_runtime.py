"""Starting or joining Ray, and running a stage's tasks with progress and clear errors."""

from __future__ import annotations

import logging
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray

from bertcore.config import RayConfig
from bertcore.errors import BertpipeError
from pipelines.progress import Progress

log = logging.getLogger(__name__)


def ensure_ray(cfg: RayConfig) -> None:
    """Join `cfg.address`, or start an embedded local Ray with `cfg.num_cpus` CPUs.

    Ray's own driver messages go through the application's logging when it has set some
    up (the CLI does), so they share its format; otherwise Ray prints them its way."""
    if ray.is_initialized():
        return
    configure_logging = not logging.getLogger().handlers
    if cfg.address:
        _loopback_only(_loopback_only_cluster(cfg.address))
        ray.init(address=cfg.address, runtime_env=_cluster_env(), log_to_driver=True, configure_logging=configure_logging)
        log.info("ray: joined %s (%s CPUs)", cfg.address, ray.cluster_resources().get("CPU"))
        return
    _embedded_settings()
    _loopback_only()
    # Ray Train's controller watchdog polls actor state through the state API, which runs
    # in the dashboard process: without it, it warns every second of training. Its address
    # is given to the workers, so they need not guess among the Rays running on the machine.
    dashboard_port = _free_port()
    # "local": always a new Ray, even where `ray start` left a cluster address behind
    context = ray.init(
        address="local",
        num_cpus=cfg.num_cpus,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        runtime_env=_local_env({"RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard_port}"}),
        log_to_driver=True,
        configure_logging=configure_logging,
    )
    log.info("ray: started a local Ray with %d CPUs (dashboard %s)", int(ray.cluster_resources().get("CPU", 0)), context.dashboard_url or "off")


EMBEDDED_ENV = {
    # one machine: no node of an embedded Ray is ever drained or preempted, so Ray Train
    # needs no preemption watcher (an actor Ray warns about at start)
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
WORKER_ENV = {
    # a worker's output is relayed line by line, never to a terminal: no progress bars
    # (tqdm, used by DeepSpeed's checkpoint conversion and by transformers)
    "TQDM_DISABLE": "1",
}


def _embedded_settings() -> None:
    for key, value in EMBEDDED_ENV.items():
        os.environ.setdefault(key, value)
    if "RAY_AUTH_MODE" not in os.environ:
        # Token authentication, as Ray picks by default for a new local cluster, but chosen
        # here: Ray warns when it has to choose. Its own switch sets the mode and makes the
        # already-loaded core read it again; without that switch Ray chooses (and warns).
        try:
            from ray._private.authentication.authentication_token_setup import _enable_token_auth
        except ImportError:  # pragma: no cover - another Ray: let it choose
            return
        _enable_token_auth()


KNOWN_WARNINGS = (
    # DeepSpeed's ZeRO gathers call the deprecated name; nothing a user can change
    (FutureWarning, r"`torch\.distributed\.all_gather_into_tensor` is deprecated"),
    (FutureWarning, r"`torch\.distributed\.reduce_scatter_tensor` is deprecated"),
)


def quiet_known_warnings() -> None:
    """Filter the third-party warnings that are expected here and harmless, by message."""
    for category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def _loopback_only(on: bool = True) -> None:
    """Make the embedded Ray a single-node instance on 127.0.0.1. Ray's gRPC servers (GCS,
    raylet, workers, agents) listen on every interface unless the node's address is the
    loopback address, and `ray.init` turns 127.0.0.1 into the machine's reachable address
    whenever multi-node clusters are enabled. Ray's switch for that (read from
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when ray is imported; off by default on Windows and
    macOS for the same reason) is set here for this process only; the processes Ray starts
    get the address as an argument. tests/test_security.py checks every listening socket."""
    from ray._private import ray_constants

    default = ray_constants.env_bool(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX)
    ray_constants.ENABLE_RAY_CLUSTER = False if on else default


def _loopback_only_cluster(address: str) -> bool:
    """Whether `address` is a Ray on this machine that listens on the loopback interface
    only (another process's embedded Ray): its port answers on 127.0.0.1 but not on the
    machine's outward address. Such a Ray is joined as one, on 127.0.0.1."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outward interface
            outward = probe.getsockname()[0]
        except OSError:  # no route out: leave the choice to Ray
            return False
    try:
        socket.create_connection((outward, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _local_env(env: dict[str, str]) -> dict:
    # workers on this machine share its files: this interpreter's path is enough
    path = os.pathsep.join(filter(None, [_project_root(), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {**WORKER_ENV, **env, "PYTHONPATH": path}}


def _cluster_env() -> dict:
    # nodes have the dependencies installed but maybe another copy of the project, or none:
    # ship the driver's own packages with the job (Ray caches them by content hash)
    import bertcore
    import pipelines

    return {"py_modules": [bertcore, pipelines], "env_vars": dict(WORKER_ENV)}


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unwrap(exc: BaseException) -> BaseException:
    """The user-facing error inside a RayTaskError, if there is one."""
    cause = getattr(exc, "cause", None)
    while cause is not None and not isinstance(cause, BertpipeError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    return cause if isinstance(cause, BaseException) else exc


def run_tasks(
    submit: Callable[[Any], ray.ObjectRef],
    items: Sequence[Any],
    *,
    parallelism: int | None,
    desc: str,
    on_result: Callable[[int, Any], None] | None = None,
    sizes: Sequence[int] | None = None,
    rows: Callable[[Any], int] | None = None,
    unit: str = "units",
) -> list[Any]:
    """Submit one task per item (at most `parallelism` in flight) and return the results in
    item order. A user error raised inside a task is re-raised here unwrapped.

    Progress is logged as `desc k/n units` at a steady cadence (pipelines/progress.py);
    `sizes` (input bytes per item) adds MB/s and an ETA by bytes, `rows(result)` a row count."""
    limit = parallelism or len(items) or 1
    results: list[Any] = [None] * len(items)
    pending: dict[ray.ObjectRef, int] = {}
    next_item = 0
    with Progress(desc, len(items), unit=unit, total_bytes=sum(sizes) if sizes else None) as progress:
        while next_item < len(items) or pending:
            while next_item < len(items) and len(pending) < limit:
                pending[submit(items[next_item])] = next_item
                next_item += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done[0])
            try:
                results[index] = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:
                for ref in pending:
                    ray.cancel(ref)
                error = unwrap(exc)
                if isinstance(error, BertpipeError):
                    raise error from None
                raise
            if on_result is not None:
                on_result(index, results[index])
            progress.advance(rows=rows(results[index]) if rows else 0, nbytes=sizes[index] if sizes else 0)
    return results
