"""OpenAI's embeddings API, as the `openai` package's `embeddings.create` (and LangChain's
OpenAIEmbeddings, LlamaIndex's OpenAIEmbedding) call it:

    POST /v1/embeddings  {"input": text | [texts] | [ids] | [[ids], ...], "model": NAME,
                         "encoding_format": "float" | "base64", "dimensions", "user"}
                         -> {"object": "list", "data": [{"object": "embedding", "index",
                         "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}
    GET  /v1/models      {"object": "list", "data": [{"id", "object": "model", ...}]}

Vectors are unit length (as OpenAI's are), pooled as /embed pools by default. base64 is
the little-endian float32 bytes of each vector. Token ids are the served model's own
vocabulary ids (what /tokenize gives, [CLS] and [SEP] added here), not tiktoken's: a
client that tokenizes with tiktoken first (LangChain's OpenAIEmbeddings by default) must
be told not to (check_embedding_ctx_length=False). `model` may name anything: one model
is served, and the answer names it. `dimensions` is accepted only as the model's size.
Refusals have OpenAI's error shape, {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from bertcore.inference.routes.route import Route, Work
from bertcore.inference.routes.tei import dimensions
from bertcore.inference.validate import Job, Limits, Offer, RequestError, check_fields, count, kind_of, show, texts

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
ERROR_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


def embeddings(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    data = check_fields(data, "/v1/embeddings", FIELDS, '{"input": "some text", "model": "..."}')
    if "input" not in data:
        raise RequestError(422, 'missing field "input": a text, a list of texts, or token ids')
    if not isinstance(data.get("model", ""), str):
        raise RequestError(422, f"model must be a string, got a {kind_of(data['model'])}")
    encoding = data.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise RequestError(422, f'encoding_format must be "float" or "base64", got {show(encoding)}')
    dimensions(data.get("dimensions"), offer)
    value = data["input"]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        job = Job("embed", token_ids=(_ids(value, "input", offer),), pooling=offer.pooling)
    elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        count(len(value), "input", limits)
        job = Job(
            "embed", token_ids=tuple(_ids(v, f"input[{i}]", offer) for i, v in enumerate(value)), pooling=offer.pooling
        )
    else:
        job = Job("embed", texts(value, "input", limits), pooling=offer.pooling)

    def reply(answer: dict) -> dict:
        vectors = answer["embeddings"]
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
            for i, vector in enumerate(vectors)
        ]
        tokens = int(sum(answer["tokens"]))
        return {
            "object": "list",
            "data": data,
            "model": offer.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return Work(job, reply)


def models(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    listed = {
        "object": "list",
        "data": [{"id": offer.model_id, "object": "model", "created": 0, "owned_by": "bertpipe"}],
    }
    return Work(None, lambda answer: listed)


def error(status: int, reason: str) -> dict:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": reason, "type": kind, "param": None, "code": None}}


def _ids(value: Any, where: str, offer: Offer) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError(422, f"{where} must be a non-empty list of token ids, got {show(value)}")
    for k, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < (offer.vocab_size or 0):
            raise RequestError(
                422,
                f"{where}[{k}] is {show(token)}, not a token id of this model's vocabulary "
                f"(0 to {(offer.vocab_size or 1) - 1}); token ids are the served model's own (POST /tokenize), "
                "not tiktoken's",
            )
    return tuple(value)


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


ROUTES = (
    Route("POST", "/v1/embeddings", embeddings, error=error),
    Route("GET", "/v1/models", models, error=error),
)
