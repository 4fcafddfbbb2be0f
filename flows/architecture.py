"""The stage table of the docs (README.md and docs/architecture.md), generated from the
registry so the docs cannot drift from the code: `python -m flows.architecture` rewrites
the table between the markers in both files; a test checks that they match."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

from pipelines.registry import STAGES

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "architecture.md")
START, END = "<!-- stage-table:start -->", "<!-- stage-table:end -->"


def _source(obj) -> str:
    return os.path.relpath(inspect.getsourcefile(obj), ROOT)


def render_table() -> str:
    """One row per stage, in flow order: what it reads and writes, and where its code lives."""
    lines = [
        "| stage | directory | reads | writes | Ray wrapper | config section |",
        "|---|---|---|---|---|---|",
    ]
    for stage in STAGES:
        reads = ", ".join(stage.reads) or "raw inputs"
        if stage.identify is not None and stage.reads:
            reads += " + files outside run.root"
        section = f"`{stage.section.__name__}` ({_source(stage.section)})"
        lines.append(
            f"| {stage.name} | `{stage.directory}/` | {reads} | {stage.writes} | "
            f"{os.path.relpath(stage.work_file(), ROOT)} | {section} |"
        )
    return "\n".join(lines) + "\n"


def with_table(text: str, table: str) -> str:
    """`text` with the part between the markers replaced by `table`."""
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"the document has no {START} ... {END} markers")
    return f"{head}{START}\n{table}{END}{tail}"


def main() -> None:
    table = render_table()
    for path in DOCS:
        path.write_text(with_table(path.read_text(encoding="utf-8"), table), encoding="utf-8")
        print(f"wrote the stage table into {os.path.relpath(path, ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
