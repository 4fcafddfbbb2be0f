"""diagnosis.md: the findings worst first, then each area's evidence (the tables behind the
findings, the plots), then the files beside it. Markdown only; no numpy, no matplotlib."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from bertcore import figures

if TYPE_CHECKING:
    from bertcore.eval.diagnosis.run import Diagnosis

ROWS = 15
"""Rows of a long table shown in the report (the .tsv files hold them all)."""
AREAS = (
    ("Data", ("leakage", "rows", "balance", "length")),
    ("Suspect labels", ("suspect_labels",)),
    ("Optimisation", ("learning_rate", "loss_curve", "early_stopping")),
    ("Forgetting and starting point", ("pipeline", "forgetting", "starting_point")),
    ("Errors", ("errors",)),
    ("Seeds", ("seeds",)),
)


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    def cell(value) -> str:
        text = " ".join(str("" if value is None else value).split())
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows] + [""]


def render_markdown(d: Diagnosis, plots: Mapping[str, str], files: Sequence[str]) -> str:
    by_name = {f.name: f for f in d.findings}
    total = figures.duration(d.timings.get("total_s"))
    out = [
        f"# Diagnosis of task `{d.task}` ({d.kind})",
        "",
        (
            f"Model `{d.model}`; evaluated on {d.evaluated_on}; {d.fits} fine-tunes in {total}. Made by `bertpipe "
            "diagnose`; every figure is measured on the task's own files (bertpipe's docs/diagnose.md says how)."
        ),
        "",
        "## Findings, worst first",
        "",
    ]
    out += [f"- **{f.severity}** {f.name}: {f.text}" + (f" *Try:* {f.advice}." if f.advice else "") for f in d.findings]
    out.append("")
    for title, names in AREAS:
        out += [f"## {title}", ""]
        listed = ", ".join(f"{name} ({by_name[name].severity})" for name in names if name in by_name)
        out += [f"Findings: {listed}.", ""]
        out += _evidence(d, title, plots)
    out += ["## Files", "", *[f"- `{name}`" for name in files], ""]
    return "\n".join(out)


def _evidence(d: Diagnosis, title: str, plots: Mapping[str, str]) -> list[str]:
    metric = d.metric
    if title == "Data" and d.leaks:
        rows = [(x.split, x.row, x.train_row, f"{x.similarity:.2f}", x.text[:80]) for x in d.leaks[:ROWS]]
        return [f"Leaked rows ({len(d.leaks)}; `leaked_rows.tsv` lists them all):", ""] + _table(
            ("split", "row", "train row", "similarity", "text"), rows
        )
    if title == "Suspect labels" and d.suspects:
        rows = [
            (
                s.row,
                s.given[:40],
                s.predicted[:40],
                f"{s.score:.3g}",
                "" if s.flagged is None else s.flagged,
                s.text[:80],
            )
            for s in d.suspects[:ROWS]
        ]
        return [f"Most suspect training rows, by {d.suspect_score} (`suspect_labels.tsv` has every row):", ""] + _table(
            ("row", "given", "predicted", "score", "flagged", "text"), rows
        )
    if title == "Optimisation" and d.sweep:
        out = []
        if "lr_sweep" in plots:
            out += [f"![learning-rate sweep]({plots['lr_sweep']})", ""]
        out += _table(
            ("learning rate", figures.name(metric), "training loss, first -> last epoch"),
            [(f"{p.learning_rate:g}", figures.metric(metric, p.score), p.moved) for p in d.sweep],
        )
        if d.curve is not None and d.curve.train:
            if "loss_curve" in plots:
                out += [f"![loss per epoch]({plots['loss_curve']})", ""]
            out += _table(
                ("epoch", "training loss", "evaluation loss", figures.name(metric)),
                [
                    (
                        e + 1,
                        figures.loss(d.curve.train[e]),
                        figures.loss(d.curve.evaluate[e]),
                        figures.metric(metric, s),
                    )
                    for e, s in enumerate(d.curve.scores)
                ],
            )
        return out
    if title == "Errors":
        out = []
        if d.confusion is not None and d.classes and len(d.classes) <= 12:
            if "confusion" in plots:
                out += [f"![confusion matrix]({plots['confusion']})", ""]
            out += ["Confusion (rows: given, columns: predicted):", ""]
            out += _table(("given \\ predicted", *d.classes), [(n, *row) for n, row in zip(d.classes, d.confusion)])
        if d.per_class:
            out += _table(
                ("class", "support", "precision", "recall", "F1"),
                [
                    (
                        r["class"],
                        r["support"],
                        figures.percent(r["precision"]),
                        figures.percent(r["recall"]),
                        figures.percent(r["f1"]),
                    )
                    for r in d.per_class[:30]
                ],
            )
        if d.worst:
            out += ["Worst-scored examples of the evaluation split (`worst_examples.tsv`):", ""]
            out += _table(
                ("row", "given", "predicted", "loss", "example"),
                [
                    (w.row, w.given[:40], w.predicted[:40], f"{w.loss:.3g}", (w.view or w.text)[:120])
                    for w in d.worst[:ROWS]
                ],
            )
        return out
    return []
