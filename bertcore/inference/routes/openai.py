"""OpenAI's embeddings API, as the `openai` package's `embeddings.create` (and LangChain's
OpenAIEmbeddings, LlamaIndex's OpenAIEmbedding) call it:

    POST /v1/embeddings  {"input": text | [texts] | [ids] | [[ids], ...], "model": NAME,
                         "encoding_format": "float" | "base64", "dimensions", "user"}
                         -> {"object": "list", "data": [{"object": "embedding", "index",
                         "embedding", "unknown_tokens", "unreadable"}], "model", "usage":
                         {"prompt_tokens", "total_tokens", "unknown_tokens"}}
    GET  /v1/models      {"object": "list", "data": [{"id", "object": "model", ...}]}

Vectors are unit length (as OpenAI's are), pooled as /embed pools by default. base64 is
the little-endian float32 bytes of each vector. `usage.prompt_tokens` counts the tokens the
model read, special tokens included; `unknown_tokens` how many tokens of each input (and of
all) the vocabulary could not read ([UNK]); `unreadable` is true for an input that is
nothing but unknown tokens (see serve.unreadable).

Token ids are read only when the server was told they are the served model's own
(serve.accept_token_ids: what /tokenize gives, [CLS] and [SEP] added unless they are
there): ids from another tokenizer would be read as this vocabulary's and give a wrong
vector, so by default a list of ids is refused (422), naming the usual sender, LangChain's
OpenAIEmbeddings, which tokenizes with tiktoken unless check_embedding_ctx_length=False.

`model` must name the served model (the id GET /v1/models lists) or one of the aliases the
recipe gives (serve.model_aliases); another name gets 404 model_not_found, as OpenAI
answers it, so a client pointed at the wrong server or model fails loudly. A request
without `model` (OpenAI's own API requires it) is answered by the served model, as before:
an absent name cannot name the wrong model. `dimensions` is accepted only
as the model's size. Refusals have OpenAI's error shape, {"error": {"message", "type",
"param", "code"}}.
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
MODEL_NOT_FOUND = "model_not_found"


def embeddings(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    data = check_fields(data, "/v1/embeddings", FIELDS, '{"input": "some text", "model": "..."}')
    served(data.get("model"), offer)
    if "input" not in data:
        raise RequestError(422, 'missing field "input": a text, a list of texts, or token ids')
    encoding = data.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise RequestError(422, f'encoding_format must be "float" or "base64", got {show(encoding)}')
    dimensions(data.get("dimensions"), offer)
    value = data["input"]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        _token_ids_taken(offer)
        job = Job("embed", token_ids=(_ids(value, "input", offer),), pooling=offer.pooling)
    elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        _token_ids_taken(offer)
        count(len(value), "input", limits)
        job = Job(
            "embed", token_ids=tuple(_ids(v, f"input[{i}]", offer) for i, v in enumerate(value)), pooling=offer.pooling
        )
    else:
        job = Job("embed", texts(value, "input", limits), pooling=offer.pooling)

    def reply(answer: dict) -> dict:
        vectors = answer["embeddings"]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": _encoded(vector, encoding),
                "unknown_tokens": unknown,
                "unreadable": unreadable,
            }
            for i, (vector, unknown, unreadable) in enumerate(zip(vectors, answer["unknown"], answer["unreadable"]))
        ]
        tokens = int(sum(answer["tokens"]))
        return {
            "object": "list",
            "data": data,
            "model": offer.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "unknown_tokens": int(sum(answer["unknown"]))},
        }

    return Work(job, reply)


def models(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    listed = {
        "object": "list",
        "data": [{"id": offer.model_id, "object": "model", "created": 0, "owned_by": "bertpipe"}],
    }
    return Work(None, lambda answer: listed)


def error(status: int, reason: str, param: str | None = None, code: str | None = None) -> dict:
    kind = (
        "invalid_request_error"
        if code == MODEL_NOT_FOUND
        else ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    )
    return {"error": {"message": reason, "type": kind, "param": param, "code": code}}


def served(model: Any, offer: Offer) -> None:
    """`model` names the served model or one of its aliases, or is left out; else 404
    model_not_found (the shape OpenAI answers it in)."""
    if model is None:
        return
    if not isinstance(model, str):
        raise RequestError(422, f"model must be a string, got a {kind_of(model)}", param="model")
    if model not in offer.names:
        aliases = f" (or {', '.join(map(repr, offer.aliases))})" if offer.aliases else ""
        raise RequestError(
            404,
            f"the model {show(model)} does not exist here: this server serves {offer.model_id!r}{aliases}, as GET "
            "/v1/models lists; set model to that, or add the name to serve.model_aliases",
            param="model",
            code=MODEL_NOT_FOUND,
        )


def _token_ids_taken(offer: Offer) -> None:
    if not offer.token_ids:
        raise RequestError(
            422,
            "input holds token ids, and this server reads text: ids from another tokenizer (tiktoken's, which "
            "LangChain's OpenAIEmbeddings sends unless check_embedding_ctx_length=False) would be read as this "
            "model's vocabulary and give a wrong vector; send the text, or start the server with "
            "serve.accept_token_ids: true if the ids come from its own POST /tokenize",
            param="input",
        )


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
