"""A training stage's workers after one of them, or its node, was lost: what was lost, how
many workers to go on with, and the section that keeps the same global batch with them.

The choice (documented in docs/operations.md#faults): the stage restarts the worker
group itself, in the same run, rather than through Ray Train's `FailureConfig`, because a
restart may need another world size, and the DeepSpeed config, the loader's sharding and
the gradient accumulation all follow from it. Ray Train restarts with the world size it was
built with; this loop builds a new trainer per attempt.

After a loss the stage waits until Ray has marked the lost node dead (not when the node
still answers: then only a worker process on it was lost), then up to
`rejoin_timeout_s` for the cluster to hold `num_workers` workers again (a restarted node
joins under a new id). Then it goes on with the workers there are, at least `min_workers`:
world size W' with gradient accumulation G' = W x G / W', so the optimizer still steps on
the same global batch, made of the same micro-batches (bertcore/train/loader.py hands global
batches out round-robin, so W' ranks with G' micro-batches each consume exactly what W
ranks with G did). The checkpoint is resumed on W' ranks: ZeRO-1/2 checkpoints are written
in DeepSpeed's elastic layout, whose partitions merge for any data-parallel degree
(bertcore/train/checkpoint.py `load_elastic_checkpoint`), fp32 ZeRO-0 ones hold the whole
optimizer state; ZeRO-3 and bf16 without ZeRO resume only on their own world size.

Light at import: Ray is imported by the functions that use it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from bertcore.errors import BertpipeError

log = logging.getLogger(__name__)

POLL_S = 1.0
DEAD_NODE_WAIT_S = 60.0
"""At most this long for Ray to mark a lost node dead before the wait for workers starts."""

_LOST_TYPES = {
    "WorkerHealthCheckFailedError",
    "WorkerHealthCheckTimeoutError",
    "ActorDiedError",
    "ActorUnavailableError",
    "NodeDiedError",
    "WorkerCrashedError",
    "OwnerDiedError",
    "WorkerGroupStartupTimeoutError",
    "WorkerGroupStartupFailedError",
}


class WorkersLost(BertpipeError):
    """Training lost workers or nodes more often than the section allows, or too few are left."""


def _chain(exc: BaseException):
    """`exc` and the errors it wraps (Ray Train's failures, causes, health-check failures)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [
            getattr(current, name, None)
            for name in ("health_check_failure", "controller_failure", "cause", "__cause__")
        ]
        todo += list((getattr(current, "worker_failures", None) or {}).values())


def lost_workers(exc: BaseException) -> str | None:
    """What was lost, in a few words (`worker rank 1 on node 3f2a9c1e (127.0.0.1)`), when
    `exc` is Ray Train's report of a worker or node that died; None for any other failure."""
    failures = getattr(exc, "worker_failures", None)
    if failures is None and hasattr(exc, "controller_failure"):
        failures = {None: exc.controller_failure}
    if not failures:
        return None
    lost = []
    for rank, failure in sorted(failures.items(), key=lambda item: -1 if item[0] is None else item[0]):
        if any(type(e).__name__ in _LOST_TYPES for e in _chain(failure)):
            where = node_of(failure)
            lost.append(("worker group" if rank is None else f"worker rank {rank}") + (f" on {where}" if where else ""))
    return ", ".join(lost) or None


def node_of(failure: BaseException) -> str:
    """`node 3f2a9c1e (127.0.0.1)` from the text Ray gives of a dead worker, or ''."""
    text = " ".join(str(e) for e in _chain(failure))
    node = re.search(r"node_id='?([0-9a-f]{8})[0-9a-f]*", text) or re.search(r"node ID:? ?([0-9a-f]{8})[0-9a-f]*", text)
    ip = re.search(r"node_ip='?([0-9.]+[0-9])", text) or re.search(r"\bIP:? ?([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)", text)
    if node and ip:
        return f"node {node.group(1)} ({ip.group(1)})"
    if node:
        return f"node {node.group(1)}"
    return f"the node at {ip.group(1)}" if ip else ""


def node_ids(failure: BaseException) -> list[str]:
    """The full hex ids of the nodes named in the failure's text."""
    text = " ".join(str(e) for e in _chain(failure))
    return sorted(
        set(re.findall(r"node_id='?([0-9a-f]{20,})", text)) | set(re.findall(r"node ID:? ?([0-9a-f]{20,})", text))
    )


