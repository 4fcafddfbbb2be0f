"""The options many commands share (--config, --set, comma-separated names) and how a
command turns them into its recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", metavar="FILE", help="Run recipe (YAML).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE", help="Override one key, e.g. --set examples.max_seq_length=512 (repeatable)."
    ),
]


def load_recipe(config: Path | None, overrides: list[str] | None):
    from pipelines.registry import load_config

    return load_config(config, overrides or [])


def split_names(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]
