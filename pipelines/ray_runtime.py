"""Starting or joining Ray, and running a stage's tasks with progress and clear errors."""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray

from bertcore.config import RayConfig
from bertcore.errors import BertpipeError, ConfigError
from pipelines.progress import Cost, Forecast, Progress

log = logging.getLogger(__name__)


def ensure_ray(cfg: RayConfig) -> None:
    """Join `cfg.address`, or start an embedded local Ray with `cfg.num_cpus` CPUs.

    `auto` joins the one Ray running on this machine and refuses, in one line, when there is
    none or more than one (`cluster_address`). Ray's own driver messages go through the
    application's logging when it has set some up (the CLI does), so they share its format;
    otherwise Ray prints them its way."""
    if ray.is_initialized():
        return
    configure_logging = not logging.getLogger().handlers
    if cfg.address:
        address = cluster_address(cfg.address)
        _loopback_only(_loopback_only_cluster(address))
        ray.init(
            address=address, runtime_env=_cluster_env(address), log_to_driver=True, configure_logging=configure_logging
        )
        log.info("ray: joined %s (%s CPUs)", address, ray.cluster_resources().get("CPU"))
        return
    _embedded_settings()
    _loopback_only()
    # Ray Train's controller watchdog polls actor state through the state API, which runs
    # in the dashboard process: without it, it warns every second of training. Its address
    # is given to the workers, so they need not guess among the Rays running on the machine.
    for attempt in range(1, DASHBOARD_ATTEMPTS + 1):
        dashboard_port = _free_port()
        try:
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
            break
        except Exception as exc:
            taken = f"127.0.0.1:{dashboard_port} because it's already occupied" in str(
                exc
            ) or "valid port for dashboard" in str(exc)
            if not taken or attempt == DASHBOARD_ATTEMPTS:
                raise
            log.warning(
                (
                    "ray: port %d, free a moment before, was taken before Ray's dashboard bound it; starting "
                    "again on another"
                ),
                dashboard_port,
            )
            ray.shutdown()
    log.info(
        "ray: started a local Ray with %d CPUs (dashboard %s)",
        int(ray.cluster_resources().get("CPU", 0)),
        context.dashboard_url or "off",
    )


def cluster_address(address: str) -> str:
    """The Ray to join for `ray.address`. Ray resolves `auto` as RAY_ADDRESS when that is set,
    else as the GCS of the raylets running on this machine; with two or more it warns and
    joins the one the last `ray start` recorded, which may be another user's, a test's, or
    gone (then ray.init waits on it). Here `auto` must find exactly one, or fails in one
    line naming what it found. Every other address is returned as it is."""
    if address != "auto":
        return address
    if os.environ.get("RAY_ADDRESS", "auto") != "auto":  # a Ray job's driver has its cluster's here
        return os.environ["RAY_ADDRESS"]
    instances = local_ray_instances()
    if len(instances) == 1:
        return next(iter(instances))
    if not instances:
        raise ConfigError(
            "ray.address: auto found no Ray running on this machine; start one (ray start --head), "
            "set ray.address to a cluster's address, or leave it empty for an embedded Ray"
        )
    found = ", ".join(f"{gcs} ({', '.join(dirs) or 'session dir unknown'})" for gcs, dirs in sorted(instances.items()))
    raise ConfigError(
        f"ray.address: auto found {len(instances)} Ray instances on this machine: {found}; "
        "set ray.address to the GCS address (host:port) of the one to join"
    )


def local_ray_instances() -> dict[str, list[str]]:
    """The Rays running on this machine as Ray's `auto` discovery sees them
    (ray._private.services.find_gcs_addresses: the --gcs-address of every raylet process),
    each with the session directories of its raylets here."""
    import psutil
    from ray._private import services

    services.find_gcs_addresses.cache_clear()  # Ray keeps what it found once for the process
    sessions: dict[str, set[str]] = {address: set() for address in services.find_gcs_addresses()}
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if not args or os.path.basename(args[0]) != "raylet":
            continue
        flags = dict(arg[2:].split("=", 1) for arg in args[1:] if arg.startswith("--") and "=" in arg)
        if flags.get("gcs-address") in sessions and flags.get("session_dir"):
            sessions[flags["gcs-address"]].add(flags["session_dir"])
    return {address: sorted(dirs) for address, dirs in sessions.items()}


LEFTOVER_ACTORS = (("AutoscalingCoordinator", "AutoscalingCoordinator"),)
"""(name, namespace) of the detached actors a TorchTrainer.fit() leaves running: Ray Data's
`_AutoscalingCoordinatorActor`, which Ray Train v2 creates (get_if_exists, max_restarts=-1)
and never stops. After a fit, `ray.util.state.list_actors` shows it as the one detached
actor alive; Ray Train's PlacementGroupCleaner, also detached, exits by itself and is left
alone (it removes the placement group of a controller that died)."""


