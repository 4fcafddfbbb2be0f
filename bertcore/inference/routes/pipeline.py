"""The Hugging Face inference API's fill-mask shape, as transformers' fill-mask pipeline
answers and huggingface_hub's InferenceClient.fill_mask reads it:

    POST /fill-mask  {"inputs": "a [MASK] text" | [texts], "parameters": {"top_k": 5,
                     "targets": [words]}}
                     -> [{"score", "token", "token_str", "sequence"}, ...] for a text with
                     one [MASK]; a list of those per [MASK] for a text with several; a
                     list per text when inputs is a list. `sequence` is the text with
                     that [MASK] filled. `top_k` may also stand beside `inputs`.

`targets` scores only the given words (each by its first token, as the pipeline does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertcore.inference.routes.route import Route, Work
from bertcore.inference.validate import Job, Limits, Offer, RequestError, check_fields, kind_of, texts, top_k

FIELDS = ("inputs", "parameters", "top_k")
MAX_TARGETS = 100


def fill_mask(data: Any, query: Mapping[str, str], offer: Offer, limits: Limits) -> Work:
    if offer.mask_token is None:
        raise RequestError(
            404,
            "/fill-mask: the served model has no masked-LM head (a fine-tuned task model, or weights saved without "
            "cls.predictions)",
        )
    data = check_fields(data, "/fill-mask", FIELDS, '{"inputs": "a [MASK] text"}')
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise RequestError(422, f"parameters must be an object, got a {kind_of(parameters)}")
    unknown = sorted(set(parameters) - {"top_k", "targets"})
    if unknown:
        raise RequestError(422, f"unknown parameter {unknown[0]!r}; /fill-mask's parameters are top_k and targets")
    k = top_k(parameters.get("top_k", data.get("top_k")), offer.top_k)
    targets = parameters.get("targets")
    if targets is not None:
        targets = [targets] if isinstance(targets, str) else targets
        if (
            not isinstance(targets, list)
            or not targets
            or len(targets) > MAX_TARGETS
            or not all(isinstance(t, str) and t.strip() for t in targets)
        ):
            raise RequestError(422, f"targets must be a word or a list of 1 to {MAX_TARGETS} words")
    if "inputs" not in data:
        raise RequestError(422, f'missing field "inputs": a text holding {offer.mask_token}, or a list of them')
    inputs = texts(data["inputs"], "inputs", limits)
    for i, one in enumerate(inputs):
        if offer.mask_token not in one:
            where = "inputs" if isinstance(data["inputs"], str) else f"inputs[{i}]"
            raise RequestError(
                422, f"{where} holds no {offer.mask_token}; put {offer.mask_token} where a word is to be predicted"
            )
    job = Job("fill_mask", inputs, top_k=k, targets=tuple(targets) if targets else None)
    single = isinstance(data["inputs"], str)

    def reply(answer: dict) -> Any:
        shaped = [_text(one, per_mask, offer.mask_token) for one, per_mask in zip(inputs, answer["predictions"])]
        return shaped[0] if single else shaped

    return Work(job, reply)


def _text(one: str, per_mask: list[list[dict]], mask: str) -> list:
    """One text's predictions: a list of candidates with one [MASK], a list per [MASK] else."""
    pieces = one.split(mask)
    shaped = []
    for m, candidates in enumerate(per_mask):
        shaped.append(
            [
                {
                    **c,
                    "sequence": "".join(p + (c["token_str"] if i == m else mask) for i, p in enumerate(pieces[:-1]))
                    + pieces[-1],
                }
                for c in candidates
            ]
        )
    return shaped[0] if len(shaped) == 1 else shaped


ROUTES = (Route("POST", "/fill-mask", fill_mask, offered=lambda offer: offer.mask_token is not None),)
