"""`bertpipe diagnose`'s findings (bertcore/eval/diagnosis/) on task files written here with
planted faults, fine-tuning a tiny BERT saved to a temporary folder: flipped labels ranked
above clean rows, validation rows copied into the training file counted exactly, inputs
over max_seq_length counted, a single-class-heavy file's majority-class score, a learning
rate of 1e-2 named as too high; and every task kind diagnosed, saying what does not apply.
One diagnosis of the planted file serves the tests that read it."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertcore.eval.config import TaskConfig
from bertcore.eval.diagnosis import data, files
from bertcore.eval.diagnosis.findings import SEVERITIES
from bertcore.eval.diagnosis.run import Options, diagnose
from bertcore.eval.tasks import fold_splits, read_split
from tiny_bert import save_tiny_bert

torch.set_num_threads(1)

ADJECTIVES = ["bad", "long", "short", "funny", "dull", "loud", "quiet", "odd", "fine"]
NOUNS = ["movie", "film", "story", "plot", "actor", "scene", "music", "ending", "script", "cast"]
FILLER = ["the", "a", "was", "really", "quite", "very", "and", "but", "it", "this"]
CITIES = ["Paris", "Berlin", "Seoul", "Lima", "Oslo", "Cairo"]
PEOPLE = ["Alice", "Bob", "Carol", "Dmitri", "Eun", "Farah"]
WORDS = [*FILLER, *NOUNS, *ADJECTIVES, "good", *(w.lower() for w in PEOPLE + CITIES)]
WORDS += ["lives", "in", "where", "does", "live", "we", "saw", ".", "?"]
"""The tiny model's vocabulary: every word the tests write, fixed (a trained one varies between processes)."""
EVERY_FINDING = {
    "leakage",
    "rows",
    "balance",
    "length",
    "suspect_labels",
    "learning_rate",
    "loss_curve",
    "early_stopping",
    "pipeline",
    "forgetting",
    "starting_point",
    "errors",
    "seeds",
}


def sentence(rng: random.Random, good: bool) -> str:
    """A review whose label is whether it says "good" (a rule a tiny model learns)."""
    words = [rng.choice(FILLER), rng.choice(NOUNS), rng.choice(FILLER), rng.choice(ADJECTIVES), rng.choice(NOUNS)]
    if good:
        words.insert(rng.randrange(len(words) + 1), "good")
    return " ".join(words)


def rows(seed: int, n: int, positive: float = 0.5) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        good = rng.random() < positive
        out.append((sentence(rng, good), "pos" if good else "neg"))
    return out


def write_tsv(path, table) -> str:
    path.write_text("sentence\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in table), encoding="utf-8")
    return str(path)


def corpus() -> list[str]:
    rng = random.Random(0)
    lines = [sentence(rng, rng.random() < 0.5) for _ in range(150)]
    return lines + [f"{p} lives in {c} . where does {p} live ?" for p in PEOPLE for c in CITIES]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), corpus(), vocab_size=200, words=WORDS)


FLIPPED = 12
COPIED = 6
LONG = 5


@pytest.fixture(scope="module")
def planted(tmp_path_factory, tiny_model):
    """A training file of 120 reviews with 12 labels flipped (known rows), 6 validation rows
    copied in (one of them upper-cased with doubled spaces) and 5 reviews longer than
    max_seq_length; diagnosed once."""
    folder = tmp_path_factory.mktemp("planted")
    train, validation = rows(1, 120), rows(2, 40)
    flipped = set(random.Random(3).sample(range(len(train)), FLIPPED))
    train = [
        (text, {"pos": "neg", "neg": "pos"}[label] if i in flipped else label) for i, (text, label) in enumerate(train)
    ]
    rng = random.Random(4)
    for i in range(LONG):  # 5 x 6 words of padding: longer than 16 pieces
        text, label = train[i]
        train[i] = (text + " " + " ".join(sentence(rng, False) for _ in range(5)), label)
    copies = [validation[i] for i in range(COPIED)]
    copies[0] = ("  ".join(copies[0][0].upper().split()), copies[0][1])  # the same row after case and whitespace
    task = TaskConfig(
        name="planted",
        type="classification",
        format="tsv",
        train=write_tsv(folder / "train.tsv", train + copies),
        validation=write_tsv(folder / "dev.tsv", validation),
        epochs=6,
        batch_size=8,
        learning_rate=2e-3,
        max_seq_length=16,
        seeds=[1],
    )
    options = Options(folds=3, learning_rates=(), worst=5)
    diagnosis = diagnose(task, tiny_model, options=options)
    out = folder / "out"
    written = files.write(diagnosis, str(out))
    return diagnosis, flipped, out, written


