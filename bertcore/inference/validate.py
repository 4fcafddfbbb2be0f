"""What a request to `bertpipe serve` may hold, checked before it is queued: each refusal
is a RequestError with an HTTP status and one line that says what was wrong and where.

Bodies are JSON objects, as text-embeddings-inference and the Hugging Face inference API
take them: `inputs` is one text or a list of texts, and each endpoint has its options:

    /embed       {"inputs": ..., "pooling": "cls" | "mean", "normalize": true}
    /classify    {"inputs": ..., "task": NAME}        (task: optional, must be the served one)
    /fill-mask   {"inputs": ..., "top_k": 5}          (each text holds the [MASK] token)

    400  the body is not UTF-8, or not JSON
    404  the model does not have that task (no head, another task, no masked-LM head)
    413  the body, a text or the number of texts is over its limit
    422  a field is missing, unknown or of the wrong type; a text is empty
"""

from __future__ import annotations

import json
from dataclasses import dataclass

POOLINGS = ("cls", "mean")
KINDS = ("embed", "classify", "fill_mask")
FIELDS = {"embed": ("inputs", "pooling", "normalize"), "classify": ("inputs", "task"), "fill_mask": ("inputs", "top_k")}
MAX_TOP_K = 100


class RequestError(Exception):
    """A request the service refuses: `status` (4xx) and a one-line `reason`."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """serve.max_texts and serve.max_text_bytes."""

    max_texts: int
    max_text_bytes: int

    @property
    def max_body_bytes(self) -> int:
        """A body that could hold max_texts texts of max_text_bytes each, JSON-quoted and
        escaped within reason, and the options."""
        return self.max_texts * (self.max_text_bytes + 16) + 4096


@dataclass(frozen=True)
class Offer:
    """What the served model can do: its task head (None without one; `head_type`
    classification or regression for /classify), its mask token when it has a masked-LM
    head (None: no /fill-mask), and the defaults of the options."""

    task: str | None
    head_type: str | None
    mask_token: str | None
    pooling: str
    top_k: int


@dataclass(frozen=True)
class Job:
    """One request's work: its kind, its texts and its options."""

    kind: str
    texts: tuple[str, ...]
    pooling: str = "mean"
    normalize: bool = True
    top_k: int = 5


def read_json(body: bytes, limits: Limits) -> dict:
    """The JSON object in `body`, or a RequestError (400 not UTF-8 or not JSON, 413 too large,
    422 not an object)."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"the request body is {len(body)} bytes, over the limit of {limits.max_body_bytes} (serve.max_texts x serve.max_text_bytes)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"the request body is not UTF-8: byte 0x{body[exc.start]:02x} at offset {exc.start}; send JSON encoded as UTF-8") from None
    if not text.strip():
        raise RequestError(400, 'the request body is empty; send a JSON object such as {"inputs": ["some text"]}')
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(data, dict):
        raise RequestError(422, f'the request body is a JSON {_kind(data)}; send an object such as {{"inputs": ["some text"]}}')
    return data


def parse(kind: str, body: bytes, limits: Limits, offer: Offer) -> Job:
    """The Job a request to endpoint `kind` (embed, classify, fill_mask) asks for, or a
    RequestError naming the field and what to send instead."""
    if kind == "classify" and offer.head_type not in ("classification", "regression"):
        what = f"its head is for {offer.task}, a {offer.head_type} task" if offer.task else "it has no task head"
        raise RequestError(404, f"/classify: the served model cannot classify ({what}); start bertpipe serve with --task NAME of a classification task")
    if kind == "fill_mask" and offer.mask_token is None:
        raise RequestError(404, "/fill-mask: the served model has no masked-LM head (a fine-tuned task model, or weights saved without cls.predictions)")
    data = read_json(body, limits)
    unknown = sorted(set(data) - set(FIELDS[kind]))
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; /{kind.replace('_', '-')} takes: {', '.join(FIELDS[kind])}")
    texts = _texts(data, limits)
    if kind == "embed":
        pooling = data.get("pooling", offer.pooling)
        if pooling not in POOLINGS:
            raise RequestError(422, f"pooling must be one of {', '.join(map(repr, POOLINGS))}, got {_show(pooling)}")
        normalize = data.get("normalize", True)
        if not isinstance(normalize, bool):
            raise RequestError(422, f"normalize must be true or false, got {_show(normalize)}")
        return Job(kind, texts, pooling=pooling, normalize=normalize)
    if kind == "classify":
        task = data.get("task", offer.task)
        if not isinstance(task, str):
            raise RequestError(422, f"task must be a string, got {_show(task)}")
        if task != offer.task:
            raise RequestError(404, f"the served model has no task {task!r}; it serves {offer.task!r}")
        return Job(kind, texts)
    top_k = data.get("top_k", offer.top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise RequestError(422, f"top_k must be a whole number from 1 to {MAX_TOP_K}, got {_show(top_k)}")
    for i, text in enumerate(texts):
        if offer.mask_token not in text:
            where = "inputs" if isinstance(data["inputs"], str) else f"inputs[{i}]"
            raise RequestError(422, f"{where} holds no {offer.mask_token}; put {offer.mask_token} where a word is to be predicted")
    return Job(kind, texts, top_k=top_k)


def _texts(data: dict, limits: Limits) -> tuple[str, ...]:
    if "inputs" not in data:
        raise RequestError(422, 'missing field "inputs": one text or a list of texts')
    inputs = data["inputs"]
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list):
        raise RequestError(422, f"inputs must be a string or a list of strings, got a {_kind(inputs)}")
    if not texts:
        raise RequestError(422, "inputs is an empty list; send at least one text")
    if len(texts) > limits.max_texts:
        raise RequestError(413, f"inputs holds {len(texts)} texts, over the limit of {limits.max_texts} (serve.max_texts); split the request")
    for i, text in enumerate(texts):
        where = "inputs" if isinstance(inputs, str) else f"inputs[{i}]"
        if not isinstance(text, str):
            raise RequestError(422, f"{where} is a {_kind(text)}, not a string")
        if not text.strip():
            raise RequestError(422, f"{where} is empty{' (only whitespace)' if text else ''}; every text needs some content")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise RequestError(422, f"{where} holds an unpaired surrogate (a lone \\ud800-\\udfff escape), which is not text") from None
        if size > limits.max_text_bytes:
            raise RequestError(413, f"{where} is {size} bytes of UTF-8, over the limit of {limits.max_text_bytes} (serve.max_text_bytes)")
    return tuple(texts)


def _kind(value: object) -> str:
    """JSON's name for the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _show(value: object) -> str:
    """A value for a message: short, on one line."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."
