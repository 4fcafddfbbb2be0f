"""How a figure is written, in one place, so that the console, the run summary, `bertpipe
status` and `inspect`, the report and the trackers show one quantity the same way:

- accuracies, F1 and other fractions: percent with one decimal (`8.8%`); correlations
  (Spearman, Pearson, Matthews) x 100 with one decimal, named so (`Spearman x100 47.1`);
  a difference between two scores in points (`gain 3.9 points`);
- losses with three decimals (`7.464`), perplexities with one (`993.8`);
- durations: `3.1s`, `4m05s`, `2h03m`; counts: `1,234`, `12.3k`; sizes: `7.6 MB`.

Which metrics are scores is decided by name (`is_score`): everything but losses,
perplexities, counts and the like, which keep their own scale. What a pretraining figure
averages over (an interval of steps, "final", held-out) is bertcore.train.metrics_log's to say.
"""

from __future__ import annotations

import math
from typing import Any

RAW_SCALE = ("loss", "perplexity", "mse", "count", "sequences", "batches", "tokens", "threshold", "anisotropy")
"""Metric names containing these are quantities with their own scale; every other metric is a score shown in
percent (x 100)."""

NAMES = {
    "accuracy": "accuracy",
    "mlm_accuracy": "MLM accuracy",
    "nsp_accuracy": "NSP accuracy",
    "mlm_loss": "MLM loss",
    "nsp_loss": "NSP loss",
    "mlm_perplexity": "MLM perplexity",
    "f1": "F1",
    "exact_match": "exact match",
    "spearman": "Spearman",
    "pearson": "Pearson",
    "matthews": "Matthews correlation",
    "mcc": "Matthews correlation",
    "macro_f1": "macro F1",
    "precision": "precision",
    "recall": "recall",
    "sts_spearman": "STS Spearman",
}
"""Metric keys -> how people read them."""


CORRELATIONS = ("spearman", "pearson", "matthews", "mcc")
"""Scores that are correlations: shown x 100, without a percent sign."""


def is_correlation(metric: str) -> bool:
    return any(word in metric for word in CORRELATIONS)


def is_score(metric: str) -> bool:
    """True for scores shown x 100 (accuracy, F1, correlations, ...)."""
    return metric not in ("lr", "grad_norm") and not any(word in metric for word in RAW_SCALE)


def scale(metric: str) -> float:
    """100 for scores shown in percent or points, 1 for quantities kept as they are."""
    return 100.0 if is_score(metric) else 1.0


def name(metric: str) -> str:
    """A metric key as people read it, with its unit where the value does not carry one:
    mlm_accuracy -> MLM accuracy, spearman -> Spearman x100."""
    text = NAMES.get(metric, metric.replace("_", " "))
    return f"{text} x100" if is_correlation(metric) else text


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def percent(fraction: float | None, digits: int = 1) -> str:
    """0.0884 -> 8.8%; '-' for a missing value."""
    return f"{100.0 * fraction:.{digits}f}%" if _finite(fraction) else "-"


def points(difference: float | None) -> str:
    """A difference of two fractions in points: 0.039 -> 3.9; '-' for a missing value."""
    return f"{100.0 * difference:.1f}" if _finite(difference) else "-"


def loss(value: float | None) -> str:
    """7.4641 -> 7.464."""
    return f"{value:.3f}" if _finite(value) else "-"


def metric(key: str, value: Any) -> str:
    """A value of metric `key` as it is shown: a fraction in percent, a correlation x 100
    (its name says so), a loss with three decimals, a count with separators, anything else
    with four significant digits and no exponent."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key == "lr":
        return f"{value:.3g}"
    if is_score(key):
        return points(value) if is_correlation(key) else percent(value)
    if isinstance(value, int):
        return f"{value:,}"
    if "perplexity" in key:
        return f"{value:,.1f}"
    if "loss" in key:
        return f"{value:,.3f}"
    return plain(value)


def plain(value: float) -> str:
    """A number without exponent: 0.9994, 12.35, 4,951."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1 or value == 0:
        return f"{value:.4g}"
    return f"{value:.4f}"


def duration(seconds: float | None) -> str:
    """3.1s, 4m05s, 2h03m; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def count(n: float) -> str:
    """1,234 / 12.3k / 4.56M / 1.0M: short enough for one log line (three significant
    digits, at least one decimal below 100, and the next unit up where rounding reaches 1,000)."""
    n = float(n)
    if abs(n) < 10_000:
        return f"{n:,.0f}"
    for factor, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G")):
        value = n / factor
        if abs(float(f"{value:.3g}")) < 1000:
            text = f"{value:.3g}"
            return f"{value:.1f}{suffix}" if abs(value) < 99.95 and "." not in text else f"{text}{suffix}"
    return f"{n / 1e9:,.0f}G"


def size(nbytes: float) -> str:
    """7.6 MB / 312.0 kB."""
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"
