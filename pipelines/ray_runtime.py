"""Starting or joining Ray, and running a stage's tasks with progress and clear errors."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import ray
from tqdm.auto import tqdm

from bertcore.config import RayConfig
from bertcore.errors import BertpipeError

log = logging.getLogger(__name__)


def ensure_ray(cfg: RayConfig) -> None:
    """Join `cfg.address`, or start an embedded local Ray with `cfg.num_cpus` CPUs."""
    if ray.is_initialized():
        return
    if cfg.address:
        _loopback_only(_loopback_only_cluster(cfg.address))
        ray.init(address=cfg.address, runtime_env=_cluster_env(), log_to_driver=True)
    else:
        _loopback_only()
        # "local": always a new Ray, even where `ray start` left a cluster address behind
        ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, runtime_env=_local_env(), log_to_driver=True)
    log.info("ray: %s CPUs available", ray.cluster_resources().get("CPU"))


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


def _local_env() -> dict:
    # workers on this machine share its files: this interpreter's path is enough
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [_project_root(), os.environ.get("PYTHONPATH")]))}}


def _cluster_env() -> dict:
    # nodes have the dependencies installed but maybe another copy of the project, or none:
    # ship the driver's own packages with the job (Ray caches them by content hash)
    import bertcore
    import pipelines

    return {"py_modules": [bertcore, pipelines]}


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
) -> list[Any]:
    """Submit one task per item (at most `parallelism` in flight) and return the results in
    item order. A user error raised inside a task is re-raised here unwrapped."""
    limit = parallelism or len(items) or 1
    results: list[Any] = [None] * len(items)
    pending: dict[ray.ObjectRef, int] = {}
    next_item = 0
    with tqdm(total=len(items), desc=desc, unit="task", disable=None, leave=False) as bar:
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
            bar.update(1)
    return results
