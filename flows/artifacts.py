"""Prefect artifacts of a stage run: its statistics as a table, its markdown report, its
small tables (evaluate: the scores against random init) and, for a stage that logs
training steps (pretrain: metrics.jsonl, validation.jsonl), its training curves. Outside a
Prefect run there is nowhere to attach them, and nothing is published."""

from __future__ import annotations

import json
from typing import Any

from prefect import artifacts
from prefect.context import get_run_context
from prefect.exceptions import MissingContextError

from bertcore import figures
from bertcore.figures import count
from bertcore.redact import mask_text, masked
from bertcore.train.metrics_log import METRICS, VALIDATION, intervals
from pipelines.stage_dir import Manifest, StageDir

MAX_STATISTICS = 200
"""Rows of the statistics table at most (nested statistics are flattened to dotted keys)."""
CURVE_ROWS = 20
"""Rows of each table of the training-curves artifact at most (evenly spaced steps)."""
SPARKS = "▁▂▃▄▅▆▇█"


def in_a_run() -> bool:
    try:
        get_run_context()
    except MissingContextError:
        return False
    return True


def create_table_artifact(table: list[dict], key: str, description: str) -> None:
    """Prefect's table artifact, with passwords inside URIs masked (it is stored in Prefect's database)."""
    artifacts.create_table_artifact(table=masked(table), key=key, description=mask_text(description))


def create_markdown_artifact(markdown: str, key: str, description: str) -> None:
    """Prefect's markdown artifact, with passwords inside URIs masked."""
    artifacts.create_markdown_artifact(markdown=mask_text(markdown), key=key, description=mask_text(description))


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
        create_markdown_artifact(
            markdown=report, key=f"{name}-report", description=f"{name} report ({directory.path(manifest.report)})"
        )
    for key, rows in manifest.tables.items():
        if rows:
            create_table_artifact(table=rows, key=key, description=f"{name}: {key}")
    logs = {s.path for s in manifest.shards}
    if METRICS in logs:
        steps = _records(directory, METRICS)
        validations = _records(directory, VALIDATION) if VALIDATION in logs else []
        every = int((manifest.config or {}).get("log_every") or 1)
        create_markdown_artifact(
            markdown=training_curves(steps, validations, every),
            key=f"{name}-curves",
            description=f"{name} training curves ({directory.path(METRICS)})",
        )
    return True


def _records(directory: StageDir, name: str) -> list[dict]:
    text = directory.storage.read_text(directory.path(name))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def training_curves(steps: list[dict], validations: list[dict], every: int = 1) -> str:
    """Markdown with the training loss as a sparkline and two tables at evenly spaced
    points: the training figures as the console and TensorBoard show them (the means over
    each logging interval of `every` steps, bertcore.train.metrics_log) and the validations."""
    lines = ["# Training curves", ""]
    means = intervals(steps, max(1, every))
    if means:
        lines += [
            (
                f"Training loss (means of {every} steps), steps {steps[0]['step']}-{steps[-1]['step']}: "
                f"`{sparkline([m['loss'] for m in means])}`"
            ),
            "",
        ]
    if validations:
        lines += [f"Validation MLM loss: `{sparkline([r['mlm_loss'] for r in validations])}`", ""]
    for m in means:
        m["steps_covered"] = f"{m['first_step']}-{m['step']}"
    lines += _table(
        f"Training (metrics.jsonl, means over intervals of {every} steps)",
        means,
        [
            ("steps", "steps_covered"),
            ("phase", "phase"),
            ("loss", "loss"),
            ("MLM loss", "mlm_loss"),
            ("MLM acc.", "mlm_accuracy"),
            ("NSP acc.", "nsp_accuracy"),
            ("learning rate", "lr"),
            ("tokens/s", "tokens_per_s"),
        ],
    )
    lines += _table(
        "Validation (validation.jsonl: a fixed held-out sample)",
        validations,
        [
            ("step", "step"),
            ("phase", "phase"),
            ("sequences", "sequences"),
            ("loss", "loss"),
            ("MLM loss", "mlm_loss"),
            ("MLM acc.", "mlm_accuracy"),
            ("NSP loss", "nsp_loss"),
            ("NSP acc.", "nsp_accuracy"),
        ],
    )
    return "\n".join(lines) + "\n"


def sparkline(values: list[float | None], width: int = 60) -> str:
    """One block character per point (at most `width` points, means of equal runs)."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    chunk = -(-len(values) // width)
    means = [sum(values[i : i + chunk]) / len(values[i : i + chunk]) for i in range(0, len(values), chunk)]
    low, high = min(means), max(means)
    scale = (len(SPARKS) - 1) / (high - low) if high > low else 0.0
    return "".join(SPARKS[round((v - low) * scale)] for v in means)


def _table(title: str, records: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    if not records:
        return []
    rows = min(CURVE_ROWS, len(records))
    picks = sorted({round(i * (len(records) - 1) / max(1, rows - 1)) for i in range(rows)})
    lines = [f"## {title}", "", "| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for i in picks:
        lines.append("| " + " | ".join(_cell(key, records[i].get(key)) for _, key in columns) + " |")
    return [*lines, ""]


def _cell(key: str, value: Any) -> str:
    """As everywhere else (bertcore.figures): accuracies in percent, losses with three decimals."""
    if value is None:
        return "-"
    if key in ("step", "phase", "steps_covered"):
        return str(value)
    if key == "tokens_per_s":
        return count(value)
    return figures.metric(key, value)


def flatten(stats: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and len(out) < MAX_STATISTICS:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
