"""What `bertpipe run` prints at the end: one row per stage (computed or cached, the time
it took in this run, its key figures from the manifest's headline) and the commands a
user types next."""

from __future__ import annotations

import os
import shlex
from typing import Any

from pipelines.progress import duration
from pipelines.stage_log import headline_text

KEY_FIGURES_WIDTH = 110
"""Key figures longer than this are cut (the table stays one line per stage)."""


def _figures(summary: dict[str, Any]) -> str:
    text = headline_text(summary.get("headline") or {}) or f"rows {summary.get('rows')}"
    return text if len(text) <= KEY_FIGURES_WIDTH else text[: KEY_FIGURES_WIDTH - 1] + "…"


def table(summaries: list[dict[str, Any]]) -> list[str]:
    """stage, computed/cached, time in this run, key figures; one line each."""
    lines = [f"{'stage':<10} {'state':<9} {'time':>7}  key figures"]
    for s in summaries:
        lines.append(f"{s['stage']:<10} {s['state']:<9} {duration(s.get('elapsed_s')):>7}  {_figures(s)}")
    return lines


def _shown(path: str) -> str:
    """A path relative to the working directory when it lies below it (shorter to read)."""
    if "://" in path:
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def next_commands(summaries: list[dict[str, Any]], root: str, config: str | None, overrides: list[str]) -> list[str]:
    """The commands to type next: load the model, open the report, look inside a stage,
    see the status. `inspect` needs only the run root; `status` the whole recipe, so a run
    with --set overrides is told to repeat them rather than shown a line of them."""
    recipe = f" -c {shlex.quote(str(config))}" if config else ""
    by_stage = {s["stage"]: s for s in summaries}
    lines = []
    for stage, what in (("pretrain", "the model"), ("distill", "the student")):
        if stage in by_stage:
            model = _shown(f"{by_stage[stage]['uri'].rstrip('/')}/model")
            lines.append(f'{f"load {what}:":<16} AutoModelForMaskedLM.from_pretrained("{model}")  (transformers)')
    if "report" in by_stage.get("evaluate", {}):
        lines.append(f"read the report: {_shown(by_stage['evaluate']['report'])}")
    if summaries:
        look = "examples" if "examples" in by_stage else summaries[-1]["stage"]
        where = recipe if (config and not overrides) else f" --root {shlex.quote(_shown(root))}"
        lines.append(f"look inside:     bertpipe inspect {look}{where} --n 2")
    lines.append(f"status:          bertpipe status{recipe}" + ("  (with this run's --set options)" if overrides else ""))
    return lines
