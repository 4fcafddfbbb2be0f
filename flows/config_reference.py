"""The configuration reference (docs/config.md), generated from the pydantic models so the
docs cannot drift from the code: `python -m flows.config_reference > docs/config.md`."""

from __future__ import annotations

import json
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel

from pipelines.registry import PipelineConfig


def _type_name(annotation: Any) -> str:
    """A readable type: `int or None`, `list[PhaseConfig]`, `Literal['a', 'b']`; Annotated
    metadata (validators) left out."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")


def _default(field) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    elif field.is_required():
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump(mode="json") for v in value]
    return json.dumps(value, default=str)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _item_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a `list[Model]` or an optional `Model | None` field, else None."""
    args = getattr(annotation, "__args__", ())
    if getattr(annotation, "__origin__", None) is list and args and _is_model(args[0]):
        return args[0]
    models = [a for a in args if _is_model(a)]
    if len(models) == 1 and type(None) in args:
        return models[0]
    return None


def _rows(model: type[BaseModel], prefix: str, out: list[str], nested: list[tuple[str, type[BaseModel]]]) -> None:
    for name, field in model.model_fields.items():
        text = " ".join((field.description or "").split()).replace("|", "/")
        annotation = field.annotation
        if _is_model(annotation):
            nested.append((f"{prefix}{name}", annotation))
            continue
        if (item := _item_model(annotation)) is not None:
            list_of = getattr(annotation, "__origin__", None) is list
            nested.append((f"{prefix}{name}[]" if list_of else f"{prefix}{name}", item))
        kind = _type_name(annotation)
        out.append(f"| `{prefix}{name}` | `{kind}` | `{_default(field)}` | {text} |")


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models by `python -m flows.config_reference`; a test checks",
        "that this file matches the code. Every key can be set in a recipe or with `--set key=value`.",
        "",
    ]
    for section, field in PipelineConfig.model_fields.items():
        model = field.annotation
        lines += [f"## `{section}`", "", " ".join((model.__doc__ or "").split()), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        nested: list[tuple[str, type[BaseModel]]] = []
        _rows(model, f"{section}.", lines, nested)
        while nested:
            prefix, sub = nested.pop(0)
            _rows(sub, f"{prefix}.", lines, nested)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
