"""What the task's files hold, before any model: validation (and test) rows that are also in
the training file, the label balance and what always predicting the majority class scores,
inputs longer than max_seq_length and what truncation cuts, and empty, duplicate or
malformed rows.

Rows are matched on their texts (`TaskKind.text_parts`: the sentence or pair, the words of a
tagged sentence, question and context, context and candidates), lower-cased with runs of
whitespace made one space: the same text is an exact copy. A near copy is a row whose
character 5-grams overlap another's with a Jaccard similarity of at least `near` (0.8 by
default: a changed word or two in a sentence), computed exactly over every pair with
scikit-learn's sparse counts, a block of rows at a time.

A row is named by its 0-based index among the split's examples as read (the header, blank
lines and skipped malformed rows not counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bertcore import figures
from bertcore.eval.diagnosis.findings import Finding, not_applicable, percent, quoted
from bertcore.eval.kinds.base import TaskKind

NEAR = 0.8
"""Jaccard similarity of character 5-grams from which two rows are near copies."""
SHINGLE = 5
BLOCK = 512
"""Rows compared with all the others at a time (memory: BLOCK x rows similarities)."""
EXAMPLES = 3
"""Rows quoted in a finding's line."""


def normalised(text: str) -> str:
    return " ".join(text.lower().split())


def row_key(kind: TaskKind, example) -> str:
    """What two rows must share to be copies: their normalised texts, tab-joined."""
    return "\t".join(normalised(part) for part in kind.text_parts(example))


@dataclass(frozen=True)
class Leak:
    """A row of another split (or fold) that is also in the training data."""

    split: str
    row: int
    train_row: int
    similarity: float
    """1.0 for an exact copy; else the Jaccard similarity of character 5-grams."""
    text: str


def _near_pairs(
    keys: Sequence[str], against: Sequence[str], threshold: float, same: bool
) -> list[tuple[int, int, float]]:
    """(i, j, similarity) of the best match j in `against` of each key i at or above the
    threshold (`same`: both are one list, a row never matches itself or an earlier row)."""
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer

    if not keys or not against:
        return []
    vectorizer = CountVectorizer(analyzer="char", ngram_range=(SHINGLE, SHINGLE), binary=True, lowercase=False)
    try:
        vectorizer.fit([*keys, *against])
    except ValueError:  # every text shorter than a shingle
        return []
    a, b = vectorizer.transform(keys), vectorizer.transform(against)
    size_a, size_b = np.asarray(a.sum(1)).ravel(), np.asarray(b.sum(1)).ravel()
    found = []
    for start in range(0, a.shape[0], BLOCK):
        shared = (a[start : start + BLOCK] @ b.T).toarray().astype(float)  # (block, M)
        union = size_a[start : start + BLOCK, None] + size_b[None, :] - shared
        similarity = np.divide(shared, union, out=np.zeros_like(shared), where=union > 0)
        if same:
            rows = np.arange(start, start + similarity.shape[0])
            mask = np.arange(similarity.shape[1])[None, :] >= rows[:, None]
            similarity[mask] = 0.0  # only earlier rows: each pair once, no row with itself
        best = similarity.argmax(1)
        for offset, j in enumerate(best):
            value = similarity[offset, j]
            if value >= threshold:
                found.append((start + offset, int(j), float(value)))
    return found


def leaks(kind: TaskKind, train: Sequence, others: dict[str, Sequence], near: float = NEAR) -> list[Leak]:
    """Every row of `others` (split -> examples) that is in `train`: exact copies first
    (the first training row with the same text), then near copies of the rest."""
    train_keys = [row_key(kind, e) for e in train]
    first: dict[str, int] = {}
    for i, key in enumerate(train_keys):
        first.setdefault(key, i)
    out = []
    for split, examples in others.items():
        keys = [row_key(kind, e) for e in examples]
        exact = {i: first[k] for i, k in enumerate(keys) if k in first}
        out += [Leak(split, i, j, 1.0, " / ".join(kind.text_parts(examples[i]))) for i, j in exact.items()]
        rest = [i for i in range(len(keys)) if i not in exact]
        for i, j, similarity in _near_pairs([keys[i] for i in rest], train_keys, near, same=False):
            row = rest[i]
            out.append(Leak(split, row, j, similarity, " / ".join(kind.text_parts(examples[row]))))
    return out


def fold_leaks(kind: TaskKind, train: Sequence, folds: Sequence[Sequence[int]], near: float = NEAR) -> list[Leak]:
    """Cross-validation: rows of a held-out fold with an exact or near copy in another fold
    (which trained the model that scores it). `folds`: the held-out rows of each fold."""
    fold_of = {row: k for k, rows in enumerate(folds) for row in rows}
    keys = [row_key(kind, e) for e in train]
    rows: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        rows.setdefault(key, []).append(i)
    out, seen = [], set()
    for members in rows.values():
        for i in members:
            other = next((j for j in members if fold_of[j] != fold_of[i]), None)
            if other is not None:
                out.append(Leak(f"fold {fold_of[i]}", i, other, 1.0, " / ".join(kind.text_parts(train[i]))))
                seen.add(i)
    for i, j, similarity in _near_pairs(keys, keys, near, same=True):
        for row, copy in ((i, j), (j, i)):
            if row not in seen and fold_of[row] != fold_of[copy]:
                out.append(Leak(f"fold {fold_of[row]}", row, copy, similarity, " / ".join(kind.text_parts(train[row]))))
                seen.add(row)
    return sorted(out, key=lambda leak: leak.row)


