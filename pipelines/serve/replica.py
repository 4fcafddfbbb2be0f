"""The Ray Serve shape of `bertpipe serve` (`--replicas N` > 1, or `ray.address` set): each
replica holds one Engine and serves the same ASGI app as the in-process server
(app.py), as a Ray Serve ingress deployment; Ray Serve's proxy routes requests to the
replicas and replaces one that dies.

Metrics: each replica counts its own and hands a snapshot to one small Ray actor, the
board, at most every `PUSH_EVERY_S`; /metrics shows every replica's last snapshot (its
own current one), labelled by replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray import serve

from bertcore.inference.config import ServeConfig
from bertcore.inference.engine import Engine
from pipelines.serve.app import Server, build_app
from pipelines.serve.keys import Keys

log = logging.getLogger("ray.serve")

PUSH_EVERY_S = 1.0


@ray.remote(num_cpus=0)
class Board:
    """The replicas' latest metric snapshots, {replica: snapshot}."""

    def __init__(self) -> None:
        self.snapshots: dict[str, dict] = {}

    def put(self, replica: str, snapshot: dict) -> None:
        self.snapshots[replica] = snapshot

    def get(self) -> dict[str, dict]:
        return self.snapshots


@serve.deployment(name="bertpipe", health_check_period_s=5)
@serve.ingress()
class Replica:
    def __init__(self, source: Any, storage: Any, cfg: ServeConfig, threads: int, board: Any, keys: Keys) -> None:
        _bind_to_the_node_address()
        engine = Engine(source.engine_spec(storage, cfg.max_batch_tokens, threads, cfg.unreadable))
        name = serve.get_replica_context().replica_id.unique_id
        self.board, self.pushed, self.keys, self.threads = board, 0.0, keys, threads
        self.server = Server(
            engine, cfg, source.identity, name=name, mode="Ray Serve", others=self._others, push=self._push
        )

    def __serve_build_asgi_app__(self):
        return build_app(self.server, self.keys, self.threads)

    def _push(self, metrics: Any) -> None:
        now = time.monotonic()
        if now - self.pushed >= PUSH_EVERY_S:
            self.pushed = now
            self.board.put.remote(self.server.name, metrics.snapshot())

    async def _others(self) -> dict:
        try:
            return await asyncio.wait_for(self.board.get.remote(), timeout=2.0)
        except (TimeoutError, ray.exceptions.RayError):  # the board is gone: this replica's own
            log.warning("bertpipe serve: the metrics board did not answer; /metrics shows this replica only")
            return {}


def _bind_to_the_node_address() -> None:
    """Ray Serve 2.60 starts each replica's inter-deployment gRPC server on "[::]:0", every
    interface of the machine (ray/serve/_private/replica.py, after the constructor runs);
    other replicas and the proxy reach it by the node's address and the port it reports.
    Bound to the node's address instead, as Ray binds its own processes: 127.0.0.1 for the
    embedded Ray (pipelines/ray_runtime.py), the node's IP on a cluster. Another Ray
    without that module attribute is left as it is."""
    from ray.serve._private import replica as serve_replica

    bind = getattr(serve_replica, "add_port_to_grpc_server", None)
    if bind is None or getattr(bind, "bertpipe_node_address", False):
        return
    node = ray.util.get_node_ip_address()
    host = f"[{node}]" if ":" in node else node

    def on_the_node(server, address: str):
        return bind(server, f"{host}:{address.rsplit(':', 1)[1]}" if address.startswith("[::]:") else address)

    on_the_node.bertpipe_node_address = True
    serve_replica.add_port_to_grpc_server = on_the_node
