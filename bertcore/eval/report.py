"""The evaluation report, eval/report.md: markdown made from the evaluate stage's metrics
dictionary (what it writes as eval/metrics.json).

Its plots are drawn in bertcore/eval/plots.py (matplotlib); the same scores as flat rows
and strict JSON are bertcore/eval/scores.py's, the stage's headline figures
bertcore/eval/summary.py's. This module needs neither numpy nor matplotlib.

The metrics dictionary, as far as the report reads it (SUBJECT is the model judged
against random init, "pretrained", or "student" after distillation, where "teacher" and
"student_start" (the student before its first step) are scored beside it; `subject`
names it, "pretrained" when absent):
    subject:         "pretrained" | "student"
    models:          {name: {"uri", "parameters", "config", "random_init"}}
    model:           models[subject]: {"uri", "parameters", "config": {num_hidden_layers, hidden_size, ...}}
    pretraining_log: {"uri", "records", "unreadable_lines", "last": {...}} or None
    intrinsic:       {phase: {SUBJECT: scores, "random_init": scores}}, scores with
                      "baselines": {"unigram": {"token", "mlm_accuracy", "mlm_loss"},
                      "nsp_balance": {"is_next", "random", "majority_accuracy"}}
    fill_mask:       [{"text", "answer", "predictions": [[token, p], ...], "answer_rank"}]
    tasks:           {name: {"subject", "type", "primary_metric", "seeds", "folds", SUBJECT:
                      {"validation": {metric: summary}, "test": ...}, "random_init": ..., "teacher": ...,
                      "student_start": ..., "gain": {metric: float}, "baselines": {"chance": {metric: value},
                      "validation": {"majority": {metric: value}}}, "verdict": {"text", ...},
                      "pooler", "pooling", "skipped": {split: rows}, "skipped_problems",
                      "train_fraction", "fit_examples", "long_inputs": {"mode", "max_seq_length",
                      "window_stride", "window_pool", "max_windows", "splits": {split: {"inputs",
                      "longer", "cut"}}} (classification, regression), "learning_curve" (with
                      several train_fractions: bertcore/eval/learning_curve.py)}}
    verdicts:        [str], one line per pretraining objective and task
    embeddings:      {"sentences", "sts_pairs", "long_inputs": {"mode", "max_seq_length", "inputs", "longer",
                      "cut"}, SUBJECT: {pooling: {...}}, "random_init": ..., "teacher": ..., "student_start": ...}
                      or None
    speed, distillation: after distillation, bertcore/eval/speed.py's and bertcore/eval/distillation.py's
    skipped_rows:    {"total", "files": {uri: rows}}
    notes:           [str]
where a summary is {median, min, max, std, n, n_nan} over seeds (metrics.summarize).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertcore import figures
from bertcore.eval import distillation, kinds, learning_curve
from bertcore.eval.scores import subject_of
from bertcore.train import metrics_log


def _fmt(metric: str, value: Any) -> str:
    """A table cell: scores in percent (correlations x 100), losses with three decimals
    (bertcore.figures, as everywhere else); '–' when missing."""
    text = figures.metric(metric, value)
    return "–" if text == "-" else text


def _gain(metric: str, gain: Any) -> str:
    """A difference of two scores in points; of other quantities, as they are."""
    if not figures.is_score(metric):
        return _fmt(metric, gain)
    text = figures.points(gain)
    return "–" if text == "-" else text


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


_INTRINSIC_COLUMNS = (
    "sequences",
    "masked_tokens",
    "mlm_loss",
    "mlm_perplexity",
    "mlm_accuracy",
    "nsp_loss",
    "nsp_accuracy",
)


def _heading(title: str, intro: str) -> list[str]:
    return [f"## {title}", "", intro, ""]


def render_markdown(
    metrics: Mapping[str, Any], plots: Mapping[str, str], diagnoses: Mapping[str, str] | None = None
) -> str:
    """The report as markdown. `plots` maps "pretraining" and "tasks" to image paths
    relative to the report (absent when that plot was not drawn); `diagnoses` maps a task
    to its `bertpipe diagnose` report, relative to this one (a section lists them)."""
    out: list[str] = ["# Evaluation report", ""]
    for needs, section in _SECTIONS:
        if needs is None or metrics.get(needs):
            out += section(metrics, plots)
    out += diagnoses_section(diagnoses or {})
    notes = metrics.get("notes") or []
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(out)


DIAGNOSES = "## Diagnoses"


def diagnoses_section(diagnoses: Mapping[str, str]) -> list[str]:
    """The lines of the section that links each task's diagnosis (none without one)."""
    if not diagnoses:
        return []
    out = [
        DIAGNOSES,
        "",
        (
            "Why a task scores what it scores, measured by `bertpipe diagnose` (leakage, label balance, suspect "
            "labels, learning rate, loss curves, forgetting, errors, seed spread):"
        ),
        "",
    ]
    return out + [f"- {task}: [{link}]({link})" for task, link in sorted(diagnoses.items())] + [""]