def finding(diagnosis, name):
    return next(f for f in diagnosis.findings if f.name == name)


def test_flipped_labels_rank_above_clean_rows(planted):
    diagnosis, flipped, out, _ = planted
    top = [s.row for s in diagnosis.suspects[:FLIPPED]]
    precision = len(set(top) & flipped) / FLIPPED
    print(f"suspect labels: top-{FLIPPED} precision against the {FLIPPED} flipped rows: {precision:.2f}")
    assert precision >= 0.7, (top, sorted(flipped))
    # suspect_labels.tsv: a 0-based training row, the given and predicted labels and the score, most suspect first
    lines = (out / "suspect_labels.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t") == ["row", "given", "predicted", "score", "flagged", "text"]
    first = lines[1].split("\t")
    assert int(first[0]) == top[0] and first[1] != first[2]
    scores = [float(line.split("\t")[3]) for line in lines[1:]]
    assert scores == sorted(scores) and len(scores) == 120 + COPIED
    counted = finding(diagnosis, "suspect_labels")
    assert counted.severity == "problem" and counted.figures["flagged"] >= FLIPPED // 2
    assert "likely mislabelled" in counted.text and counted.advice


def test_copied_validation_rows_are_counted_exactly(planted):
    diagnosis, _, out, _ = planted
    leakage = finding(diagnosis, "leakage")
    assert leakage.severity == "problem" and leakage.figures["exact"] == COPIED and leakage.figures["near"] == 0
    assert f"{COPIED} exact and 0 near copies" in leakage.text
    leaked = (out / "leaked_rows.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert sorted(int(line.split("\t")[1]) for line in leaked) == list(range(COPIED))  # validation rows 0-5
    assert sorted(int(line.split("\t")[2]) for line in leaked) == list(range(120, 120 + COPIED))


def test_inputs_over_max_seq_length_are_counted(planted):
    length = finding(planted[0], "length")
    assert length.figures["train"]["longer"] == LONG and length.figures["validation"]["longer"] == 0
    assert f"{LONG} of {120 + COPIED} train, 0 of 40 validation" in length.text
    assert length.figures["train"]["cut_tokens"] > 0


def test_every_finding_is_made_worst_first_and_written(planted):
    diagnosis, _, out, written = planted
    assert {f.name for f in diagnosis.findings} == EVERY_FINDING
    order = [SEVERITIES.index(f.severity) for f in diagnosis.findings]
    assert order == sorted(order)
    assert diagnosis.fits == 1 + 1 + 3  # the seed, random init, the folds
    for name in ("diagnosis.md", "diagnosis.json", "lr_sweep.png", "loss_curve.png", "confusion.png", "per_class.tsv"):
        assert name in written
    saved = json.loads((out / "diagnosis.json").read_text(encoding="utf-8"))
    assert [f["name"] for f in saved["findings"]] == [f.name for f in diagnosis.findings]
    report = (out / "diagnosis.md").read_text(encoding="utf-8")
    assert "## Findings, worst first" in report and "![learning-rate sweep](lr_sweep.png)" in report


def test_a_single_class_heavy_file_reports_the_majority_score(tmp_path):
    task = TaskConfig(
        name="heavy",
        type="classification",
        format="tsv",
        train=write_tsv(tmp_path / "train.tsv", rows(5, 100, positive=0.9)),
        validation=write_tsv(
            tmp_path / "dev.tsv", [(f"x {i}", "pos") for i in range(18)] + [("y", "neg"), ("z", "neg")]
        ),
    )
    train, validation = read_split(task, "train").examples, read_split(task, "validation").examples
    labels = ["neg", "pos"]
    found = data.balance_finding(task.kind, task, labels, train, validation, "the validation file", None)
    assert found.severity == "warning" and found.figures["majority_label"] == "pos"
    assert "always predicting 'pos' scores 90.0% accuracy" in found.text and "majority-class score" in found.text
    at_floor = data.balance_finding(task.kind, task, labels, train, validation, "the validation file", 0.9)
    assert at_floor.severity == "problem" and "learned no more than that" in at_floor.text


def test_a_learning_rate_of_1e_2_is_named_too_high(tmp_path_factory):
    """A wider tiny BERT (hidden 256) without warm-up, where 1e-2 fails for every seed tried
    (1 to 5: 25% accuracy, the training loss stuck near 0.7) and 1e-3 learns (100%)."""
    folder = tmp_path_factory.mktemp("high")
    model = save_tiny_bert(folder / "model", corpus(), vocab_size=200, hidden=256, words=WORDS)
    task = TaskConfig(
        name="high",
        type="classification",
        format="tsv",
        train=write_tsv(folder / "train.tsv", rows(6, 80)),
        validation=write_tsv(folder / "dev.tsv", rows(7, 24)),
        epochs=6,
        batch_size=8,
        learning_rate=1e-2,
        warmup_fraction=0.0,
        max_seq_length=16,
        seeds=[1],
    )
    diagnosis = diagnose(task, model, options=Options(folds=2, learning_rates=(1e-3,)))
    found = finding(diagnosis, "learning_rate")
    assert found.severity in ("problem", "warning"), found.line()
    assert found.text.startswith("learning_rate 0.01 is too high"), found.text
    assert found.advice == "set learning_rate to 1e-3"


def _conll(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        person, city = rng.choice(PEOPLE), rng.choice(CITIES)
        lines += [f"{person} B-PER", "lives O", "in O", f"{city} B-LOC", ". O", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def _squad(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        person, city = rng.choice(PEOPLE), rng.choice(CITIES)
        context = f"{sentence(rng, False)} . {person} lives in {city} . {sentence(rng, True)}"
        qa = {"id": f"q{seed}-{i}", "question": f"where does {person} live ?"}
        qa["answers"] = [{"text": city, "answer_start": context.index(f"in {city}") + 3}]
        paragraphs.append({"context": context, "qas": [qa]})
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}), encoding="utf-8")
    return str(path)


def _choices(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        right = rng.randrange(3)
        row = {"context": f"we saw the {rng.choice(NOUNS)} .", "label": right}
        row |= {f"ending{k}": sentence(rng, k == right) for k in range(3)}
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _pairs(path, n: int, seed: int) -> str:
    rng = random.Random(seed)
    table = []
    for _ in range(n):
        a, b = sentence(rng, False), sentence(rng, False)
        table.append(f"{a}\t{b}\t{len(set(a.split()) & set(b.split()))}")
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(table) + "\n", encoding="utf-8")
    return str(path)


def _kind_task(kind: str, folder) -> TaskConfig:
    common = {"name": kind, "type": kind, "epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "seeds": [1]}
    if kind == "regression":
        files_ = {"train": _pairs(folder / "train.tsv", 24, 1), "validation": _pairs(folder / "dev.tsv", 8, 2)}
        return TaskConfig(
            **common, **files_, format="tsv", text_a="sentence1", text_b="sentence2", label_column="score"
        )
    if kind == "token_classification":
        files_ = {"train": _conll(folder / "train.txt", 24, 1), "validation": _conll(folder / "dev.txt", 8, 2)}
        return TaskConfig(**common, **files_, format="conll", max_seq_length=16)
    if kind == "qa":
        files_ = {"train": _squad(folder / "train.json", 16, 1), "validation": _squad(folder / "dev.json", 6, 2)}
        return TaskConfig(**common, **files_, format="squad", max_seq_length=32, doc_stride=12, max_query_length=10)
    if kind == "multiple_choice":
        files_ = {"train": _choices(folder / "train.jsonl", 24, 1)}
        return TaskConfig(
            **common,
            **files_,
            format="jsonl",
            text_a="context",
            choices=["ending0", "ending1", "ending2"],
            cross_validation_folds=3,
        )
    pairs = folder / "pairs.txt"
    pairs.write_text(
        "".join(
            f"{a} {b} {s}\n"
            for a, b, s in [
                ("good", "fine", 8),
                ("bad", "dull", 6),
                ("film", "movie", 9),
                ("loud", "quiet", 1),
                ("story", "plot", 7),
            ]
        )
    )
    return TaskConfig(name=kind, type=kind, format="word_pairs", validation=str(pairs), seeds=[1, 2, 3])


@pytest.mark.parametrize("kind", ["regression", "token_classification", "qa", "multiple_choice", "word_similarity"])
def test_every_kind_is_diagnosed_and_says_what_does_not_apply(tiny_model, tmp_path, kind):
    task = _kind_task(kind, tmp_path)
    diagnosis = diagnose(task, tiny_model, options=Options(folds=2, learning_rates=(), worst=3))
    found = {f.name: f for f in diagnosis.findings}
    assert set(found) == EVERY_FINDING, kind
    written = files.write(diagnosis, str(tmp_path / "out"))
    assert "diagnosis.md" in written and "diagnosis.json" in written
    if kind == "word_similarity":  # nothing is fine-tuned: the rank test against random draws, the rest does not apply
        assert found["starting_point"].severity in ("ok", "warning")
        assert all(
            found[name].severity == "n/a" for name in ("suspect_labels", "learning_rate", "forgetting", "errors")
        )
        return
    # every training row judged out of fold, once
    train_rows = {"regression": 24, "token_classification": 24, "qa": 16, "multiple_choice": 24}[kind]
    assert found["suspect_labels"].severity != "n/a" and sorted(s.row for s in diagnosis.suspects) == list(
        range(train_rows)
    )
    assert found["learning_rate"].severity != "n/a" and diagnosis.fits == 1 + 1 + 2  # a seed, random init, 2 folds
    if kind == "regression":  # the largest out-of-fold residuals; no classes to balance
        assert diagnosis.suspect_score.startswith("out-of-fold residual") and found["balance"].severity == "n/a"
        assert abs(diagnosis.suspects[0].score) >= abs(diagnosis.suspects[-1].score)
    if kind == "token_classification":  # tags per word: a token-level view and a tag-level confusion
        assert diagnosis.classes and "B-PER" in diagnosis.classes and diagnosis.confusion is not None
        assert all(" " in w.view for w in diagnosis.worst)
    if kind == "qa":  # spans: ranked by F1, the predicted span shown; contexts read in windows
        assert diagnosis.suspect_score.startswith("out-of-fold F1") and diagnosis.confusion is None
        assert "nothing cut" in found["length"].text
    if kind == "multiple_choice":  # cross-validated: leakage across folds, the candidates in view
        assert "cross-validation fold 1" in diagnosis.evaluated_on and diagnosis.classes == ["0", "1", "2"]
        assert diagnosis.worst[0].view.startswith("0: ")
        held = fold_splits(task, read_split(task, "train").examples)[0][1]
        assert {w.row for w in diagnosis.worst} <= set(held)  # rows of the training file, not of the fold
