"""Prefect artifacts of a stage run: its statistics as a table, its markdown report and
its small tables (evaluate: the scores against random init). Outside a Prefect run there
is nowhere to attach them, and nothing is published."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import get_run_context
from prefect.exceptions import MissingContextError

from pipelines.stage import Manifest, StageDir

MAX_STATISTICS = 200
"""Rows of the statistics table at most (nested statistics are flattened to dotted keys)."""


def in_a_run() -> bool:
    try:
        get_run_context()
    except MissingContextError:
        return False
    return True


def publish_stage(name: str, manifest: Manifest, directory: StageDir, computed: bool) -> bool:
    """Publish the stage's artifacts to the current flow or task run; False outside one."""
    if not in_a_run():
        return False
    create_table_artifact(
        key=f"{name}-stats",
        table=[{"statistic": k, "value": str(v)} for k, v in flatten(manifest.stats).items()],
        description=f"{name} stage statistics ({'computed' if computed else 'cached'})",
    )
    if manifest.report:
        report = directory.storage.read_text(directory.path(manifest.report))
        create_markdown_artifact(markdown=report, key=f"{name}-report", description=f"{name} report ({directory.path(manifest.report)})")
    for key, rows in manifest.tables.items():
        if rows:
            create_table_artifact(table=rows, key=key, description=f"{name}: {key}")
    return True


def flatten(stats: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and len(out) < MAX_STATISTICS:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
