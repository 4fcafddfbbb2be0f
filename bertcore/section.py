"""Base class for configuration sections, and the field types they share.

One pydantic model per section; each field's description is the CLI and Prefect UI help.
Unknown keys are errors, so a typo never silently falls back to a default. Types are
strict: `true` is not an integer and `2.0` is not a count, wherever the recipe comes from
(YAML, `--set`, a Prefect form). Names that become file or folder names (phases, tasks,
input labels) are checked against one pattern, `NAME_PATTERN`. The JSON form of a section
masks passwords inside URIs (bertcore/redact.py): what is written out never holds them.
"""

from __future__ import annotations

import codecs
import re
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SerializationInfo, model_serializer

from bertcore.redact import masked
from bertcore.sample_data import expand_placeholders


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True, strict=True)

    ADDED_LATER: ClassVar[tuple[str, ...]] = ()
    """Fields added after runs were made with this section, whose default keeps the old
    behaviour: while at their default they stay out of the stage's fingerprint, so an
    upgrade that adds a setting leaves existing runs complete instead of recomputing them
    (a changed default bumps the stage's code version instead)."""

    @classmethod
    def fingerprint_json(cls, config: dict) -> dict:
        """A section's JSON (as dumped now, or as an older manifest recorded it) without the
        ADDED_LATER fields that sit at their default."""
        return {
            k: v
            for k, v in config.items()
            if not (k in cls.ADDED_LATER and v == cls.model_fields[k].get_default(call_default_factory=True))
        }

    @model_serializer(mode="wrap")
    def _without_credentials(self, handler: Any, info: SerializationInfo) -> Any:
        # The JSON form is what reaches disk (_config.yaml, manifests, fingerprints, Prefect
        # parameters): passwords inside URIs are masked there; the object keeps them.
        data = handler(self)
        return masked(data) if info.mode_is_json() else data


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""What a name that becomes part of a path may look like: a letter or digit, then up to 99
letters, digits, '_', '.' or '-'. No '/', no '..' at the start, nothing hidden."""


def safe_name(value: str) -> str:
    """`value` if it may name a file or folder, else ValueError saying what a name may hold."""
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{value!r} cannot name a file or folder: use 1-100 letters, digits, '_', '.' or '-', starting "
            "with a letter or digit"
        )
    return value


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
folders of the bundled sample data, and `{minilm}` to the optional all-MiniLM-L6-v2 model
folder (its sha256 checked), so a recipe, a `--set` override and a Prefect form all
get the same paths."""
Encoding = Annotated[str, AfterValidator(_known_encoding)]
"""A text encoding name Python knows (utf-8, cp1252, latin-1, ...)."""
Name = Annotated[str, AfterValidator(safe_name)]
"""A name that becomes part of a path (see `NAME_PATTERN`)."""
