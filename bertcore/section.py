"""Base class for configuration sections, and the field types they share.

One pydantic model per section; each field's description is the CLI and Prefect UI help.
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import codecs
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from bertcore.sample_data import expand_placeholders


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


def _expand(uri: Any) -> Any:
    return expand_placeholders(uri) if isinstance(uri, str) else uri


def _known_encoding(value: str) -> str:
    try:
        codecs.lookup(value)
    except LookupError:
        raise ValueError(f"unknown text encoding {value!r}") from None
    return value


DataFile = Annotated[str, BeforeValidator(_expand)]
"""A local path, glob or fsspec URI; `{demo_data}`, `{korean_data}` and `{task_data}` expand to the
folders of the bundled sample data, so a recipe, a `--set` override and a Prefect form all
get the same paths."""
Encoding = Annotated[str, AfterValidator(_known_encoding)]
"""A text encoding name Python knows (utf-8, cp1252, latin-1, ...)."""
