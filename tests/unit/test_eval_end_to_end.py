"""Every task type fine-tuned end to end on files written here, with a tiny BERT saved to
a temporary folder (random weights, WordPiece vocabulary trained in-process)."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertcore.eval import finetune
from bertcore.eval.embeddings import embedding_report
from bertcore.eval.kinds import KINDS
from bertcore.eval.readers import TextExample
from bertcore.eval.tasks import TaskConfig
from tiny_bert import save_tiny_bert

torch.set_num_threads(1)

ADJECTIVES = ["good", "bad", "long", "short", "funny", "dull", "loud", "quiet", "odd", "fine"]
NOUNS = ["movie", "film", "story", "plot", "actor", "scene", "music", "ending", "script", "cast"]
FILLER = ["the", "a", "was", "really", "quite", "very", "and", "but", "it", "this"]
CITIES = ["Paris", "Berlin", "Seoul", "Lima", "Oslo", "Cairo"]
PEOPLE = ["Alice", "Bob", "Carol", "Dmitri", "Eun", "Farah"]


def _sentence(rng: random.Random, with_good: bool) -> str:
    adjectives = [a for a in ADJECTIVES if a != "good"]
    words = [rng.choice(FILLER), rng.choice(NOUNS), rng.choice(FILLER), rng.choice(adjectives)]
    if with_good:
        words.insert(rng.randrange(len(words) + 1), "good")
    return " ".join(words)


def _corpus() -> list[str]:
    rng = random.Random(0)
    lines = [_sentence(rng, rng.random() < 0.5) for _ in range(100)]
    lines += [f"{p} lives in {c} and {p} likes {c} ." for p in PEOPLE for c in CITIES]
    lines += ["where does Alice live ? who likes Oslo ? what is the answer ?"]
    return lines


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A folder with tokenizer.json and a BertForPreTraining checkpoint, as the pretrain
    stage's model/ folder holds them."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), _corpus(), vocab_size=300)


def _write_tsv(path, header, rows) -> str:
    path.write_text("\n".join("\t".join(map(str, r)) for r in [header, *rows]) + "\n", encoding="utf-8")
    return str(path)


def _good_rows(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        good = i % 2 == 0
        rows.append((_sentence(rng, good), "pos" if good else "neg"))
    rng.shuffle(rows)
    return rows


@pytest.fixture(scope="module")
def good_task(tmp_path_factory) -> TaskConfig:
    folder = tmp_path_factory.mktemp("good")
    return TaskConfig(
        name="contains-good",
        type="classification",
        format="tsv",
        train=_write_tsv(folder / "train.tsv", ("sentence", "label"), _good_rows(1, 64)),
        validation=_write_tsv(folder / "dev.tsv", ("sentence", "label"), _good_rows(2, 32)),
        labels=["neg", "pos"],
        positive_label="pos",
        epochs=8,
        learning_rate=2e-3,
        batch_size=8,
        max_seq_length=32,
        seeds=[1, 2],
    )


def test_classification_learns_a_trivial_rule(tiny_model, good_task):
    result = finetune.run_task(good_task, tiny_model, tiny_model, seed=1, random_init=False)
    scores = result["validation"]
    assert set(scores) >= {"accuracy", "f1", "macro_f1", "mcc"}
    assert scores["accuracy"] >= 0.9, scores
    assert scores["f1"] >= 0.9 and scores["mcc"] >= 0.8
    assert result["train_examples"] == 64 and result["skipped"] == {"train": 0, "validation": 0}


def test_same_seed_same_metrics_and_seeds_differ(tiny_model, good_task):
    quick = good_task.model_copy(update={"epochs": 1})
    a = finetune.run_task(quick, tiny_model, tiny_model, seed=5, random_init=False)
    b = finetune.run_task(quick, tiny_model, tiny_model, seed=5, random_init=False)
    c = finetune.run_task(quick, tiny_model, tiny_model, seed=6, random_init=False)
    assert a["final_train_loss"] == b["final_train_loss"] and a["validation"] == b["validation"]
    assert a["final_train_loss"] != c["final_train_loss"]


def test_random_init_ignores_the_checkpoint_weights(tiny_model):
    torch.manual_seed(123)
    fresh = finetune.load_encoder(tiny_model, random_init=True)
    loaded = finetune.load_encoder(tiny_model)
    saved = finetune.load_encoder(tiny_model)
    same_shapes = {k: v.shape for k, v in fresh.state_dict().items()} == {
        k: v.shape for k, v in loaded.state_dict().items()
    }
    assert same_shapes
    word = "embeddings.word_embeddings.weight"
    assert torch.equal(loaded.state_dict()[word], saved.state_dict()[word])
    assert not torch.allclose(fresh.state_dict()[word], loaded.state_dict()[word])


def test_baseline_comparison_reports_medians_and_gain(tiny_model, good_task):
    quick = good_task.model_copy(update={"epochs": 1})
    out = finetune.compare_with_baseline(quick, tiny_model, tiny_model)
    assert len(out["pretrained"]["runs"]) == len(out["random_init"]["runs"]) == 2
    accuracy = out["pretrained"]["validation"]["accuracy"]
    assert accuracy["min"] <= accuracy["median"] <= accuracy["max"] and accuracy["n"] == 2
    assert out["gain"]["accuracy"] == pytest.approx(
        accuracy["median"] - out["random_init"]["validation"]["accuracy"]["median"]
    )
    assert all(r["random_init"] for r in out["random_init"]["runs"])


def test_freeze_encoder_trains_only_the_head(tiny_model, good_task):
    task = good_task.model_copy(update={"epochs": 1, "freeze_encoder": True})
    tokenizer = finetune.load_tokenizer(tiny_model)
    model = finetune.TaskModel(finetune.load_encoder(tiny_model), KINDS["classification"], 2)
    before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    head_before = model.head.weight.detach().clone()
    examples = [TextExample(s, None, label) for s, label in _good_rows(3, 16)]
    features, _ = task.kind.features(examples, tokenizer, task, ["neg", "pos"])
    finetune._train(model, features, task, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    assert all(torch.equal(before[k], v) for k, v in model.encoder.state_dict().items())
    assert not torch.equal(head_before, model.head.weight)


def test_cross_validation_without_validation_file(tiny_model, tmp_path):
    # The shipped sentiment sample (fastText format, Windows-1252 text), cut to 40 lines.
    import gensim

    sample = os.path.join(os.path.dirname(gensim.__file__), "test", "test_data", "pang_lee_polarity.cor")
    with open(sample, "rb") as f:
        lines = f.readlines()
    (tmp_path / "polarity.txt").write_bytes(b"".join(lines[:20] + lines[-20:]))
    task = TaskConfig(
        name="polarity",
        type="classification",
        format="fasttext",
        train=str(tmp_path / "polarity.txt"),
        encoding="cp1252",
        cross_validation_folds=4,
        epochs=1,
        batch_size=8,
        learning_rate=1e-3,
        max_seq_length=48,
    )
    result = finetune.run_task(task, tiny_model, tiny_model, seed=1, random_init=True)
    assert result["labels"] == ["neg", "pos"] and result["folds"] == 4
    assert 0.0 <= result["validation"]["accuracy"] <= 1.0
    assert -1.0 <= result["validation"]["mcc"] <= 1.0


def test_regression_with_sentence_pairs_and_skipped_rows(tiny_model, tmp_path):
    rng = random.Random(4)
    rows = []
    for _ in range(40):
        a, b = _sentence(rng, False), _sentence(rng, False)
        overlap = len(set(a.split()) & set(b.split()))
        rows.append((a, b, overlap))
    train = _write_tsv(tmp_path / "train.tsv", ("sentence1", "sentence2", "score"), rows[:30])
    dev_path = tmp_path / "dev.tsv"
    _write_tsv(dev_path, ("sentence1", "sentence2", "score"), rows[30:])
    with open(dev_path, "a", encoding="utf-8") as f:
        f.write("only one column\n")
    task = TaskConfig(
        name="overlap",
        type="regression",
        format="tsv",
        train=train,
        validation=str(dev_path),
        text_a="sentence1",
        text_b="sentence2",
        label_column="score",
        epochs=2,
        batch_size=8,
        learning_rate=1e-3,
        max_seq_length=40,
        on_error="skip",
    )
    result = finetune.run_task(task, None, tiny_model, seed=1, random_init=True)
    assert result["skipped"]["validation"] == 1
    assert "line 12" in result["skipped_problems"][0]
    scores = result["validation"]
    assert -1.0 <= scores["pearson"] <= 1.0 and -1.0 <= scores["spearman"] <= 1.0 and scores["mse"] >= 0.0


def _conll(path, sentences) -> str:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in sentences:
        lines += [f"{w} NNP B-NP {t}" for w, t in zip(words, tags)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def _ner_sentences(seed: int, n: int):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        person, city = rng.choice(PEOPLE), rng.choice(CITIES)
        out.append(([person, "lives", "in", city, "."], ["B-PER", "O", "O", "B-LOC", "O"]))
    return out


def test_token_classification_entity_scores(tiny_model, tmp_path):
    task = TaskConfig(
        name="ner",
        type="token_classification",
        format="conll",
        train=_conll(tmp_path / "train.txt", _ner_sentences(1, 40)),
        validation=_conll(tmp_path / "dev.txt", _ner_sentences(2, 12)),
        labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
        epochs=6,
        batch_size=8,
        learning_rate=3e-3,
        max_seq_length=32,
    )
    result = finetune.run_task(task, tiny_model, tiny_model, seed=1, random_init=False)
    scores = result["validation"]
    assert set(scores) == {"precision", "recall", "f1", "token_accuracy"}
    # Position decides the tag in this data, so even a tiny model gets it right.
    assert scores["f1"] >= 0.8, scores


def _squad(path, items) -> str:
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": []}]}
    for qid, question, context, answer in items:
        answers = [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]
        data["data"][0]["paragraphs"].append(
            {
                "context": context,
                "qas": [{"id": qid, "question": question, "answers": answers, "is_impossible": answer is None}],
            }
        )
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def _qa_items(seed: int, n: int, with_impossible: bool):
    rng = random.Random(seed)
    items = []
    for i in range(n):
        person, city, other = rng.choice(PEOPLE), rng.choice(CITIES), rng.choice(CITIES)
        filler = " ".join(_sentence(rng, False) for _ in range(3))
        context = f"{filler} . {person} lives in {city} . {filler}"
        if with_impossible and i % 4 == 0:
            items.append((f"q{seed}-{i}", f"who likes {other} ?", context, None))
        else:
            items.append((f"q{seed}-{i}", f"where does {person} live ?", context, city))
    return items


@pytest.mark.parametrize("version_2", [False, True])
def test_question_answering_runs_over_windows(tiny_model, tmp_path, version_2):
    task = TaskConfig(
        name="qa",
        type="qa",
        format="squad",
        train=_squad(tmp_path / "train.json", _qa_items(1, 48, version_2)),
        validation=_squad(tmp_path / "dev.json", _qa_items(2, 16, version_2)),
        version_2=version_2,
        epochs=3,
        batch_size=8,
        learning_rate=3e-3,
        max_seq_length=32,  # contexts are ~40 tokens: several windows per question
        doc_stride=12,
        max_query_length=10,
        max_answer_length=5,
    )
    result = finetune.run_task(task, tiny_model, tiny_model, seed=1, random_init=False)
    scores = result["validation"]
    assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 1.0
    # The answer is always the word after "lives in", split across windows: learnable
    # only if labels, windows and span decoding line up.
    assert scores["exact_match"] >= 0.75, scores
    if version_2:
        assert scores["no_answer_count"] == 4 and scores["has_answer_count"] == 12
        assert scores["best_f1"] >= scores["f1"] - 1e-9  # the searched threshold can only help
    assert np.isfinite(result["final_train_loss"])


def test_embedding_report_cls_and_mean(tiny_model):
    rng = random.Random(7)
    sentences = [_sentence(rng, rng.random() < 0.5) for _ in range(30)]
    pairs = [TextExample(sentences[i], sentences[i + 1], float(i % 5)) for i in range(0, 20, 2)]
    report = embedding_report(tiny_model, tiny_model, sentences, seed=3, sts_pairs=pairs, num_pairs=200)
    again = embedding_report(tiny_model, tiny_model, sentences, seed=3, sts_pairs=pairs, num_pairs=200)
    assert report == again
    assert set(report) == {"cls", "mean"}
    for entry in report.values():
        assert -1.0 <= entry["anisotropy"] <= 1.0
        assert -1.0 <= entry["sts_spearman"] <= 1.0
    baseline = embedding_report(tiny_model, tiny_model, sentences, seed=3, random_init=True, num_pairs=200)
    assert baseline["mean"]["anisotropy"] != report["mean"]["anisotropy"]


def test_pooling_ignores_padding(tiny_model):
    from bertcore.eval.embeddings import embed

    tokenizer = finetune.load_tokenizer(tiny_model)
    encoder = finetune.load_encoder(tiny_model)
    short, long = "a good film", "the movie was really quite very long and the ending was dull"
    for pooling in ("cls", "mean"):
        alone = embed(encoder, tokenizer, [short], pooling=pooling)
        batched = embed(encoder, tokenizer, [short, long], pooling=pooling)
        assert alone.shape == (1, 32)
        np.testing.assert_allclose(alone[0], batched[0], atol=1e-5)
    assert not np.allclose(
        embed(encoder, tokenizer, [short], pooling="cls"), embed(encoder, tokenizer, [short], pooling="mean")
    )
