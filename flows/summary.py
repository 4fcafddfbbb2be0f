"""What `bertpipe run` prints at the end: one row per stage (computed or cached, the time
it took in this run, its key figures from the manifest's headline, wrapped within 100
columns) and the commands a user types next."""

from __future__ import annotations

import os
import shlex
from typing import Any

from pipelines.progress import duration
from pipelines.stage_log import headline_text

WIDTH = 100
"""Columns the summary keeps within: key figures that do not fit go on to the next line,
under the key figures column, at a figure's boundary."""
_INDENT = 30  # len(f"{'stage':<10} {'state':<9} {'time':>7}  ")


def wrap_figures(text: str, width: int = WIDTH - _INDENT) -> list[str]:
    """'a 1 · b 2 · c 3' as lines of at most `width` columns, broken between figures (a
    figure longer than the width gets lines of its own, broken at spaces)."""
    import textwrap

    lines: list[str] = []
    joinable = False  # the last line ends a whole figure that another may follow
    for figure in text.split(" · "):
        if joinable and len(lines[-1]) + 3 + len(figure) <= width:
            lines[-1] += " · " + figure
            continue
        parts = textwrap.wrap(figure, width, break_long_words=False, break_on_hyphens=False) or [figure]
        lines += parts
        joinable = len(parts) == 1
    return lines or [""]


def wrap(text: str, width: int = WIDTH, indent: str = "    ") -> list[str]:
    """A long line (a verdict) broken at spaces into lines of at most `width` columns, the
    later ones indented."""
    import textwrap

    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or [""]


def table(summaries: list[dict[str, Any]]) -> list[str]:
    """stage, computed/cached, time, key figures (all of them, wrapped). The time of a
    computed stage is the one its end line and `bertpipe status` show (the manifest's);
    of a cached one, what looking it up took in this run."""
    lines = [f"{'stage':<10} {'state':<9} {'time':>7}  key figures"]
    for s in summaries:
        figures = headline_text(s.get("headline") or {}) or f"rows {s.get('rows')}"
        first, *rest = wrap_figures(figures)
        seconds = s.get("seconds") if s["state"] == "computed" and s.get("seconds") is not None else s.get("elapsed_s")
        lines.append(f"{s['stage']:<10} {s['state']:<9} {duration(seconds):>7}  {first}")
        lines += [" " * _INDENT + line for line in rest]
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
    split = by_stage.get("vocab", {}).get("morphemes")
    for stage, what in (("pretrain", "the model"), ("distill", "the student")):
        if "model" in by_stage.get(stage, {}):
            folder = _shown(by_stage[stage]["model"])
            if (
                by_stage[stage].get("model_kind") == "sentence-transformers"
            ):  # an embedding model, as its teacher is published
                lines.append(
                    f'{f"load {what}:":<16} SentenceTransformer("{folder}")  (sentence-transformers; its '
                    "encoder alone: AutoModel)"
                )
            else:
                lines.append(f'{f"load {what}:":<16} AutoModelForMaskedLM.from_pretrained("{folder}")  (transformers)')
            if split:
                from bertcore.vocab.morphemes import run_note

                lines.append(f"{'':<16} {run_note(split, folder)}")
    if "report" in by_stage.get("evaluate", {}):
        lines.append(f"read the report: {_shown(by_stage['evaluate']['report'])}")
    if summaries:
        look = "examples" if "examples" in by_stage else summaries[-1]["stage"]
        where = recipe if (config and not overrides) else f" --root {shlex.quote(_shown(root))}"
        lines.append(f"look inside:     bertpipe inspect {look}{where} --n 2")
    lines.append(
        f"status:          bertpipe status{recipe}" + ("  (with this run's --set options)" if overrides else "")
    )
    return lines
