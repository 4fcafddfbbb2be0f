"""The one ASGI app (Starlette) behind `bertpipe serve`, however it runs (launch.py: in this
process under uvicorn, or as each replica of a Ray Serve deployment, replica.py).

    the route families of bertcore/inference/routes/   TEI, OpenAI, Hugging Face's fill-mask
    GET /health    {"status": "ok"} once the model is loaded; never needs a key
    GET /metrics   Prometheus text (with Ray Serve: every replica's, labelled by replica)
    GET /info      TEI's fields (model_id, model_type, max_input_length, ...) and bertpipe's
                   (the run, the manifest fingerprints, how inputs are read, the limits,
                   the batching chosen and what it measured)

Every answer about texts carries x-bertpipe-unknown-tokens (each input's unknown-token
count) and, when an input is nothing but unknown tokens, x-bertpipe-unreadable (their
indexes), whatever its body's shape; the OpenAI route and /embed?details=true say it in
the body as well.

A request goes: API key (keys.py; 401) -> its body, read up to the limit (413 naming it:
past the limit the rest is read and dropped, up to DISCARD_BYTES, so a client that sends
its whole body before reading sees the 413 instead of a closed connection) -> its route's
checks (4xx with a one-line reason, in the family's error shape) -> the batcher's queue
(429 with Retry-After at once when it is full) -> the Engine in the model thread -> its
route's answer shape. An unexpected error answers 500 and leaves the server up; the
traceback goes to the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route as Endpoint

from bertcore.inference.batch_choice import BatchChoice
from bertcore.inference.batcher import Batcher, Overloaded
from bertcore.inference.config import ServeConfig
from bertcore.inference.engine import UNREADABLE, Engine
from bertcore.inference.prometheus import Metrics, render
from bertcore.inference.routes import MOVED, ROUTES, Route
from bertcore.inference.validate import BODY_LIMIT, Limits, Offer, RequestError, read_json
from pipelines.serve.keys import Keys, guarded

log = logging.getLogger(__name__)

PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DISCARD_BYTES = 64 << 20
"""How much of an oversize body is read (and dropped) before its 413 is sent."""
OPS = ("GET /health", "GET /metrics", "GET /info")
UNKNOWN_HEADER, UNREADABLE_HEADER = "x-bertpipe-unknown-tokens", "x-bertpipe-unreadable"


@dataclass
class Server:
    """One server's state: the Engine and its batcher, what it offers, its metrics. With
    Ray Serve, `others()` gives the other replicas' metric snapshots and `push(metrics)`
    hands this one's to them."""

    engine: Engine
    cfg: ServeConfig
    identity: dict
    name: str = "main"
    mode: str = "in-process"
    others: Callable[[], Awaitable[dict]] | None = None
    push: Callable[[Metrics], None] | None = None
    metrics: Metrics = field(default_factory=Metrics)
    inflight: int = 0
    answered: int = 0

    def __post_init__(self) -> None:
        head = self.engine.spec.head or {}
        config = _config(self.engine.spec.folder)
        self.offer = Offer(
            task=head.get("task"),
            head_type=head.get("type"),
            pairs=bool(head.get("pairs")),
            labels=tuple(head.get("labels") or ()),
            mask_token=self.engine.tokenizer.mask_token if self.engine.spec.mlm_dir else None,
            pooling=self.identity["pooling"]["default"],
            top_k=self.cfg.top_k,
            model_id=self.identity["model_name"],
            dimensions=config.get("hidden_size"),
            vocab_size=len(self.engine.tokenizer),
            aliases=tuple(self.cfg.model_aliases),
            token_ids=self.cfg.accept_token_ids,
        )
        self.limits = Limits(self.cfg.max_texts, self.cfg.max_text_bytes)
        self.batcher = Batcher(
            self.engine.run,
            max_batch_requests=self.cfg.max_batch_requests,
            batch_wait_ms=self.cfg.batch_wait_ms,
            max_queued_texts=self.cfg.max_queued_texts,
            record=self._record,
            choice=BatchChoice.of(self.cfg),
            tokens=lambda calls: sum(call.read for call in calls),
        )

    def routes(self) -> list[Route]:
        return [route for route in ROUTES if route.offered(self.offer)]

    def info(self, threads: int) -> dict:
        """/info: TEI's fields, then bertpipe's."""
        offer, cfg, identity = self.offer, self.cfg, self.identity
        if offer.classifies:
            labels = offer.labels or (offer.task,)
            model_type = {
                "classifier": {
                    "id2label": {str(i): label for i, label in enumerate(labels)},
                    "label2id": {label: i for i, label in enumerate(labels)},
                }
            }
        else:
            model_type = {"embedding": {"pooling": offer.pooling}}
        return {
            "model_id": offer.model_id,
            "model_sha": identity.get("fingerprint"),
            "model_dtype": identity.get("quantize") or "float32",
            "model_type": model_type,
            "max_concurrent_requests": cfg.max_queued_texts,
            "max_input_length": identity["max_tokens"]["embed"],
            "max_batch_tokens": cfg.max_batch_tokens,
            "max_batch_requests": cfg.max_batch_requests,
            "max_client_batch_size": cfg.max_texts,
            "auto_truncate": True,
            "tokenization_workers": 1,
            "version": _version(),
            **identity,
            "pairs": offer.pairs if offer.task else None,
            "mode": self.mode,
            "endpoints": [f"{r.method} {r.path}" for r in self.routes()] + list(OPS),
            "model_aliases": list(offer.aliases),
            "accept_token_ids": offer.token_ids,
            "unreadable": cfg.unreadable,
            "batching": {
                **self.batcher.choice.state(),
                "max_batch_tokens": cfg.max_batch_tokens,
                "max_batch_requests": cfg.max_batch_requests,
                "batch_wait_ms": cfg.batch_wait_ms,
                "max_queued_texts": cfg.max_queued_texts,
            },
            "limits": {
                "max_texts": cfg.max_texts,
                "max_text_bytes": cfg.max_text_bytes,
                "max_body_bytes": self.limits.max_body_bytes,
            },
            "replica": {"id": self.name, "pid": os.getpid(), "threads": threads},
        }

    def _record(self, batch, started: float, calls, answers) -> None:
        self.metrics.observe("bertpipe_batch_requests", len(batch))
        for waiting in batch:
            self.metrics.observe("bertpipe_queue_seconds", started - waiting.arrived, kind=waiting.job.kind)
            self.metrics.count("bertpipe_texts_total", waiting.job.size, kind=waiting.job.kind)
        for waiting, answer in zip(batch, answers):
            kind = waiting.job.kind
            if isinstance(answer, dict) and "unknown" in answer:
                self.metrics.count("bertpipe_unknown_tokens_total", sum(answer["unknown"]), kind=kind)
                self.metrics.count("bertpipe_unreadable_inputs_total", sum(answer["unreadable"]), kind=kind)
            elif isinstance(answer, RequestError) and answer.code == UNREADABLE:
                self.metrics.count("bertpipe_unreadable_inputs_total", 1, kind=kind)
        for call in calls or ():
            self.metrics.observe("bertpipe_call_rows", call.rows)
            self.metrics.observe("bertpipe_call_tokens", call.tokens)
            self.metrics.observe("bertpipe_call_seconds", call.seconds)

    def count(self, endpoint: str, status: int, arrived: float) -> None:
        self.metrics.count("bertpipe_requests_total", endpoint=endpoint, code=str(status))
        self.metrics.observe("bertpipe_request_seconds", time.perf_counter() - arrived, endpoint=endpoint)
        if self.push is not None:
            self.push(self.metrics)

    async def metrics_page(self) -> str:
        snapshots = {self.name: self.metrics.snapshot()}
        if self.others is not None:
            snapshots = {**await self.others(), **snapshots}
        return render(snapshots)