def drop_train_leftovers(timeout_s: float = 30, *, any_job: bool = False) -> list[str]:
    """Kill the detached actors of LEFTOVER_ACTORS that this driver's job created (another
    job's are left alone, unless `any_job`: one a killed driver left), without restart, and
    wait up to `timeout_s` until their names are free, so the next fit() creates a fresh
    one. Returns "namespace/name" of each killed."""
    job = None if any_job else ray.get_runtime_context().get_job_id()
    dropped = []
    for name, namespace in LEFTOVER_ACTORS:
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:  # none alive
            continue
        if job is not None and actor._ray_actor_id.job_id.hex() != job:
            continue
        ray.kill(actor, no_restart=True)
        dropped.append(f"{namespace}/{name}")
    deadline = time.monotonic() + timeout_s
    for entry in dropped:
        namespace, name = entry.split("/", 1)
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break
            time.sleep(0.1)
    return dropped


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
    """Make the embedded Ray a single-node instance on 127.0.0.1. Every process Ray starts
    binds by the node's address: the gRPC servers of the GCS, raylet, workers and dashboard
    agent, and the metrics exporters, listen on 127.0.0.1 when that address is the loopback
    one and on every interface otherwise; the agents' HTTP servers and the client server
    listen on the node's address. `ray.init` and `ray start` turn 127.0.0.1
    into the machine's reachable address whenever multi-node clusters are enabled. Ray's
    switch for that (read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when ray is imported; off by
    default on Windows and macOS for the same reason) is set here for this process only; the
    processes Ray starts get the address as an argument; the dashboard is bound by
    `dashboard_host`. (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head
    --node-ip-address 127.0.0.1` binds a head the same way, but then no node may join it:
    tests/stages/test_ray_cluster.py runs its two nodes in a loopback-only network namespace.)
    tests/stages/test_security.py and tests/stages/test_ray_runtime_loopback.py check every listening socket."""
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


DASHBOARD_ATTEMPTS = 3
"""Starts of an embedded Ray whose dashboard port, free when chosen, was taken by another
process before the dashboard bound it (seen when two Rays start at once on one machine)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _local_env(env: dict[str, str]) -> dict:
    # workers on this machine share its files: this interpreter's path is enough
    path = os.pathsep.join(filter(None, [_project_root(), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {**WORKER_ENV, **env, "PYTHONPATH": path}}


def _cluster_env(address: str) -> dict:
    # nodes have the dependencies installed but maybe another copy of the project, or none:
    # ship the driver's own packages with the job (Ray caches them by content hash)
    import bertcore
    import pipelines

    env = dict(WORKER_ENV)
    if "://" not in address:
        # Ray Train's actors query actor state through the dashboard (its
        # PlacementGroupCleaner every second), which Ray's state API finds from RAY_ADDRESS
        # (the GCS, then the dashboard address the GCS holds); without it they guess among
        # the Rays running on their machine and, where there are several, fail with a
        # "Found multiple active Ray instances" traceback
        env["RAY_ADDRESS"] = address
    return {"py_modules": [bertcore, pipelines], "env_vars": env}


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unwrap(exc: BaseException) -> BaseException:
    """The user-facing error inside a RayTaskError, if there is one."""
    cause = getattr(exc, "cause", None)
    while cause is not None and not isinstance(cause, BertpipeError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    return cause if isinstance(cause, BaseException) else exc


def concurrent_tasks(num_cpus: float, num_gpus: float = 0.0) -> int:
    """How many tasks asking for `num_cpus` CPUs (and `num_gpus` GPUs) the running Ray
    cluster runs at once, at least 1."""
    resources = ray.cluster_resources()
    slots = int(resources.get("CPU", 1.0) // max(num_cpus, 1e-9))
    if num_gpus:
        slots = min(slots, int(resources.get("GPU", 0.0) // num_gpus))
    return max(1, slots)


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
    costs: Sequence[Cost] | None = None,
    slots: int | None = None,
) -> list[Any]:
    """Submit one task per item (at most `parallelism` in flight) and return the results in
    item order. A user error raised inside a task is re-raised here unwrapped.

    Progress is logged as `desc k/n units` at a steady cadence (pipelines/progress.py);
    `sizes` (input bytes per item) adds MB/s and an ETA by bytes, `rows(result)` a row count;
    `costs` (each item's expected cost, pipelines/progress.py) an ETA by the cost left, with
    `slots` items running at once (default: as many as are in flight; `concurrent_tasks`)."""
    limit = parallelism or len(items) or 1
    results: list[Any] = [None] * len(items)
    pending: dict[ray.ObjectRef, int] = {}
    next_item = 0
    forecast = Forecast(costs, min(limit, slots or limit)) if costs is not None else None
    eta = (lambda: forecast.eta(time.perf_counter())) if forecast is not None else None
    with Progress(desc, len(items), unit=unit, total_bytes=sum(sizes) if sizes else None, eta=eta) as progress:
        while next_item < len(items) or pending:
            while next_item < len(items) and len(pending) < limit:
                pending[submit(items[next_item])] = next_item
                if forecast is not None:
                    forecast.start(next_item, time.perf_counter())
                next_item += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(done[0])
            if forecast is not None:
                forecast.finish(index, time.perf_counter())
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
