"""Seeds: how far the task's score moves with nothing but the fine-tuning seed (init of the
head, dropout, batch order), against the gain over random weights being claimed. A gain
inside the spread cannot be told from a lucky seed."""

from __future__ import annotations

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding


def seeds_finding(entry: dict, metric: str) -> Finding:
    """From a task entry as bertcore/eval/summary.task_entry makes it (pretrained and random init over seeds)."""
    runs = entry["pretrained"]["validation"][metric]
    per_seed = [r["validation"][metric] for r in entry["pretrained"]["runs"]]
    spread = runs["max"] - runs["min"]
    gain = (entry.get("gain") or {}).get(metric)
    shown = ", ".join(figures.metric(metric, v) for v in per_seed)
    figures_ = {"seeds": [r["seed"] for r in entry["pretrained"]["runs"]], "scores": per_seed, "spread": spread}
    figures_["gain"] = gain
    if len(per_seed) < 2:
        return Finding(
            "seeds",
            "note",
            f"one seed ({shown}): no spread to judge a gain by",
            "give the task 3 or more seeds",
            figures_,
        )
    text = (
        f"{len(per_seed)} seeds score {shown} {figures.name(metric)}: a spread of {figures.points(spread)} points"
        + ("" if gain is None else f" against a gain over random init of {figures.points(gain)} points")
    )
    if gain is not None and abs(gain) <= spread:
        return Finding(
            "seeds",
            "warning",
            text + ": the gain cannot be told from a lucky seed",
            "add seeds (5 or more) or evaluation rows before claiming the gain",
            figures_,
        )
    return Finding("seeds", "ok", text, figures=figures_)
