"""A finding: one measured reason (or the absence of one) why a fine-tune scores what it
scores, with its evidence in one line, what to try, and its figures for the machine-readable
files. Findings print worst first: problems, warnings, notes, what is fine, then what does
not apply to the task's kind (said, never skipped silently)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["problem", "warning", "note", "ok", "n/a"]
SEVERITIES: tuple[Severity, ...] = ("problem", "warning", "note", "ok", "n/a")
"""Worst first: a problem can explain a weak score on its own, a warning may, a note is a
figure worth knowing, ok is a check that passed, n/a one that does not apply to the kind."""


@dataclass
class Finding:
    name: str
    """What was checked: leakage, balance, length, rows, suspect_labels, learning_rate, loss_curve, ..."""
    severity: Severity
    text: str
    """The evidence, in one line."""
    advice: str = ""
    """What to try, when there is something to try."""
    figures: dict[str, Any] = field(default_factory=dict)
    """The measured figures behind the text (diagnosis.json)."""

    def line(self) -> str:
        """`severity name: evidence; try: advice`, as the command prints it."""
        advice = f"; try: {self.advice}" if self.advice else ""
        return f"{self.severity:<7} {self.name}: {self.text}{advice}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def not_applicable(name: str, why: str) -> Finding:
    return Finding(name, "n/a", why)


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first; findings of one severity keep the order they were made in."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def percent(part: float, whole: float) -> str:
    """`12.5%` of a share (bertcore.figures), `-` of nothing."""
    from bertcore import figures

    return figures.percent(part / whole if whole else None)


def quoted(text: str, limit: int = 60) -> str:
    """A text for a finding's line: in quotes, one line, cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")
