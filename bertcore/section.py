"""Base class for configuration sections.

One pydantic model per section; each field's description is the CLI and Prefect UI help.
Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
