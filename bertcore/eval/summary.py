"""From the evaluate stage's job results to the metrics dictionary's judged parts: each
task's scores over seeds beside its floors (majority class, chance), and a one-line
verdict per task and per pretraining objective, so a reader sees at once whether
pretraining bought anything.

A task's verdict compares the gain (median pretrained - median random init, primary
metric) with the seed spread (the larger max - min over seeds of the two models): a gain
above the spread is measurable, one inside it is not. A task that trains nothing (word
similarity) gives the pretrained model one score whatever the seed, so a spread cannot
judge it: one pretrained score can beat a few random draws by luck (a fresh model is
another random draw). There the verdict is a rank test: under "pretraining changed
nothing" the pretrained score is one more draw among the random-init ones, so
p = (1 + draws scoring at least as high) / (draws + 1), and the gain counts when p <= 0.05
(which takes 19 or more random-init seeds); a score beyond the whole range of the draws by
more than that range is a gain (or a loss) whatever the test can resolve, and the test's
resolution becomes a note. With one seed a trained task has no spread: a gain over a
random init at the majority-class level still counts, with that caveat as a note. A model whose median sits at the
majority-class score learned nothing, whatever the other one did. Held-out MLM accuracy
is judged against the unigram predictor (always the most frequent token), NSP accuracy
against the share of the majority label among the held-out pairs.

The model judged against random init is the "subject": "pretrained" in a plain
evaluation; after distillation "student", with "teacher" and "student_start" scored beside
it (what the student keeps of the teacher's gain, and how much of its own its start
already had, is bertcore/eval/distillation.py's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bertcore import figures
from bertcore.eval import baselines, finetune, kinds
from bertcore.eval.config import TaskConfig

AT_FLOOR_POINTS = 1.0
"""A median within this many points (x100) of the majority-class score counts as at that level."""
PLATEAU_POINTS = 1.0
"""Held-out MLM accuracy within this many points of the unigram baseline is still the unigram plateau."""
RANK_TEST_LEVEL = 0.05
"""Largest rank-test p-value at which a deterministic pretrained score counts as a gain."""
_RUN_FIELDS = ("seed", "validation", "test", "final_train_loss", "epochs_trained", "best_epoch", "seconds")


def _points(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100.0 * value:.1f}"


def _median(entry: Mapping, model: str, metric: str, split: str = "validation") -> float | None:
    summary = (entry.get(model) or {}).get(split, {}).get(metric)
    value = None if summary is None else summary.get("median")
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def seeds_of(task: TaskConfig, random_init: bool) -> list[int]:
    """The seeds a model runs a task with: every seed, except that a pretrained model on a
    task that trains nothing (word_similarity) scores the same on each, so it runs once."""
    return task.seeds[:1] if not task.kind.trains and not random_init else list(task.seeds)


def task_entry(task: TaskConfig, runs: Mapping[str, Sequence[dict]], subject: str = "pretrained") -> dict[str, Any]:
    """The metrics.json entry of one task from its `run_task` results per model name
    (`subject`: "pretrained", or "student" beside "teacher" after distillation; and
    "random_init" when the baseline ran): scores over seeds, the subject's gain over
    random init, the floors and the verdict."""
    first = runs[subject][0]
    metric = task.kind.primary_metric
    entry: dict[str, Any] = {
        "subject": subject,
        "type": task.type,
        "primary_metric": metric,
        "seeds": len(task.seeds),
        "folds": task.cross_validation_folds,
        "freeze_encoder": task.freeze_encoder,
        "pooling": task.pooling if task.kind.pooled else None,
        "labels": first["labels"],
        "train_examples": first["train_examples"],
        "train_fraction": first.get("fraction", 1.0),
        "fit_examples": first.get("fit_examples"),
        "pooler": {model: model_runs[0].get("pooler") for model, model_runs in runs.items()},
    }
    summaries = {model: finetune.summarize_seeds(model_runs) for model, model_runs in runs.items()}
    for model, summary in summaries.items():
        entry[model] = {k: v for k, v in summary.items() if k != "runs"}
        entry[model]["runs"] = [{k: r[k] for k in _RUN_FIELDS if k in r} for r in summary["runs"]]
    if "random_init" in summaries:
        entry["gain"] = finetune.baseline_gain(summaries[subject], summaries["random_init"])
    entry["baselines"] = {"chance": task.kind.chance(task, first["labels"]), **(first.get("baselines") or {})}
    if "word_pairs" in first:
        entry["word_pairs"] = first["word_pairs"]
    if first.get("long_inputs") is not None:
        entry["long_inputs"] = {
            "mode": task.long_inputs,
            "max_seq_length": task.max_seq_length,
            "window_stride": task.window_stride,
            "window_pool": task.window_pool,
            "max_windows": task.max_windows,
            "splits": first["long_inputs"],
        }
    entry["skipped"] = first["skipped"]
    entry["skipped_problems"] = first["skipped_problems"]
    entry["verdict"] = task_verdict(entry)
    return entry


def task_verdict(entry: Mapping[str, Any]) -> dict[str, Any]:
    """{"text", "gain", "spread", "measurable"} for a task entry (fractions, not points).
    The text is the verdict, then what the floors say, then notes on how far the test can
    see ("note: one seed ..."), so a caveat never hides the verdict."""
    metric = entry["primary_metric"]
    models = (entry.get("subject", "pretrained"), "random_init")
    mine, theirs = _median(entry, models[0], metric), _median(entry, "random_init", metric)
    majority = ((entry.get("baselines") or {}).get("validation") or {}).get("majority", {}).get(metric)
    at_floor = [
        m
        for m in models
        if majority is not None
        and (v := _median(entry, m, metric)) is not None
        and v <= majority + AT_FLOOR_POINTS / 100
    ]
    floor = ""
    if majority is not None and mine is not None:
        if len(at_floor) == 2:
            floor = (
                f"; both models score at the majority-class level ({figures.metric(metric, majority)}): neither "
                "learned the task"
            )
        elif at_floor:
            floor = (
                f"; {at_floor[0].replace('_', ' ')} scores at the majority-class level "
                f"({figures.metric(metric, majority)})"
            )
    if mine is None:
        return {"text": f"no {metric} score", "gain": None, "spread": None, "measurable": False}
    if theirs is None:
        return {
            "text": (
                f"{figures.name(metric)} {figures.metric(metric, mine)}; no random-init baseline to compare with{floor}"
            ),
            "gain": None,
            "spread": None,
            "measurable": False,
        }
    gain = mine - theirs
    if not kinds.get(entry["type"]).trains:
        return _rank_verdict(entry, metric, mine, gain, floor)
    spread = baselines.spread(*(((entry.get(m) or {}).get("validation") or {}).get(metric) for m in models))
    notes = []
    if spread is None:
        notes.append("one seed, so no seed spread to judge it by")
        if gain > AT_FLOOR_POINTS / 100 and at_floor == ["random_init"]:  # random init learned nothing, pretrained did
            text, measurable = f"gain {_points(gain)} points", True
        elif len(at_floor) == 2:  # neither learned anything: nothing to judge
            text, measurable = f"no measurable gain ({_points(gain)} points)", False
        else:
            text, measurable = f"undecided: {_points(gain)} points (add seeds to judge it)", False
    elif gain > spread:
        text, measurable = f"gain {_points(gain)} points, above the seed spread of {_points(spread)}", True
    elif gain < -spread:
        text, measurable = (
            f"loss of {_points(-gain)} points, beyond the seed spread of {_points(spread)}: random init does better",
            True,
        )
    else:
        text, measurable = (
            f"no measurable gain ({_points(gain)} points, within the seed spread of {_points(spread)})",
            False,
        )
    return {"text": text + floor + _notes(notes), "gain": gain, "spread": spread, "measurable": measurable and gain > 0}


def _notes(notes: list[str]) -> str:
    return "".join(f"; note: {note}" for note in notes)


def _rank_verdict(entry: Mapping[str, Any], metric: str, mine: float, gain: float, floor: str) -> dict[str, Any]:
    """The verdict for a pretrained score that does not depend on the seed, against the
    random-init draws: beyond their whole range by more than that range, it is a gain (or
    a loss) whatever the rank test can resolve; otherwise its rank decides, at p <= 0.05."""
    draws = sorted(
        r["validation"][metric]
        for r in (entry.get("random_init") or {}).get("runs", [])
        if _finite(r.get("validation", {}).get(metric))
    )
    p = (1 + sum(d >= mine for d in draws)) / (len(draws) + 1)
    out = {"gain": gain, "spread": None, "p_value": p}
    notes = []
    if len(draws) + 1 < 1 / RANK_TEST_LEVEL:
        notes.append(
            f"the rank test cannot go below p = {1 / (len(draws) + 1):.2f} with {len(draws)} draws (19 or "
            f"more reach {RANK_TEST_LEVEL})"
        )
    if draws:
        low, high = draws[0], draws[-1]
        width = high - low
        where = f"{len(draws)} draws from {_points(low)} to {_points(high)}"
        if mine > high + width:
            return out | {
                "text": f"gain {_points(gain)} points, beyond every random-init draw ({where}){floor}{_notes(notes)}",
                "measurable": True,
            }
        if mine < low - width:
            return out | {
                "text": (
                    f"loss of {_points(-gain)} points, below every random-init draw ({where}){floor}{_notes(notes)}"
                ),
                "measurable": False,
            }
    if p <= RANK_TEST_LEVEL and gain > 0:
        text = f"gain {_points(gain)} points: above all {len(draws)} random-init draws (rank test p = {p:.2f})"
        return out | {"text": text + floor, "measurable": True}
    text = f"no measurable gain ({_points(gain)} points; rank among {len(draws)} random-init draws: p = {p:.2f})"
    return out | {"text": text + floor + _notes(notes), "measurable": False}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def mlm_verdict(phase: str, scores: Mapping[str, Mapping], subject: str = "pretrained") -> str | None:
    """One line on held-out MLM accuracy against the unigram baseline and random init."""
    mine = scores.get(subject) or {}
    accuracy = mine.get("mlm_accuracy")
    unigram = (mine.get("baselines") or {}).get("unigram") or {}
    if accuracy is None or "mlm_accuracy" not in unigram:
        return None
    token = unigram.get("token")
    guess = f"always guessing {token!r}" if token else "the unigram predictor"
    sequences = f" ({mine['sequences']:,} held-out sequences)" if isinstance(mine.get("sequences"), int) else ""
    text = (
        f"{phase} validation MLM accuracy {_points(accuracy)}%{sequences} vs {_points(unigram['mlm_accuracy'])}% "
        f"for {guess}"
    )
    if "random_init" in scores:
        text += f" and {_points(scores['random_init'].get('mlm_accuracy'))}% for random init"
    if accuracy <= unigram["mlm_accuracy"] + PLATEAU_POINTS / 100:
        return text + ": still at the unigram plateau (it predicts frequent tokens, not from context)"
    return text + f": {_points(accuracy - unigram['mlm_accuracy'])} points above the unigram baseline"


def nsp_verdict(phase: str, scores: Mapping[str, Mapping], subject: str = "pretrained") -> str | None:
    """One line on held-out NSP accuracy against the share of the majority label."""
    mine = scores.get(subject) or {}
    accuracy = mine.get("nsp_accuracy")
    balance = (mine.get("baselines") or {}).get("nsp_balance")
    if accuracy is None or not balance:
        return None
    majority = balance["majority_accuracy"]
    text = (
        f"{phase} validation NSP accuracy {_points(accuracy)}% vs {_points(majority)}% for always guessing the "
        "majority label"
    )
    if accuracy <= majority + PLATEAU_POINTS / 100:
        return text + ": the label balance, no next-sentence skill"
    return text + f": {_points(accuracy - majority)} points above it"


def verdicts(metrics: Mapping[str, Any]) -> list[str]:
    """Every verdict line of a metrics dictionary: per intrinsic phase, then per task."""
    lines = []
    subject = metrics.get("subject", "pretrained")
    for phase, scores in (metrics.get("intrinsic") or {}).items():
        lines += [line for line in (mlm_verdict(phase, scores, subject), nsp_verdict(phase, scores, subject)) if line]
    for name, task in (metrics.get("tasks") or {}).items():
        lines.append(f"{name} ({figures.name(task['primary_metric'])}): {task['verdict']['text']}")
    return lines


def stats(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's statistics: the headline numbers (medians, intrinsic scores) and the verdicts."""
    from bertcore.eval.scores import json_safe

    stats: dict[str, Any] = {"skipped_rows": metrics["skipped_rows"]["total"], "tasks": {}, "intrinsic": {}}
    for phase, by_model in metrics["intrinsic"].items():
        stats["intrinsic"][phase] = {
            m: {k: s.get(k) for k in ("mlm_accuracy", "mlm_perplexity", "nsp_accuracy")} for m, s in by_model.items()
        }
    for name, task in metrics["tasks"].items():
        metric = task["primary_metric"]
        models = (task.get("subject", "pretrained"), "random_init", "teacher", "student_start")
        stats["tasks"][name] = {"metric": metric, "measurable": bool((task.get("verdict") or {}).get("measurable"))} | {
            m: _median(task, m, metric) for m in models if m in task
        }
    stats["verdicts"] = metrics["verdicts"]
    return json_safe(stats)


