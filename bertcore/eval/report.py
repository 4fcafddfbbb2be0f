"""The evaluation report: markdown tables, PNG plots, and flat score rows, all made from
the evaluate stage's metrics dictionary (what it writes as eval/metrics.json).

Plots are drawn on matplotlib `Figure` objects with the Agg canvas, never through
pyplot, so nothing here touches a display or global plotting state.

The metrics dictionary, as far as the report reads it:
    model:           {"uri", "parameters", "config": {num_hidden_layers, hidden_size, ...}}
    pretraining_log: {"uri", "records", "unreadable_lines", "last": {...}} or None
    intrinsic:       {phase: {"pretrained": scores, "random_init": scores}}
    tasks:           {name: {"type", "primary_metric", "seeds", "folds", "pretrained":
                      {"validation": {metric: summary}, "test": ...}, "random_init": ...,
                      "gain": {metric: float}, "skipped": {split: rows}, "skipped_problems"}}
    embeddings:      {"sentences", "sts_pairs", "pretrained": {pooling: {...}}, "random_init": ...} or None
    skipped_rows:    {"total", "files": {uri: rows}}
    notes:           [str]
where a summary is {median, min, max, std, n, n_nan} over seeds (metrics.summarize).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PRIMARY_METRIC = {"classification": "accuracy", "regression": "spearman", "token_classification": "f1", "qa": "f1"}
"""The score a task is ranked by in the summary table and plot (GLUE/CoNLL/SQuAD conventions)."""

_RAW_SCALE = ("loss", "perplexity", "mse", "count", "sequences", "batches", "tokens", "threshold", "anisotropy")
"""Metric names containing these are shown as they are; every other score is shown x 100, as papers do."""

MAX_PLOTTED_STEPS = 2000
"""Longer training logs are averaged over equal bins of steps before plotting."""


# --- inputs ---------------------------------------------------------------------------------


def read_training_log(lines: Iterable[str]) -> tuple[list[dict], int]:
    """(records with a numeric `step`, in step order; number of unreadable lines) from the
    lines of pretrain/metrics.jsonl. A line cut short by a crash, or one without a step,
    is counted and left out rather than failing the report."""
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), (int, float)):
            bad += 1
            continue
        records.append(record)
    records.sort(key=lambda r: r["step"])
    return records, bad


def json_safe(value: Any) -> Any:
    """`value` with nan/inf floats replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def json_dumps(metrics: Any) -> str:
    """Strict JSON text of `metrics` (nan and inf as null), indented for reading."""
    return json.dumps(json_safe(metrics), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


# --- plots ----------------------------------------------------------------------------------


def _save(fig: Figure, path: str) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png", dpi=110, metadata={"Software": None})


def _binned(steps: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean step and mean value of `bins` consecutive, equally long runs of points."""
    if len(steps) <= bins:
        return steps, values
    groups = np.array_split(np.arange(len(steps)), bins)
    return np.array([steps[g].mean() for g in groups]), np.array([values[g].mean() for g in groups])


def plot_pretraining(records: list[dict], path: str) -> bool:
    """Loss and MLM accuracy against the optimizer step, with phase changes marked.
    Returns False (and writes nothing) when no record has a loss."""
    series = {}
    for name in ("loss", "mlm_accuracy"):
        points = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float)) and math.isfinite(r[name])]
        if points:
            steps, values = (np.asarray(x, dtype=float) for x in zip(*points))
            series[name] = _binned(steps, values, MAX_PLOTTED_STEPS)
    if "loss" not in series:
        return False
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    axes = fig.subplots(1, 2)
    titles = {"loss": "training loss (MLM + NSP)", "mlm_accuracy": "training MLM accuracy"}
    for ax, name in zip(axes, ("loss", "mlm_accuracy")):
        ax.set_title(titles[name])
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if name in series:
            ax.plot(*series[name], linewidth=1.2)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        previous = records[0].get("phase")
        for record in records[1:]:  # a dashed line where the sequence-length phase changes
            if record.get("phase") != previous:
                ax.axvline(record["step"], color="grey", linestyle="--", linewidth=0.8)
                ax.text(record["step"], 0.98, f" {record.get('phase')}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
                previous = record.get("phase")
    _save(fig, path)
    return True


def plot_tasks(tasks: Mapping[str, dict], path: str) -> bool:
    """Per task, the median of its primary validation metric over seeds for the pretrained
    and the randomly initialised model, with min-max bars. False when there is no task."""
    names = [name for name, t in tasks.items() if t.get("pretrained", {}).get("validation")]
    if not names:
        return False
    fig = Figure(figsize=(max(4.5, 1.6 * len(names) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(names))
    width = 0.38
    for offset, model, label in ((-width / 2, "pretrained", "pretrained"), (width / 2, "random_init", "random init")):
        medians, low, high = [], [], []
        for name in names:
            summary = tasks[name].get(model, {}).get("validation", {}).get(tasks[name]["primary_metric"])
            scale = _scale(tasks[name]["primary_metric"])
            if summary is None or summary.get("median") is None or not math.isfinite(summary["median"]):
                medians.append(np.nan), low.append(0.0), high.append(0.0)
                continue
            medians.append(summary["median"] * scale)
            low.append((summary["median"] - summary["min"]) * scale)
            high.append((summary["max"] - summary["median"]) * scale)
        if all(np.isnan(medians)):
            continue
        ax.bar(x + offset, medians, width, yerr=[low, high], capsize=3, label=label)
    ax.set_xticks(x, [f"{n}\n({tasks[n]['primary_metric']})" for n in names])
    ax.set_ylabel("validation score (x100), median over seeds")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    _save(fig, path)
    return True


# --- tables ---------------------------------------------------------------------------------


def _scale(metric: str) -> float:
    return 1.0 if any(word in metric for word in _RAW_SCALE) else 100.0


def _fmt(metric: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if _scale(metric) == 100.0:
        return f"{100.0 * value:.1f}"
    if abs(value) < 1.0:
        return f"{value:.4f}"  # cosines, small losses: 0.9999 must not round to 1
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"


def _summary_cell(metric: str, summary: Mapping | None, spread: bool = True) -> str:
    if not summary or summary.get("median") is None:
        return "–"
    text = _fmt(metric, summary["median"])
    if spread and summary.get("n", 0) > 1:
        text += f" [{_fmt(metric, summary['min'])}, {_fmt(metric, summary['max'])}]"
    return text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return lines


_INTRINSIC_COLUMNS = ("sequences", "masked_tokens", "mlm_loss", "mlm_perplexity", "mlm_accuracy", "nsp_loss", "nsp_accuracy")


def score_rows(metrics: Mapping[str, Any]) -> list[dict]:
    """One flat row per (section, name, metric), with the same keys in every row, for a
    table artifact: section, name, metric, pretrained, pretrained_min, pretrained_max,
    random_init, gain, seeds. Scores are fractions as in metrics.json (not x 100)."""

    def row(section, name, metric, pretrained, random_init, low=None, high=None, seeds=None):
        gain = None
        if isinstance(pretrained, (int, float)) and isinstance(random_init, (int, float)):
            gain = pretrained - random_init
        return json_safe(
            {
                "section": section,
                "name": name,
                "metric": metric,
                "pretrained": pretrained,
                "pretrained_min": low,
                "pretrained_max": high,
                "random_init": random_init,
                "gain": gain,
                "seeds": seeds,
            }
        )

    rows = []
    for phase, by_model in (metrics.get("intrinsic") or {}).items():
        for metric in ("mlm_loss", "mlm_perplexity", "mlm_accuracy", "nsp_accuracy"):
            mine = by_model.get("pretrained", {}).get(metric)
            if mine is not None:
                rows.append(row("pretraining", phase, metric, mine, by_model.get("random_init", {}).get(metric)))
    for name, task in (metrics.get("tasks") or {}).items():
        for split in ("validation", "test"):
            mine = task.get("pretrained", {}).get(split) or {}
            theirs = task.get("random_init", {}).get(split) or {}
            label = name if split == "validation" else f"{name} (test)"
            for metric, summary in mine.items():
                other = theirs.get(metric, {}).get("median")
                rows.append(
                    row("fine-tuning", label, metric, summary["median"], other, summary["min"], summary["max"], summary["n"])
                )
    embeddings = metrics.get("embeddings") or {}
    for pooling, scores in (embeddings.get("pretrained") or {}).items():
        for metric, value in scores.items():
            rows.append(row("embeddings", pooling, metric, value, (embeddings.get("random_init") or {}).get(pooling, {}).get(metric)))
    return rows


def _against_random(mine: Any, random_init: Any, percent: bool = False) -> str:
    def shown(value: Any) -> str:
        return f"{value:.1%}" if percent else f"{value:.3f}"

    text = shown(mine) if isinstance(mine, (int, float)) else str(mine)
    return f"{text} (random init {shown(random_init)})" if isinstance(random_init, (int, float)) else text


def headline(stats: Mapping[str, Any]) -> dict[str, str]:
    """The run summary's key figures from the evaluate stage's manifest statistics (its
    `tasks` medians and `intrinsic` scores): each task's primary score, and the held-out
    MLM accuracy of the last phase, each against random init."""
    headline = {f"{name} {task['metric']}": _against_random(task.get("pretrained"), task.get("random_init")) for name, task in stats["tasks"].items()}
    if stats["intrinsic"]:
        phase, by_model = list(stats["intrinsic"].items())[-1]
        mine = by_model.get("pretrained", {}).get("mlm_accuracy")
        if mine is not None:
            headline[f"{phase} MLM accuracy"] = _against_random(mine, by_model.get("random_init", {}).get("mlm_accuracy"), percent=True)
    return headline


def _heading(title: str, intro: str) -> list[str]:
    return [f"## {title}", "", intro, ""]


def render_markdown(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    """The report as markdown. `plots` maps "pretraining" and "tasks" to image paths
    relative to the report (absent when that plot was not drawn)."""
    out: list[str] = ["# Evaluation report", ""]
    for needs, section in _SECTIONS:
        if needs is None or metrics.get(needs):
            out += section(metrics, plots)
    notes = metrics.get("notes") or []
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


def _model_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    model = metrics.get("model") or {}
    shape = model.get("config") or {}
    if shape:
        out.append(
            f"Model `{model.get('uri', '?')}`: {shape.get('num_hidden_layers')} layers, hidden size "
            f"{shape.get('hidden_size')}, {shape.get('num_attention_heads')} heads, vocabulary {shape.get('vocab_size'):,}, "
            f"{model.get('parameters', 0):,} parameters. Seed {metrics.get('seed')}."
        )
        out.append("")
    if metrics.get("baseline", True):
        out.append(
            "Every score is also computed for the same architecture with random weights (\"random init\"), "
            "so the difference is what pretraining bought."
        )
        out.append("")
    return out


def _pretraining_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    out = ["## Pretraining", ""]
    log = metrics.get("pretraining_log")
    if "pretraining" in plots:
        out += [f"![pretraining curves]({plots['pretraining']})", ""]
    if log and log.get("records"):
        last = log.get("last") or {}
        out.append(
            f"{log['records']:,} steps logged in `{log.get('uri')}`; last step {last.get('step')}: "
            f"loss {_fmt('loss', last.get('loss'))}, MLM accuracy {_fmt('mlm_accuracy', last.get('mlm_accuracy'))}."
        )
        if log.get("unreadable_lines"):
            out.append(f"{log['unreadable_lines']} unreadable line(s) of the log were left out.")
    else:
        out.append("No pretraining log (pretrain/metrics.jsonl) was found, so there are no training curves.")
    out.append("")
    return out


def _intrinsic_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    intrinsic = metrics["intrinsic"]
    out = _heading(
        "Held-out masked LM and next sentence prediction",
        "On the examples stage's validation sequences (masks as stored, or drawn with a fixed seed for dynamic masking).",
    )
    rows = []
    for phase, by_model in intrinsic.items():
        for model_name in ("pretrained", "random_init"):
            if model_name in by_model:
                scores = by_model[model_name]
                rows.append([phase, model_name.replace("_", " ")] + [_fmt(c, scores.get(c)) for c in _INTRINSIC_COLUMNS])
    out += _table(["phase", "model", "sequences", "masked tokens", "MLM loss", "MLM perplexity", "MLM acc.", "NSP loss", "NSP acc."], rows)
    out.append("")
    return out


def _tasks_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    tasks = metrics["tasks"]
    out = _heading("Fine-tuning", "Validation scores x 100: median over seeds [min, max]; gain = pretrained median - random-init median.")
    rows = []
    for name, task in tasks.items():
        metric = task["primary_metric"]
        mine = (task.get("pretrained") or {}).get("validation", {}).get(metric)
        theirs = (task.get("random_init") or {}).get("validation", {}).get(metric)
        gain = (task.get("gain") or {}).get(metric)
        how = f"{task['folds']}-fold CV" if task.get("folds") else "validation file"
        if task.get("freeze_encoder"):
            how += ", frozen encoder"
        rows.append([name, task["type"], metric, _summary_cell(metric, mine), _summary_cell(metric, theirs), _fmt(metric, gain), task.get("seeds"), how])
    out += _table(["task", "type", "metric", "pretrained", "random init", "gain", "seeds", "scored on"], rows)
    out.append("")
    if "tasks" in plots:
        out += [f"![task scores]({plots['tasks']})", ""]
    out += ["### All metrics", ""]
    rows = []
    for name, task in tasks.items():
        for split in ("validation", "test"):
            mine = (task.get("pretrained") or {}).get(split) or {}
            theirs = (task.get("random_init") or {}).get(split) or {}
            for metric, summary in mine.items():
                rows.append([name, split, metric, _summary_cell(metric, summary), _summary_cell(metric, theirs.get(metric))])
    out += _table(["task", "split", "metric", "pretrained", "random init"], rows)
    out.append("")
    return out


def _embeddings_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    embeddings = metrics["embeddings"]
    out = ["## Sentence embeddings", ""]
    out.append(
        f"Anisotropy: mean cosine similarity of random pairs of {embeddings.get('sentences', 0):,} held-out corpus "
        "sentences (near 1: every sentence points the same way). "
        + (
            f"STS: Spearman correlation of cosine similarity with the gold scores of {embeddings.get('sts_pairs'):,} pairs."
            if embeddings.get("sts_pairs")
            else "No STS file was given."
        )
    )
    out.append("")
    rows = []
    for model_name in ("pretrained", "random_init"):
        for pooling, scores in (embeddings.get(model_name) or {}).items():
            rows.append([model_name.replace("_", " "), pooling, _fmt("anisotropy", scores.get("anisotropy")), _fmt("sts_spearman", scores.get("sts_spearman"))])
    out += _table(["model", "pooling", "anisotropy", "STS Spearman (x100)"], rows)
    out.append("")
    return out


def _skipped_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    skipped = metrics["skipped_rows"]
    if not skipped.get("total"):
        return []
    tasks = metrics.get("tasks") or {}
    problems = [(name, p) for name, t in tasks.items() for p in t.get("skipped_problems", [])]
    out = ["## Skipped input rows", ""]
    out.append(f"{skipped['total']:,} malformed row(s) were skipped (on_error: skip).")
    out.append("")
    out += _table(["file", "rows skipped"], [[f"`{uri}`", n] for uri, n in skipped.get("files", {}).items()])
    out.append("")
    if problems:
        out += ["First problems:", ""] + [f"- {name}: {p}" for name, p in problems[:20]] + [""]
    return out


_SECTIONS = (
    (None, _model_section),
    (None, _pretraining_section),
    ("intrinsic", _intrinsic_section),
    ("tasks", _tasks_section),
    ("embeddings", _embeddings_section),
    ("skipped_rows", _skipped_section),
)
"""(the metrics key a section needs, or None, and the section), in report order."""