def leakage_finding(found: list[Leak], sizes: dict[str, int], cross_validated: bool) -> Finding:
    """How many held-out rows the model may have seen in training, with examples."""
    held = sum(sizes.values())
    exact = [leak for leak in found if leak.similarity >= 1.0]
    near = [leak for leak in found if leak.similarity < 1.0]
    where = "another cross-validation fold" if cross_validated else "the training file"
    what = "held-out rows" if cross_validated else " and ".join(f"{split}" for split in sizes) + " rows"
    figures_ = {
        "exact": len(exact),
        "near": len(near),
        "held_out_rows": held,
        "by_split": {split: sum(leak.split == split for leak in found) for split in sorted({x.split for x in found})},
        "near_threshold": NEAR,
    }
    if not found:
        return Finding("leakage", "ok", f"none of the {what} has an exact or near copy in {where}", figures=figures_)
    shown = "; ".join(
        f"{leak.split} row {leak.row} = train row {leak.train_row} {quoted(leak.text, 40)}" for leak in found[:EXAMPLES]
    )
    share = len(found) / held if held else 0.0
    text = (
        f"{len(exact)} exact and {len(near)} near copies ({percent(len(found), held)} of {held} {what}) are in "
        f"{where}: their scores measure memory, not the task; e.g. {shown}"
    )
    advice = (
        "remove the copies from the training file (leaked_rows.tsv lists them) and score again"
        if not cross_validated
        else "remove duplicate rows from the training file so no fold scores a row another fold trained on"
    )
    return Finding("leakage", "problem" if share >= 0.01 else "warning", text, advice, figures_)


def duplicate_groups(kind: TaskKind, examples: Sequence) -> list[list[int]]:
    """Rows sharing one normalised text, two or more to a group, in file order."""
    rows: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        rows.setdefault(row_key(kind, e), []).append(i)
    return [members for members in rows.values() if len(members) > 1]


def rows_finding(
    kind: TaskKind,
    splits: dict[str, Sequence],
    skipped: dict[str, tuple[int, list[str]]],
    on_error: str,
) -> Finding:
    """Empty rows, duplicate rows (and duplicates whose labels disagree) and malformed rows."""
    bad = {split: n for split, (n, _) in skipped.items() if n}
    first_problem = next((problems[0] for n, problems in skipped.values() if problems), None)
    empty = {
        split: [i for i, e in enumerate(ex) if not any(p.strip() for p in kind.text_parts(e))]
        for split, ex in splits.items()
    }
    groups = {split: duplicate_groups(kind, ex) for split, ex in splits.items()}
    conflicts = {
        split: [g for g in found if len({kind.given(splits[split][i]) for i in g}) > 1]
        for split, found in groups.items()
    }
    copies = {split: sum(len(g) - 1 for g in found) for split, found in groups.items()}
    figures_ = {
        "malformed": bad,
        "empty": {s: len(rows) for s, rows in empty.items()},
        "duplicates": copies,
        "conflicting_groups": {s: len(g) for s, g in conflicts.items()},
        "conflicts": {s: g[:20] for s, g in conflicts.items() if g},
    }
    parts, severity, advice = [], "ok", []
    if bad:
        parts.append(
            "malformed rows skipped: "
            + ", ".join(f"{n} in {split}" for split, n in bad.items())
            + f" ({first_problem})"
        )
        severity = "problem" if on_error == "raise" else "warning"
        advice.append(
            "fix them (the evaluate stage stops at the first, on_error: raise)"
            if on_error == "raise"
            else "fix them: skipped rows are data the model never sees"
        )
    conflicting = sum(len(g) for g in conflicts.values())
    if conflicting:
        split, group = next((s, g[0]) for s, g in conflicts.items() if g)
        labels = ", ".join(f"row {i} {quoted(kind.given(splits[split][i]), 20)}" for i in group[:4])
        parts.append(
            f"{conflicting} rows share their text with a row of another label ({split}: "
            f"{quoted(' / '.join(kind.text_parts(splits[split][group[0]])), 40)}: {labels})"
        )
        severity = "problem"
        advice.append("decide one label for each text (suspect_labels.tsv ranks the rest)")
    if any(copies.values()):
        parts.append(
            "duplicate rows (after case and whitespace): "
            + ", ".join(f"{n} of {len(splits[s])} in {s}" for s, n in copies.items() if n)
        )
        severity = severity if severity == "problem" else "warning" if severity == "warning" else "note"
        advice.append("drop the copies: they weigh their text more than the others")
    if any(empty.values()):
        parts.append("empty rows: " + ", ".join(f"{len(r)} in {s} (row {r[0]})" for s, r in empty.items() if r))
        severity = "problem" if severity == "problem" else "warning"
        advice.append("remove the empty rows")
    if not parts:
        counted = ", ".join(f"{len(ex)} {split}" for split, ex in splits.items())
        return Finding("rows", "ok", f"no empty, duplicate or malformed rows ({counted} rows)", figures=figures_)
    return Finding("rows", severity, "; ".join(parts), "; ".join(advice), figures_)