def headline(stats: Mapping[str, Any]) -> dict[str, str]:
    """The evaluate stage's key figures for its end line (which keeps the first that fit)
    and the run summary (which wraps them all): how many tasks show a measurable gain, the
    validation MLM accuracy of the last phase, then each task's primary score, each beside
    random init, in percent (correlations x 100) and with the metric's full name; after
    distillation, the student's."""
    tasks = stats["tasks"]
    subject = "student" if any("student" in task for task in tasks.values()) else "pretrained"
    out: dict[str, str] = {}
    if tasks:
        gains = sum(1 for task in tasks.values() if task.get("measurable"))
        out["tasks with a measurable gain"] = f"{gains} of {len(tasks)}"
    if stats["intrinsic"]:
        phase, by_model = list(stats["intrinsic"].items())[-1]
        mine = by_model.get(subject, {}).get("mlm_accuracy")
        if mine is not None:
            sequences = by_model.get(subject, {}).get("sequences")
            text = _against_random("mlm_accuracy", mine, by_model.get("random_init", {}).get("mlm_accuracy"))
            out[f"{phase} validation MLM accuracy"] = text + (
                f" ({sequences:,} sequences)" if isinstance(sequences, int) else ""
            )
    for name, task in tasks.items():
        metric = task["metric"]
        out[f"{name} {figures.name(metric)}"] = _against_random(metric, task.get(subject), task.get("random_init"))
    return out


def _against_random(metric: str, mine: Any, theirs: Any) -> str:
    text = figures.metric(metric, mine)
    return f"{text} vs {figures.metric(metric, theirs)} for random init" if isinstance(theirs, (int, float)) else text
