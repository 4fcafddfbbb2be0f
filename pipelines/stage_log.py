"""The two lines every stage run logs, the same way for every stage (pipelines/runner.py
calls them): the start with its plan (what it reads, how many workers) and the end with
the manifest's headline figures. Between them the stage logs its own plan details and
its progress (pipelines/progress.py)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from pipelines.progress import count, duration, size
from pipelines.stage import External, Upstream
from pipelines.stage_dir import Manifest

log = logging.getLogger(__name__)


def value_text(value: Any) -> str:
    """A headline value as it reads in a log line: 8,000 / 12.3k / 0.623 / as given."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return count(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else count(value)
    return str(value)


LINE_WIDTH = 110
"""Columns a stage's end line keeps within, before the time the console puts in front (the
run summary has every figure)."""


def headline_text(headline: dict[str, Any], width: int | None = None) -> str:
    """'documents 391 · sentences 9.7k': the figures in the order the stage gave them; with
    `width`, only the first figures that fit, then '…' (never a figure cut in the middle)."""
    figures = [f"{label} {value_text(value)}" for label, value in headline.items()]
    if width is None:
        return " · ".join(figures)
    kept: list[str] = []
    for i, figure in enumerate(figures):
        more = ["…"] if i < len(figures) - 1 else []  # room for the mark of what is left out
        if len(" · ".join([*kept, figure, *more])) > width:
            return " · ".join([*kept, "…"])
        kept.append(figure)
    return " · ".join(kept)


def _workers(parallelism: int | None) -> str:
    ray = sys.modules.get("ray")  # never imported here: a stage that runs on Ray has started it
    cpus = ray.cluster_resources().get("CPU") if ray is not None and ray.is_initialized() else None
    if parallelism and cpus:
        return f"{min(parallelism, int(cpus))} of {int(cpus)} CPUs"
    if cpus:
        return f"{int(cpus)} CPUs"
    return f"{parallelism} tasks at a time" if parallelism else "local"


def plan_text(inputs: dict[str, Upstream], external: External | None, parallelism: int | None) -> str:
    reads = [f"{name} ({count(up.manifest.rows)} rows, {size(up.manifest.bytes)})" for name, up in inputs.items()]
    if external is not None and external.summary:
        reads.append(external.summary)
    return f"reads {', '.join(reads) or 'nothing'} · workers {_workers(parallelism)}"


def started(
    name: str, fingerprint: str, inputs: dict[str, Upstream], external: External | None, parallelism: int | None
) -> None:
    log.info(
        "%s: start · %s · fingerprint %s",
        name,
        plan_text(inputs, external, parallelism),
        fingerprint,
        extra={"event": "stage_start", "stage": name, "fingerprint": fingerprint},
    )


def finished(name: str, manifest: Manifest, computed: bool, seconds: float) -> None:
    what = f"done in {duration(seconds)}" if computed else "cached (its complete output has this fingerprint)"
    figures = headline_text(manifest.headline, LINE_WIDTH - len(f"{name}: {what} · "))
    log.info(
        "%s: %s%s",
        name,
        what,
        f" · {figures}" if figures else "",
        extra={
            "event": "stage_end",
            "stage": name,
            "computed": computed,
            "seconds": round(seconds, 3),
            "headline": manifest.headline,
            "fingerprint": manifest.fingerprint,
        },
    )