def build_app(server: Server, keys: Keys, threads: int) -> Any:
    """The ASGI app of `server`: its routes, the service's own, the API keys in front."""
    endpoints = [Endpoint(route.path, _handler(server, route), methods=[route.method]) for route in server.routes()]
    info = server.info(threads)

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(await server.metrics_page(), media_type=PROMETHEUS_TYPE)

    async def about(request: Request) -> Response:
        return _json(server.info(threads))  # anew: the batching chosen and measured changes as it serves

    for path, handler in (("/health", health), ("/metrics", metrics), ("/info", about)):
        endpoints.append(Endpoint(path, _counted(server, path, handler), methods=["GET"]))
    listed = ", ".join(info["endpoints"])

    async def refused(request: Request, exc: HTTPException) -> Response:
        path = request.url.path
        if exc.status_code == 405:
            allowed = [
                m.strip() for m in (exc.headers or {}).get("Allow", "").split(",") if m.strip() not in ("", "HEAD")
            ]
            reason = f"{path} takes {', '.join(allowed) or 'another method'}, not {request.method}"
        elif path in MOVED:
            reason = f"no endpoint {path}: it is {MOVED[path]} now (see the changelog); the endpoints are: {listed}"
        else:
            reason = f"no endpoint {path}; the endpoints are: {listed}"
        response = _json({"error": reason}, exc.status_code)
        server.count("other", exc.status_code, time.perf_counter())
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.batcher.start()
        yield
        await server.batcher.stop()
        cut = f"; {server.inflight} were cut off by serve.drain_timeout_s" if server.inflight else ""
        log.info("bertpipe serve: stopped; %d requests answered%s", server.answered, cut)

    app = Starlette(routes=endpoints, lifespan=lifespan, exception_handlers={404: refused, 405: refused})
    errors = {route.path: route.error for route in ROUTES}
    return guarded(
        app, keys, open_paths=("/health",), error=lambda path, reason: errors.get(path, _plain_error)(401, reason)
    )