def with_diagnoses(text: str, diagnoses: Mapping[str, str]) -> str:
    """A rendered report with its diagnoses section made `diagnoses`' (replaced where it
    has one, else put before the notes or at the end)."""
    lines = diagnoses_section(diagnoses)
    section = "\n".join(lines) + "\n" if lines else ""
    start = text.find(f"\n{DIAGNOSES}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        end = len(text) if end < 0 else end + 1
        return text[: start + 1] + section + text[end:]
    notes = text.find("\n## Notes\n")
    if notes >= 0:
        return text[: notes + 1] + section + text[notes + 1 :]
    return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n" if section else text


def _model_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    model = metrics.get("model") or {}
    shape = model.get("config") or {}
    if shape:
        out.append(
            f"Model `{model.get('uri', '?')}` (paths are relative to run.root): {shape.get('num_hidden_layers')} "
            f"layers, hidden size {shape.get('hidden_size')}, {shape.get('num_attention_heads')} heads, vocabulary "
            f"{shape.get('vocab_size'):,}, {model.get('parameters', 0):,} parameters. Seed {metrics.get('seed')}."
        )
        out.append("")
    if subject_of(metrics) == "student":
        teacher = (metrics.get("models") or {}).get("teacher") or {}
        start = (metrics.get("models") or {}).get("student_start")
        out.append(
            f"This is the distilled student; its teacher `{teacher.get('uri', '?')}` is scored beside it"
            + (
                f", and so is its start `{start.get('uri', '?')}` (the student before its first distillation step)"
                if start
                else ""
            )
            + ", and the random init has the student's architecture."
        )
        out.append("")
    if metrics.get("baseline", True):
        out.append(
            'Every score is also computed for the same architecture with random weights ("random init"), '
            f"so the difference is what {'distillation' if subject_of(metrics) == 'student' else 'pretraining'} bought."
        )
        out.append("")
    return out


def _pretraining_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    out = ["## Distillation training" if subject_of(metrics) == "student" else "## Pretraining", ""]
    log = metrics.get("pretraining_log")
    if "pretraining" in plots:
        out += [f"![pretraining curves]({plots['pretraining']})", ""]
    if not (log and log.get("records")):
        return out + ["No pretraining log (pretrain/metrics.jsonl) was found, so there are no training curves.", ""]
    every = log.get("log_every", 1)
    out.append(
        f"{log['records']:,} steps logged in `{log.get('uri')}`. Training figures are means over logging intervals of "
        f"{every} steps, as the console and TensorBoard show them; the plot's points are the validations, on "
        "the fixed held-out sample."
    )
    final = log.get("final")
    if final:
        out.append(
            f"Final training figures ({metrics_log.steps_text(final)}): loss {figures.loss(final.get('loss'))}, "
            f"MLM accuracy {figures.percent(final.get('mlm_accuracy'))}"
            + (
                f", NSP accuracy {figures.percent(final['nsp_accuracy'])}"
                if final.get("nsp_accuracy") is not None
                else ""
            )
            + "."
        )
    validation = log.get("validation")
    if validation:
        out.append(
            f"Validation at step {validation.get('step')} ({validation.get('sequences', '?'):,} held-out sequences; "
            f"{log.get('validations')} validations in all): loss {figures.loss(validation.get('loss'))}, "
            f"MLM accuracy {figures.percent(validation.get('mlm_accuracy'))}"
            + (
                f", NSP accuracy {figures.percent(validation['nsp_accuracy'])}"
                if validation.get("nsp_accuracy") is not None
                else ""
            )
            + "."
        )
    jumps = log.get("loss_jumps") or []
    if jumps:
        listed = "; ".join(
            f"step {j['step']}: {j['loss']:.2f} ({j['factor']:.1f}x the running mean)" for j in jumps[:10]
        )
        out.append(
            f"Loss jumps seen during training (training went on): {listed}"
            + (f"; and {len(jumps) - 10} more." if len(jumps) > 10 else ".")
        )
    if log.get("unreadable_lines"):
        out.append(f"{log['unreadable_lines']} unreadable line(s) of the log were left out.")
    out.append("")
    return out


def _verdict_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    what = "distillation" if subject_of(metrics) == "student" else "pretraining"
    return (
        ["## Verdict", "", f"Did {what} pay off? Each line sets a score beside what learning nothing scores.", ""]
        + [f"- {line}" for line in metrics["verdicts"]]
        + [""]
    )


def _intrinsic_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    intrinsic = metrics["intrinsic"]
    with_nsp = any(s.get("nsp_accuracy") is not None for by_model in intrinsic.values() for s in by_model.values())
    out = _heading(
        "Validation masked LM" + (" and next sentence prediction" if with_nsp else ""),
        "On all of the examples stage's validation sequences (masks as stored, or drawn with a fixed seed for dynamic "
        "masking); the pretraining section's validations score a fixed sample of them, so the two can differ a little. "
        "The unigram baseline always guesses the most frequent training token and scores each target by its training "
        "frequency (the plateau a fresh BERT first reaches)"
        + ("; the majority label's share is what an NSP head that learned nothing scores." if with_nsp else "."),
    )
    columns = _INTRINSIC_COLUMNS if with_nsp else tuple(c for c in _INTRINSIC_COLUMNS if not c.startswith("nsp"))
    rows = []
    for phase, by_model in intrinsic.items():
        for model_name in (subject_of(metrics), "random_init"):
            if model_name in by_model:
                scores = by_model[model_name]
                rows.append([phase, model_name.replace("_", " ")] + [_fmt(c, scores.get(c)) for c in columns])
        floors = (by_model.get(subject_of(metrics)) or {}).get("baselines") or {}
        unigram, balance = floors.get("unigram") or {}, floors.get("nsp_balance") or {}
        if unigram or balance:
            label = f"unigram{' / majority label' if with_nsp else ''} (always {unigram.get('token', '?')!r})"
            floor = {
                "mlm_loss": unigram.get("mlm_loss"),
                "mlm_accuracy": unigram.get("mlm_accuracy"),
                "nsp_accuracy": balance.get("majority_accuracy"),
            }
            rows.append([phase, label] + [_fmt(c, floor.get(c)) for c in columns])
    header = [
        "phase",
        "model",
        "sequences",
        "masked tokens",
        "MLM loss",
        "MLM perplexity",
        "MLM acc.",
        "NSP loss",
        "NSP acc.",
    ]
    out += _table(header[: 2 + len(columns)], rows)
    out.append("")
    return out


def _fill_mask_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    whose = "the student's" if subject_of(metrics) == "student" else "the pretrained model's"
    out = _heading(
        "Fill-mask on held-out sentences",
        f"One word of each held-out corpus sentence replaced by [MASK]; {whose} five most likely tokens. "
        "A model still at the unigram plateau guesses the same frequent tokens everywhere.",
    )
    rows = []
    for item in metrics["fill_mask"]:
        guesses = ", ".join(f"{token} ({100 * p:.0f}%)" for token, p in item["predictions"])
        rank = item.get("answer_rank")
        rows.append([item["text"], item["answer"], guesses, rank if rank else "not in top 5"])
    out += _table(["sentence", "answer", "top guesses", "answer rank"], rows)
    out.append("")
    return out


def _floor_cell(task: Mapping[str, Any], metric: str) -> tuple[str, str]:
    floors = task.get("baselines") or {}
    majority = ((floors.get("validation") or {}).get("majority") or {}).get(metric)
    return _fmt(metric, majority), _fmt(metric, (floors.get("chance") or {}).get(metric))


def _tasks_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    tasks, subject = metrics["tasks"], subject_of(metrics)
    out = _heading(
        "Tasks",
        "Validation scores (accuracy and F1 in percent, correlations x 100): median over seeds [min, max]; "
        f"gain = {subject} median - random-init median, in points; "
        "majority = always the training data's most frequent label; chance = uniform random guessing.",
    )
    rows = []
    for name, task in tasks.items():
        metric = task["primary_metric"]
        mine = (task.get(subject) or {}).get("validation", {}).get(metric)
        theirs = (task.get("random_init") or {}).get("validation", {}).get(metric)
        gain = (task.get("gain") or {}).get(metric)
        rows.append(
            [
                name,
                task["type"],
                figures.name(metric),
                _summary_cell(metric, mine),
                _summary_cell(metric, theirs),
                _gain(metric, gain),
                *_floor_cell(task, metric),
                task.get("seeds"),
                _how(task),
            ]
        )
    out += _table(
        ["task", "type", "metric", subject, "random init", "gain (points)", "majority", "chance", "seeds", "scored on"],
        rows,
    )
    out.append("")
    out += [f"- {name}: {task['verdict']['text']}" for name, task in tasks.items() if task.get("verdict")] + [""]
    long_inputs = [
        f"- {name}: {_long_inputs(task['long_inputs'])}" for name, task in tasks.items() if task.get("long_inputs")
    ]
    if long_inputs:
        out += ["Inputs longer than the window:", "", *long_inputs, ""]
    if "tasks" in plots:
        out += [f"![task scores]({plots['tasks']})", ""]
    out += ["### All metrics", ""]
    rows = []
    for name, task in tasks.items():
        for split in ("validation", "test"):
            mine = (task.get(subject) or {}).get(split) or {}
            theirs = (task.get("random_init") or {}).get(split) or {}
            majority = ((task.get("baselines") or {}).get(split) or {}).get("majority") or {}
            for metric, summary in mine.items():
                rows.append(
                    [
                        name,
                        split,
                        figures.name(metric),
                        _summary_cell(metric, summary),
                        _summary_cell(metric, theirs.get(metric)),
                        _fmt(metric, majority.get(metric)),
                    ]
                )
    out += _table(["task", "split", "metric", subject, "random init", "majority"], rows)
    out.append("")
    return out


def _long_inputs(long: Mapping[str, Any]) -> str:
    """How many of a task's inputs were longer than its window, and what was done with them."""
    splits = long.get("splits") or {}
    counts = ", ".join(f"{c['longer']:,} of {c['inputs']:,} {split}" for split, c in splits.items())
    text = f"{counts} inputs longer than {long['max_seq_length']} tokens"
    if long.get("mode") != "windows":
        return text + "; truncated to it (long_inputs: windows reads them whole)"
    apart = f"{long['window_stride']} tokens" if long.get("window_stride") else "half a window"
    cut = sum(c.get("cut", 0) for c in splits.values())
    cut_text = f"{cut:,} still cut after {long['max_windows']} windows" if cut else "none cut"
    return text + f"; read in windows {apart} apart, {long['window_pool']}-pooled ({cut_text})"


def _how(task: Mapping[str, Any]) -> str:
    """How a task was scored, for the summary table."""
    if not kinds.get(task["type"]).trains:  # word similarity: the encoder's word vectors on word pairs
        pairs = task.get("word_pairs") or {}
        return f"{pairs.get('pairs', '?')} word pairs, no training"
    how = f"{task['folds']}-fold CV" if task.get("folds") else "validation file"
    if task.get("train_fraction", 1.0) < 1.0:
        how += f", {100 * task['train_fraction']:g}% of the training examples"
    if task.get("freeze_encoder"):
        how += ", frozen encoder"
    if task.get("pooling"):
        pooler = (task.get("pooler") or {}).get(task.get("subject", "pretrained"))
        how += f", {task['pooling']} pooling" + (
            f" (pooler: {pooler})" if task["pooling"] == "pooler" and pooler else ""
        )
    return how


def _embeddings_section(metrics: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    embeddings = metrics["embeddings"]
    out = ["## Sentence embeddings", ""]
    out.append(
        f"Anisotropy: mean cosine similarity of random pairs of {embeddings.get('sentences', 0):,} held-out corpus "
        "sentences (near 1: every sentence points the same way). "
        + (
            (
                "STS: Spearman correlation of cosine similarity with the gold scores of "
                f"{embeddings.get('sts_pairs'):,} pairs."
            )
            if embeddings.get("sts_pairs")
            else "No STS file was given."
        )
        + _long_sentences(embeddings.get("long_inputs"))
    )
    out.append("")
    rows = []
    for model_name in ("teacher", subject_of(metrics), "student_start", "random_init"):
        for pooling, scores in (embeddings.get(model_name) or {}).items():
            rows.append(
                [
                    model_name.replace("_", " "),
                    pooling,
                    _fmt("anisotropy", scores.get("anisotropy")),
                    _fmt("sts_spearman", scores.get("sts_spearman")),
                ]
            )
    out += _table(["model", "pooling", "anisotropy", "STS Spearman x100"], rows)
    out.append("")
    return out


def _long_sentences(long: Mapping[str, Any] | None) -> str:
    if not long:
        return ""
    how = "read in windows" if long.get("mode") == "windows" else "truncated"
    cut = f", {long['cut']:,} still cut after the last window" if long.get("cut") else ""
    return (
        f" {long['longer']:,} of the {long['inputs']:,} sentences (STS included) were longer than "
        f"{long.get('max_seq_length', '?')} tokens: {how}{cut}."
    )


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
    ("verdicts", _verdict_section),
    ("distillation", distillation.report_section),
    (None, _pretraining_section),
    ("intrinsic", _intrinsic_section),
    ("fill_mask", _fill_mask_section),
    ("tasks", _tasks_section),
    ("tasks", learning_curve.report_section),
    ("embeddings", _embeddings_section),
    ("skipped_rows", _skipped_section),
)
"""(the metrics key a section needs, or None, and the section), in report order."""
