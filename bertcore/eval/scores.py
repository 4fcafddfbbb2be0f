"""The evaluation's scores as plain data, for what shows them outside the report: metrics.json
as strict JSON, and one flat row per score (the evaluate stage's table artifact, its
TensorBoard scalars, `bertpipe inspect evaluate`). The metrics dictionary they are made
from is described in bertcore/eval/report.py.

This module needs neither numpy nor matplotlib, so `bertpipe inspect evaluate` reads
metrics.json in an instant.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from bertcore.eval import kinds


def json_safe(value: Any) -> Any:
    """`value` with nan/inf floats replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():  # a numpy scalar
        return json_safe(value.item())
    return value


def json_dumps(metrics: Any) -> str:
    """Strict JSON text of `metrics` (nan and inf as null), indented for reading."""
    return json.dumps(json_safe(metrics), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def subject_of(metrics: Mapping[str, Any]) -> str:
    """The model judged against random init: "pretrained", or "student" after distillation."""
    return metrics.get("subject", "pretrained")


def score_rows(metrics: Mapping[str, Any]) -> list[dict]:
    """One flat row per (section, name, metric), with the same keys in every row, for a
    table artifact and `bertpipe inspect evaluate`: section, name, metric, pretrained,
    pretrained_min, pretrained_max, random_init, gain, baseline (what learning nothing
    scores: the unigram predictor, the majority NSP label, the majority class) and its
    name, the seeds of each model (a task that trains nothing scores the pretrained model
    once and draws random init once per seed). Scores are fractions as in metrics.json (not x 100). Sections:
    "pretraining" (validation MLM/NSP), "fine-tuning" (tasks that train), "no training"
    (word similarity), "embeddings". After distillation the "pretrained" columns hold the
    student's (the subject's)."""
    subject = subject_of(metrics)

    def row(
        section,
        name,
        metric,
        pretrained,
        random_init,
        low=None,
        high=None,
        seeds=None,
        baseline=None,
        baseline_name=None,
        random_init_seeds=None,
    ):
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
                "baseline": baseline,
                "baseline_name": baseline_name if baseline is not None else None,
                "seeds": seeds,
                "random_init_seeds": random_init_seeds,
            }
        )

    rows = []
    for phase, by_model in (metrics.get("intrinsic") or {}).items():
        floors = (by_model.get(subject) or {}).get("baselines") or {}
        unigram, balance = floors.get("unigram") or {}, floors.get("nsp_balance") or {}
        baseline = {
            "mlm_loss": (unigram.get("mlm_loss"), "unigram"),
            "mlm_accuracy": (unigram.get("mlm_accuracy"), "unigram"),
            "nsp_accuracy": (balance.get("majority_accuracy"), "majority label"),
        }
        for metric in ("mlm_loss", "mlm_perplexity", "mlm_accuracy", "nsp_accuracy"):
            mine = by_model.get(subject, {}).get(metric)
            if mine is not None:
                rows.append(
                    row(
                        "pretraining",
                        phase,
                        metric,
                        mine,
                        by_model.get("random_init", {}).get(metric),
                        None,
                        None,
                        None,
                        *baseline.get(metric, (None, None)),
                    )
                )
    for name, task in (metrics.get("tasks") or {}).items():
        section = "fine-tuning" if kinds.get(task["type"]).trains else "no training"
        for split in ("validation", "test"):
            mine = task.get(subject, {}).get(split) or {}
            theirs = task.get("random_init", {}).get(split) or {}
            majority = ((task.get("baselines") or {}).get(split) or {}).get("majority") or {}
            label = name if split == "validation" else f"{name} (test)"
            for metric, summary in mine.items():
                other = theirs.get(metric, {})
                rows.append(
                    row(
                        section,
                        label,
                        metric,
                        summary["median"],
                        other.get("median"),
                        summary["min"],
                        summary["max"],
                        summary["n"],
                        majority.get(metric),
                        "majority class",
                        other.get("n"),
                    )
                )
    embeddings = metrics.get("embeddings") or {}
    for pooling, scores in (embeddings.get(subject) or {}).items():
        for metric, value in scores.items():
            rows.append(
                row(
                    "embeddings",
                    pooling,
                    metric,
                    value,
                    (embeddings.get("random_init") or {}).get(pooling, {}).get(metric),
                )
            )
    return rows