def _handler(server: Server, route: Route):
    async def handle(request: Request) -> Response:
        arrived = time.perf_counter()
        server.inflight += 1
        try:
            data = None
            if route.method == "POST":
                data = read_json(await read_body(request, server.limits.max_body_bytes), server.limits)
            work = route.parse(data, request.query_params, server.offer, server.limits)
            answer = await server.batcher.submit(work.job, arrived) if work.job is not None else {}
            response = _json(work.reply(answer), headers=_unknown_headers(answer))
        except RequestError as exc:
            response = _json(route.error(exc.status, exc.reason, exc.param, exc.code), exc.status)
        except Overloaded as exc:
            response = _json(route.error(429, str(exc)), 429, headers={"Retry-After": str(exc.retry_after)})
        except Exception as exc:  # one request fails, the server stays
            log.exception("bertpipe serve: %s failed", route.path)
            response = _json(
                route.error(500, f"internal error ({type(exc).__name__}); the server's log has the traceback"), 500
            )
        finally:
            server.inflight -= 1
        server.answered += 1
        server.count(route.path, response.status_code, arrived)
        return response

    return handle


def _counted(server: Server, path: str, handler):
    async def handle(request: Request) -> Response:
        arrived = time.perf_counter()
        response = await handler(request)
        server.count(path, response.status_code, arrived)
        return response

    return handle


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 naming the limit once it passes `limit` bytes (see the
    module docstring for what is read of the rest)."""
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        over = over or size > limit
        if over and size > DISCARD_BYTES:
            break
        if not over:
            chunks.append(chunk)
    if over:
        how_big = f"{declared} bytes" if declared.isdigit() else f"over {limit} bytes"
        raise RequestError(
            413, f"the request body is {how_big}, over the limit of {limit} bytes {BODY_LIMIT}; split the request"
        )
    return b"".join(chunks)


def _json(value: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def _plain_error(status: int, reason: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": reason}


def _unknown_headers(answer: dict) -> dict[str, str] | None:
    """What the vocabulary could not read, on every answer about texts, whatever the body's
    shape: UNKNOWN_HEADER (per input, its unknown-token count) and, when some input is
    nothing but unknown tokens, UNREADABLE_HEADER (their indexes)."""
    if "unknown" not in answer:
        return None
    headers = {UNKNOWN_HEADER: ",".join(str(n) for n in answer["unknown"])}
    unreadable = [str(i) for i, flagged in enumerate(answer["unreadable"]) if flagged]
    if unreadable:
        headers[UNREADABLE_HEADER] = ",".join(unreadable)
    return headers


def _config(folder: str) -> dict:
    import json

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bertpipe")
    except PackageNotFoundError:
        return "0+unknown"
