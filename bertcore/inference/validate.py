"""What a request to `bertpipe serve` may hold, checked before it is queued: each refusal
is a RequestError with an HTTP status and one line that says what was wrong and where.

The route families (bertcore/inference/routes/) read their own shapes with the helpers
here: a JSON object (`read_json`), its fields (`check_fields`), texts (`texts`), and the
options every family shares (`flag`, `truncation`). What they make of a request is a
`Job`, what the Engine runs; what the served model can do is an `Offer`.

    400  the body is not UTF-8, or not JSON
    404  the model does not have that task (no head, another task, no masked-LM head); a
         `model` that names no served model (OpenAI's model_not_found)
    413  the body, a text or the number of texts is over its limit; with truncate false, an
         input longer than the model reads
    422  a field is missing, unknown or of the wrong type; a text is empty; token ids where
         the server was not told they are its own tokenizer's (serve.accept_token_ids)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

POOLINGS = ("cls", "mean")
KINDS = ("embed", "classify", "fill_mask", "tokenize")
MAX_TOP_K = 100
BODY_LIMIT = "(serve.max_texts x serve.max_text_bytes)"


class RequestError(Exception):
    """A request the service refuses: `status` (4xx) and a one-line `reason`; for route
    families whose errors carry them (OpenAI's), the field at fault (`param`) and a
    machine-readable `code` (e.g. model_not_found)."""

    def __init__(self, status: int, reason: str, *, param: str | None = None, code: str | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.param = param
        self.code = code


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
    """What the served model can do: its task head (None without one; `head_type` its
    task type's name, `head_shape` what its logits are: `labels` or `score` for /predict;
    `pairs` when it was fine-tuned on text pairs, `labels` its classes), its mask token when
    it has a masked-LM head (None: no /fill-mask), the defaults of the options, what
    clients are told it is (`model_id`, and the other names `aliases` it answers to), and
    whether token ids are taken as input (`token_ids`: the server was told they come from
    this model's tokenizer)."""

    task: str | None
    head_type: str | None
    mask_token: str | None
    pooling: str
    top_k: int
    pairs: bool = False
    labels: tuple[str, ...] = ()
    model_id: str = "bertpipe"
    dimensions: int | None = None
    """The embeddings' size (the encoder's hidden size)."""
    vocab_size: int | None = None
    aliases: tuple[str, ...] = ()
    token_ids: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request's `model` may give: the served model's own, then its aliases."""
        return (self.model_id, *self.aliases)

    @property
    def head_shape(self) -> str | None:
        from bertcore.eval import kinds

        return kinds.get(self.head_type).head_shape if self.head_type else None

    @property
    def classifies(self) -> bool:
        return self.head_shape in ("labels", "score")


@dataclass(frozen=True)
class Job:
    """One request's work: its kind (KINDS), its inputs and its options.

    Inputs are `texts`; for a pair head also `second` (each pair's second text); or, for
    embeddings, `token_ids` (the served model's own vocabulary ids, with or without
    [CLS]/[SEP] around them)."""

    kind: str
    texts: tuple[str, ...] = ()
    second: tuple[str, ...] | None = None
    token_ids: tuple[tuple[int, ...], ...] | None = None
    pooling: str = "mean"
    normalize: bool = True
    truncate: bool | None = None
    """None: inputs are read as the run reads them (cut, or in windows); True: cut at the
    model's length; False: an input longer than that is refused (413)."""
    left: bool = False
    """Truncation keeps the end of an input instead of its start."""
    top_k: int = 5
    targets: tuple[str, ...] | None = None
    add_special_tokens: bool = True

    @property
    def size(self) -> int:
        """The number of inputs (texts, pairs or token-id lists)."""
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


def read_json(body: bytes, limits: Limits) -> Any:
    """The JSON value in `body`, or a RequestError (400 not UTF-8 or not JSON, 413 too large)."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(
            413, f"the request body is {len(body)} bytes, over the limit of {limits.max_body_bytes} {BODY_LIMIT}"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(
            400,
            f"the request body is not UTF-8: byte 0x{body[exc.start]:02x} at offset {exc.start}; "
            "send JSON encoded as UTF-8",
        ) from None
    if not text.strip():
        raise RequestError(400, 'the request body is empty; send a JSON object such as {"inputs": ["some text"]}')
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(
            400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def check_fields(data: Any, route: str, allowed: tuple[str, ...], example: str = '{"inputs": ["some text"]}') -> dict:
    """`data` when it is a JSON object holding only `allowed` fields; else 422 naming the field."""
    if not isinstance(data, dict):
        raise RequestError(422, f"the request body is a JSON {kind_of(data)}; send an object such as {example}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r}; {route} takes: {', '.join(allowed)}")
    return data


def texts(value: Any, field: str, limits: Limits) -> tuple[str, ...]:
    """One text or a list of texts, each checked (non-empty, UTF-8, within the limits)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise RequestError(422, f"{field} must be a string or a list of strings, got a {kind_of(value)}")
    if not items:
        raise RequestError(422, f"{field} is an empty list; send at least one text")
    count(len(items), field, limits)
    return tuple(
        text(item, field if isinstance(value, str) else f"{field}[{i}]", limits) for i, item in enumerate(items)
    )


def count(n: int, field: str, limits: Limits) -> None:
    if n > limits.max_texts:
        raise RequestError(
            413, f"{field} holds {n} inputs, over the limit of {limits.max_texts} (serve.max_texts); split the request"
        )


def text(value: Any, where: str, limits: Limits) -> str:
    """One text: a non-empty string of at most serve.max_text_bytes UTF-8 bytes."""
    if not isinstance(value, str):
        raise RequestError(422, f"{where} is a {kind_of(value)}, not a string")
    if not value.strip():
        raise RequestError(
            422, f"{where} is empty{' (only whitespace)' if value else ''}; every text needs some content"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise RequestError(
            422, f"{where} holds an unpaired surrogate (a lone \\ud800-\\udfff escape), which is not text"
        ) from None
    if size > limits.max_text_bytes:
        raise RequestError(
            413, f"{where} is {size} bytes of UTF-8, over the limit of {limits.max_text_bytes} (serve.max_text_bytes)"
        )
    return value


def flag(data: dict, field: str, default: bool | None) -> bool | None:
    """A true/false option (null: the default)."""
    value = data.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, f"{field} must be true or false, got {show(value)}")
    return value


def truncation(data: dict) -> tuple[bool | None, bool]:
    """(truncate, left) from TEI's `truncate` and `truncation_direction` ("right" or "left",
    either case)."""
    direction = data.get("truncation_direction")
    if direction is not None and (not isinstance(direction, str) or direction.lower() not in ("left", "right")):
        raise RequestError(422, f'truncation_direction must be "left" or "right", got {show(direction)}')
    return flag(data, "truncate", None), direction is not None and direction.lower() == "left"


def no_prompt(data: dict) -> None:
    """TEI's prompt_name: the served model has no prompts (no sentence-transformers config)."""
    if data.get("prompt_name") is not None:
        raise RequestError(
            422, f"prompt_name {show(data['prompt_name'])}: the served model has no prompts; put the prompt in the text"
        )


def top_k(value: Any, default: int) -> int:
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOP_K:
        raise RequestError(422, f"top_k must be a whole number from 1 to {MAX_TOP_K}, got {show(value)}")
    return value


def kind_of(value: object) -> str:
    """JSON's name for the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def show(value: object) -> str:
    """A value for a message: short, on one line."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."
