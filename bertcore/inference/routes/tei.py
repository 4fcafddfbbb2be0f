"""text-embeddings-inference (TEI) routes, in TEI's shapes, so its clients (huggingface_hub's
InferenceClient, LlamaIndex's TextEmbeddingsInference, chromadb's HuggingFaceEmbeddingServer)
work unmodified:

    POST /embed     {"inputs": text | [texts], "normalize": true, "truncate": bool,
                     "truncation_direction": "right" | "left", "pooling": "cls" | "mean"}
                    -> [[float, ...], ...], one vector per text. `pooling` is bertpipe's
                    own (default: what the evaluation chose). With the query parameter
                    ?details=true: {"embeddings", "pooling", "normalized", "tokens",
                    "truncated", "unknown_tokens", "unreadable"} (per text: tokens read,
                    whether text was left unread, tokens the vocabulary could not read,
                    whether it is nothing but those).
    POST /predict   {"inputs": text | [a, b] | [[a, b], ...] | [text, ...], "raw_scores":
                    false, "truncate", "truncation_direction", "parameters": {"top_k",
                    "function_to_apply"}} -> [{"label", "score"}, ...] largest first, per
                    input (a list of them for a batch, and always with "parameters",
                    as Hugging Face's inference API answers). A pair head takes pairs only and
                    reads a list of two texts as one pair, as TEI does; a single-text head
                    reads a list of texts as a batch. Regression: [{"label": task, "score"}].
    POST /          Hugging Face's inference API shape: a body with "parameters" (what
                    InferenceClient's task methods send) is the served model's pipeline,
                    /predict with a task head, else /fill-mask; without it, /embed.
    POST /tokenize  {"inputs": text | [texts], "add_special_tokens": true} -> per text
                    [{"id", "text", "special", "start", "stop"}, ...]

`truncate` absent or true: an input is read as the run reads it (cut at the model's length,
or in windows; TEI with --auto-truncate); false: an input the model would not read whole
is refused with a 413 that says how long it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bertcore.inference.routes.route import Route, Work
from bertcore.inference.validate import (
    POOLINGS,
    Job,
    Limits,
    Offer,
    RequestError,
    check_fields,
    count,
    flag,
    kind_of,
    no_prompt,
    show,
    text,
    texts,
    top_k,
    truncation,
)

EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "pooling")
PREDICT_FIELDS = ("inputs", "raw_scores", "truncate", "truncation_direction", "parameters")
TOKENIZE_FIELDS = ("inputs", "add_special_tokens", "prompt_name")
FUNCTIONS = ("softmax", "sigmoid", "none")
"""Hugging Face's function_to_apply for text classification."""


