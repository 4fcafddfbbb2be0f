"""The Ray Serve deployment behind `bertpipe serve`: each replica holds one Engine
(bertcore/inference/engine.py) and answers HTTP itself; Ray Serve's proxy routes requests
to the replicas and replaces one that dies.

    POST /embed /classify /fill-mask   JSON in and out (bertcore/inference/validate.py)
    GET  /health                       {"status": "ok"} once the replica has its model
    GET  /metrics                      Prometheus text: every replica's counters and histograms
    GET  /info                         the model, its run, the manifest fingerprint, max tokens

A request is checked (and refused with its 4xx and a one-line JSON reason) before it is
queued. Checked requests of every endpoint share one queue (`@serve.batch`): a batch runs
when serve.max_batch_requests have come or serve.batch_wait_ms after its first, and the
Engine cuts its texts into model calls within serve.max_batch_tokens. The model runs in a
worker thread, so the replica goes on taking requests while it computes. An unexpected
error answers 500 for the requests of that batch and leaves the replica up; the traceback
goes to the replica's log.

Metrics: each replica counts its own (bertcore/inference/prometheus.py) and hands a
snapshot to one small Ray actor, the board, at most every `PUSH_EVERY_S`; /metrics shows
every replica's last snapshot (its own current one), labelled by replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from bertcore.inference.config import ServeConfig
from bertcore.inference.engine import Engine
from bertcore.inference.prometheus import Metrics, render
from bertcore.inference.validate import Limits, Offer, RequestError, parse

log = logging.getLogger("ray.serve")

ROUTES = {
    "/embed": ("POST", "embed"),
    "/classify": ("POST", "classify"),
    "/fill-mask": ("POST", "fill_mask"),
    "/health": ("GET", "health"),
    "/metrics": ("GET", "metrics"),
    "/info": ("GET", "info"),
}
PUSH_EVERY_S = 1.0
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@ray.remote(num_cpus=0)
class Board:
    """The replicas' latest metric snapshots, {replica: snapshot}."""

    def __init__(self) -> None:
        self.snapshots: dict[str, dict] = {}

    def put(self, replica: str, snapshot: dict) -> None:
        self.snapshots[replica] = snapshot

    def get(self) -> dict[str, dict]:
        return self.snapshots


@serve.deployment(name="bertpipe", health_check_period_s=5, graceful_shutdown_timeout_s=5)
class Replica:
    def __init__(self, source: Any, storage: Any, cfg: ServeConfig, threads: int, board: Any) -> None:
        _bind_to_the_node_address()
        self.engine = Engine(source.engine_spec(storage, cfg.max_batch_tokens, threads))
        head = source.head_info
        self.offer = Offer(
            task=head["task"] if head else None, head_type=head["type"] if head else None,
            mask_token=self.engine.tokenizer.mask_token if self.engine.spec.mlm_dir else None, pooling=source.pooling, top_k=cfg.top_k,
        )
        self.limits = Limits(cfg.max_texts, cfg.max_text_bytes)
        self.metrics = Metrics()
        self.board, self.pushed = board, 0.0
        self.name = serve.get_replica_context().replica_id.unique_id
        self.info = {
            **source.identity,
            "endpoints": [f"{method} {path}" for path, (method, kind) in ROUTES.items() if self._offers(kind)],
            "batching": {"max_batch_tokens": cfg.max_batch_tokens, "max_batch_requests": cfg.max_batch_requests, "batch_wait_ms": cfg.batch_wait_ms},
            "limits": {"max_texts": cfg.max_texts, "max_text_bytes": cfg.max_text_bytes, "max_body_bytes": self.limits.max_body_bytes},
            "replica": {"id": self.name, "pid": os.getpid(), "threads": threads},
        }
        self.batch.set_max_batch_size(cfg.max_batch_requests)
        self.batch.set_batch_wait_timeout_s(cfg.batch_wait_ms / 1000)

    def _offers(self, kind: str) -> bool:
        if kind == "classify":
            return self.offer.head_type in ("classification", "regression")
        return kind != "fill_mask" or self.offer.mask_token is not None

    async def __call__(self, request: Request) -> Response:
        arrived = time.perf_counter()
        path = request.url.path.rstrip("/") or "/"
        endpoint = path if path in ROUTES else "other"
        try:
            if path not in ROUTES:
                raise RequestError(404, f"no endpoint {path}; the endpoints are: {', '.join(ROUTES)}")
            method, kind = ROUTES[path]
            if request.method != method:
                raise RequestError(405, f"{path} takes {method}, not {request.method}")
            if kind == "health":
                response = JSONResponse({"status": "ok"})
            elif kind == "metrics":
                response = PlainTextResponse(await self._metrics_page(), media_type=PROMETHEUS_TYPE)
            elif kind == "info":
                response = JSONResponse(self.info)
            else:
                job = parse(kind, await _body(request, self.limits.max_body_bytes), self.limits, self.offer)
                response = JSONResponse(await self.batch((job, arrived)))
        except RequestError as exc:
            response = JSONResponse({"error": exc.reason}, status_code=exc.status)
        except Exception as exc:  # noqa: BLE001 - one request fails, the replica stays
            log.exception("bertpipe serve: %s failed", path)
            response = JSONResponse({"error": f"internal error ({type(exc).__name__}); the replica's log has the traceback"}, status_code=500)
        self.metrics.count("bertpipe_requests_total", endpoint=endpoint, code=str(response.status_code))
        self.metrics.observe("bertpipe_request_seconds", time.perf_counter() - arrived, endpoint=endpoint)
        self._push()
        return response

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def batch(self, items: list[tuple[Any, float]]) -> list[dict]:
        """One batch: every request's job through the Engine in a worker thread."""
        started = time.perf_counter()
        jobs = [job for job, _ in items]
        self.metrics.observe("bertpipe_batch_requests", len(items))
        for job, arrived in items:
            self.metrics.observe("bertpipe_queue_seconds", started - arrived, endpoint=f"/{job.kind.replace('_', '-')}")
            self.metrics.count("bertpipe_texts_total", len(job.texts), endpoint=f"/{job.kind.replace('_', '-')}")
        answers, calls = await asyncio.to_thread(self.engine.run, jobs)
        for call in calls:
            self.metrics.observe("bertpipe_call_rows", call.rows)
            self.metrics.observe("bertpipe_call_tokens", call.tokens)
            self.metrics.observe("bertpipe_call_seconds", call.seconds)
        return answers

    def _push(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.pushed >= PUSH_EVERY_S:
            self.pushed = now
            self.board.put.remote(self.name, self.metrics.snapshot())

    async def _metrics_page(self) -> str:
        snapshots = {self.name: self.metrics.snapshot()}
        try:
            snapshots = {**await asyncio.wait_for(self.board.get.remote(), timeout=2.0), **snapshots}
        except (asyncio.TimeoutError, ray.exceptions.RayError):  # the board is gone: this replica's own
            log.warning("bertpipe serve: the metrics board did not answer; /metrics shows this replica only")
        return render(snapshots)


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


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is {declared} bytes, over the limit of {limit} (serve.max_texts x serve.max_text_bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the request body is over the limit of {limit} bytes (serve.max_texts x serve.max_text_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)