def workers_available(use_gpu: bool) -> int:
    """Workers the cluster can start now: one free CPU (or GPU) each, on live nodes (the
    lost group's resources come back within a second or two; the wait absorbs that)."""
    import ray

    return int(ray.available_resources().get("GPU" if use_gpu else "CPU", 0.0))


def wait_for_dead(nodes: list[str], timeout_s: float = DEAD_NODE_WAIT_S) -> None:
    """Until each of `nodes` is marked dead by Ray (a killed node is counted alive for a few
    seconds, and its CPUs with it) or answers a probe task: a node that runs one is up, and
    only a worker process on it was lost (killed, crashed), so its CPUs count at once. Was:
    the full timeout for every lost worker whose node lived on (60 s per restart)."""
    import contextlib

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    answer = ray.remote(num_cpus=0, max_retries=0)(_answer)
    waiting = set(nodes)
    probes = {}
    for node in nodes:
        with contextlib.suppress(Exception):  # an id Ray does not take: wait for its death alone
            probes[answer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()] = node
    deadline = time.monotonic() + timeout_s
    try:
        while waiting and time.monotonic() < deadline:
            waiting &= {node["NodeID"] for node in ray.nodes() if node["Alive"]}
            answered, _ = ray.wait(list(probes), num_returns=len(probes), timeout=0) if probes else ([], [])
            for ref in answered:  # done, or failed because the node died: either way not waited for
                waiting.discard(probes.pop(ref))
            if waiting:
                time.sleep(POLL_S)
    finally:
        for ref in probes:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


def _answer() -> bool:
    return True


def world_sizes(cfg: Any) -> list[int]:
    """The world sizes the section can train with at its global batch, largest first:
    W' divides W x G (so G' = W x G / W' is whole), from num_workers down to min_workers."""
    per_step = cfg.num_workers * cfg.gradient_accumulation_steps
    low = cfg.min_workers or 1
    return [w for w in range(cfg.num_workers, low - 1, -1) if per_step % w == 0]


def resizable(cfg: Any) -> bool:
    """Whether the section's checkpoints resume on another world size."""
    return cfg.zero_stage in (1, 2) or (cfg.zero_stage == 0 and cfg.precision == "fp32")


def choose_world_size(cfg: Any, what: str) -> int:
    """Wait up to cfg.rejoin_timeout_s for num_workers workers, then take the largest world
    size the cluster holds; WorkersLost when even min_workers do not fit."""
    deadline = time.monotonic() + cfg.rejoin_timeout_s
    sizes = world_sizes(cfg) if resizable(cfg) else [cfg.num_workers]
    while True:
        available = workers_available(cfg.use_gpu)
        if available >= cfg.num_workers:
            return cfg.num_workers
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    fitting = [w for w in sizes if w <= available]
    if not fitting:
        key = cfg.SECTION
        need = (
            (
                f"{key}.num_workers={cfg.num_workers} (ZeRO-{cfg.zero_stage} {cfg.precision} resumes on its own "
                "world size only)"
            )
            if not resizable(cfg)
            else (f"at least {key}.min_workers={cfg.min_workers or 1} workers")
        )
        raise WorkersLost(
            f"{key}: lost {what}; after {cfg.rejoin_timeout_s:.0f} s the cluster holds {available} "
            f"worker(s), but the run needs {need}; "
            f"its latest checkpoint is kept: add nodes and rerun, or lower {key}.min_workers"
        )
    return fitting[0]


def resized(cfg: Any, world: int) -> Any:
    """The section for `world` workers with the same global batch and micro-batch, and the
    same held-out sample: validation_batches counts batches per worker, and the global
    validation batches go round-robin like the training ones, so W x V of them are the same
    first batches on W' workers at ceil(W x V / W') each (exactly the same when W' divides
    W x V, else up to W' - 1 batches more)."""
    if world == cfg.num_workers:
        return cfg
    gas = cfg.num_workers * cfg.gradient_accumulation_steps // world
    validation = -(-cfg.num_workers * cfg.validation_batches // world)
    return cfg.model_copy(
        update={"num_workers": world, "gradient_accumulation_steps": gas, "validation_batches": validation}
    )