def embed(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    data = check_fields(data, "/embed", EMBED_FIELDS)
    no_prompt(data)
    dimensions(data.get("dimensions"), offer)
    pooling = data.get("pooling", offer.pooling)
    if pooling not in POOLINGS:
        raise RequestError(422, f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {show(pooling)}")
    truncate, left = truncation(data)
    job = Job(
        "embed",
        _inputs(data, limits),
        pooling=pooling,
        normalize=flag(data, "normalize", True),
        truncate=truncate,
        left=left,
    )
    if query.get("details", "").lower() in ("1", "true"):
        return Work(
            job,
            lambda answer: {
                **{k: answer[k] for k in ("embeddings", "pooling", "normalized", "tokens", "truncated", "unreadable")},
                "unknown_tokens": answer["unknown"],
            },
        )
    return Work(job, lambda answer: answer["embeddings"])


def predict(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    _can_predict(offer)
    data = check_fields(data, "/predict", PREDICT_FIELDS)
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise RequestError(422, f"parameters must be an object, got a {kind_of(parameters)}")
    unknown = sorted(set(parameters) - {"top_k", "function_to_apply"})
    if unknown:
        raise RequestError(
            422, f"unknown parameter {unknown[0]!r}; /predict's parameters are top_k and function_to_apply"
        )
    function = parameters.get("function_to_apply") or "softmax"
    if function not in FUNCTIONS:
        raise RequestError(422, f"function_to_apply must be one of {', '.join(FUNCTIONS)}, got {show(function)}")
    if flag(data, "raw_scores", False):
        function = "none"
    keep = top_k(parameters.get("top_k"), max(1, len(offer.labels))) if parameters.get("top_k") is not None else None
    firsts, seconds, single = _predict_inputs(data.get("inputs"), offer, limits)
    truncate, left = truncation(data)
    job = Job("classify", firsts, second=seconds, truncate=truncate, left=left)

    pipeline = "parameters" in data  # the Hugging Face inference API's shape: a list per input, always

    def reply(answer: dict) -> Any:
        scored = [_scores(logits, offer, function)[:keep] for logits in answer["logits"]]
        return scored[0] if single and not pipeline else scored

    return Work(job, reply)


def root(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    if isinstance(data, dict) and "parameters" in data:
        if offer.classifies:
            return predict(data, query, offer, limits)
        if offer.mask_token is not None:
            from bertcore.inference.routes.pipeline import fill_mask

            return fill_mask(data, query, offer, limits)
        raise RequestError(
            404,
            'POST / with "parameters" is a task pipeline, and the served model has no task head and no masked-LM head; '
            'send {"inputs": ...} without parameters for embeddings',
        )
    if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
        raise RequestError(
            422,
            "inputs is an object (sentence similarity?); bertpipe serve embeds texts: "
            "POST them to /embed and compare the vectors",
        )
    return embed(data, query, offer, limits)


def tokenize(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    data = check_fields(data, "/tokenize", TOKENIZE_FIELDS)
    no_prompt(data)
    job = Job("tokenize", _inputs(data, limits), add_special_tokens=flag(data, "add_special_tokens", True))
    return Work(job, lambda answer: answer["tokens"])


def dimensions(value: Any, offer: Offer) -> None:
    """`dimensions` is accepted only as the model's own size: it was not trained to be cut."""
    if value is not None and value != offer.dimensions:
        raise RequestError(
            422,
            f"dimensions {show(value)}: this model's embeddings have {offer.dimensions} dimensions and cannot be "
            "shortened (it was not trained for it); leave dimensions out",
        )


def _inputs(data: dict, limits: Limits) -> tuple[str, ...]:
    if "inputs" not in data:
        raise RequestError(422, 'missing field "inputs": one text or a list of texts')
    return texts(data["inputs"], "inputs", limits)


def _can_predict(offer: Offer) -> None:
    if not offer.classifies:
        what = f"its head is for {offer.task}, a {offer.head_type} task" if offer.task else "it has no task head"
        raise RequestError(
            404,
            f"/predict: the served model cannot classify ({what}); start bertpipe serve with --task NAME of a "
            "classification or regression task",
        )


def _predict_inputs(value: Any, offer: Offer, limits: Limits) -> tuple[tuple[str, ...], tuple[str, ...] | None, bool]:
    """(first texts, second texts or None, whether the request held one input) from TEI's
    and Hugging Face's shapes (see the module docstring)."""
    if value is None:
        raise RequestError(422, 'missing field "inputs": a text, a pair [a, b], or a list of them')
    if isinstance(value, (str, dict)) or (
        offer.pairs and isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)
    ):
        items, single = [value], True
    elif isinstance(value, list):
        items, single = value, False
        if not items:
            raise RequestError(422, "inputs is an empty list; send at least one text or pair")
    else:
        raise RequestError(422, f"inputs must be a text, a pair [a, b] or a list of them, got a {kind_of(value)}")
    count(len(items), "inputs", limits)
    pairs = [_one(item, "inputs" if single else f"inputs[{i}]", limits) for i, item in enumerate(items)]
    for i, (_, second) in enumerate(pairs):
        where = "inputs" if single else f"inputs[{i}]"
        if offer.pairs and second is None:
            raise RequestError(
                422,
                f"{where} is a single text, and the served head ({offer.task}) was fine-tuned on text pairs: "
                'send ["first text", "second text"], or a list of such pairs',
            )
        if not offer.pairs and second is not None:
            raise RequestError(
                422,
                f"{where} is a pair, and the served head ({offer.task}) was fine-tuned on single texts: send one text",
            )
    return tuple(a for a, _ in pairs), (tuple(b for _, b in pairs) if offer.pairs else None), single


def _one(item: Any, where: str, limits: Limits) -> tuple[str, str | None]:
    """One input: a text, [text], [a, b], or Hugging Face's {"text", "text_pair"}."""
    if isinstance(item, str):
        return text(item, where, limits), None
    if isinstance(item, dict):
        unknown = sorted(set(item) - {"text", "text_pair"})
        if unknown or "text" not in item:
            raise RequestError(422, f'{where} is an object; a pair is {{"text": a, "text_pair": b}} or [a, b]')
        second = item.get("text_pair")
        return text(item["text"], f"{where}.text", limits), None if second is None else text(
            second, f"{where}.text_pair", limits
        )
    if isinstance(item, list) and len(item) in (1, 2):
        return text(item[0], f"{where}[0]", limits), text(item[1], f"{where}[1]", limits) if len(item) == 2 else None
    raise RequestError(
        422,
        f"{where} must be a text or a pair [a, b], got a {kind_of(item)}"
        f"{' of ' + str(len(item)) if isinstance(item, list) else ''}",
    )


def _scores(logits: np.ndarray, offer: Offer, function: str) -> list[dict]:
    """Every label with its score, largest first (regression: the task's one value)."""
    if offer.head_shape == "score":
        return [{"label": offer.task, "score": float(logits[0])}]
    logits = logits.astype(np.float64)
    if function == "softmax":
        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
    elif function == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = logits
    labels = offer.labels or tuple(f"LABEL_{i}" for i in range(len(scores)))
    return [{"label": labels[i], "score": float(scores[i])} for i in np.argsort(-scores, kind="stable")]


ROUTES = (
    Route("POST", "/embed", embed),
    Route("POST", "/", root),
    Route("POST", "/predict", predict, offered=lambda offer: offer.classifies),
    Route("POST", "/tokenize", tokenize),
)