def balance_finding(
    kind: TaskKind,
    task,
    labels: list[str],
    train: Sequence,
    evaluate: Sequence,
    evaluated_on: str,
    model_score: float | None,
) -> Finding:
    """The label balance and what always predicting the training data's majority class
    scores on the evaluation split, against the fine-tuned model's score."""
    counts = kind.label_counts(train)
    majority = kind.majority(task, labels, list(train), list(evaluate))
    if counts is None or majority is None:
        return not_applicable("balance", f"a {kind.name} task has no classes, so no majority class to score")
    metric = kind.primary_metric
    top, n = next(iter(counts.items()))
    total = sum(counts.values())
    share = n / total
    floor = majority.get(metric)
    shown = ", ".join(f"{label} {percent(c, total)}" for label, c in list(counts.items())[:6])
    figures_ = {
        "train_counts": counts,
        "evaluate_counts": kind.label_counts(evaluate),
        "majority_label": top,
        "majority_share": share,
        "majority_scores": majority,
        "model_score": model_score,
        "metric": metric,
    }
    unit = "labels" if total == len(train) else "tags"  # tagging counts a tag per word
    text = (
        f"train {unit}: {shown}; always predicting {top!r} scores {figures.metric(metric, floor)} "
        f"{figures.name(metric)} on {evaluated_on} (the majority-class score)"
    )
    if model_score is not None and floor is not None and model_score <= floor + 0.01:
        return Finding(
            "balance",
            "problem",
            text
            + f", and the fine-tuned model scores {figures.metric(metric, model_score)}: it learned no more than that",
            "look for the cause in the other findings (learning rate, labels, length, starting point)"
            + ("; weigh the classes or rebalance them" if share >= 0.6 else ""),
            figures_,
        )
    if share >= 0.8:
        others = {k: v for k, v in majority.items() if k != metric}
        return Finding(
            "balance",
            "warning",
            text
            + f": {metric} rewards predicting {top!r}"
            + (
                f" (majority-class {', '.join(f'{k} {figures.metric(k, v)}' for k, v in others.items())})"
                if others
                else ""
            ),
            "judge the model by macro F1 or Matthews correlation, and rebalance or weigh the classes",
            figures_,
        )
    if model_score is not None and floor is not None:
        text += f"; the fine-tuned model scores {figures.metric(metric, model_score)}"
    return Finding("balance", "ok", text, figures=figures_)


def length_finding(
    kind: TaskKind, tokenizer, task, splits: dict[str, Sequence], max_positions: int | None = None
) -> Finding:
    """The share of inputs longer than max_seq_length, per split, and what the model never
    reads; `max_positions`: the model's position embeddings (how far max_seq_length can go)."""
    measured = {split: kind.lengths(tokenizer, list(ex), task) for split, ex in splits.items() if ex}
    if not measured or any(m is None for m in measured.values()):
        return not_applicable("length", f"a {kind.name} task's inputs are not cut by max_seq_length")
    figures_ = {
        split: {
            "inputs": m.inputs,
            "longer": m.longer,
            "cut": m.cut,
            "tokens": m.tokens,
            "cut_tokens": m.cut_tokens,
        }
        for split, m in measured.items()
    }
    figures_["max_seq_length"] = task.max_seq_length
    note = next(iter(measured.values())).note
    longer = sum(m.longer for m in measured.values())
    inputs = sum(m.inputs for m in measured.values())
    cut = sum(m.cut for m in measured.values())
    cut_tokens = [m.cut_tokens for m in measured.values()]
    tokens = sum(m.tokens for m in measured.values())
    parts = ", ".join(f"{m.longer} of {m.inputs} {split}" for split, m in measured.items())
    text = f"inputs longer than max_seq_length {task.max_seq_length} tokens: {parts} ({percent(longer, inputs)})"
    if None not in cut_tokens and sum(cut_tokens):
        text += f"; truncation cuts {sum(cut_tokens):,} of {tokens:,} tokens ({percent(sum(cut_tokens), tokens)})"
    if note:
        text += f" ({note})"
    if cut / max(1, inputs) >= 0.05:
        room = max_positions is not None and max_positions > task.max_seq_length
        advice = f"raise max_seq_length (the model reads up to {max_positions} positions)" if room else ""
        if kind.windowed and task.long_inputs != "windows":
            advice += (" or " if advice else "") + "set long_inputs: windows"
        return Finding("length", "warning", text, advice, figures_)
    return Finding("length", "note" if longer else "ok", text, figures=figures_)
