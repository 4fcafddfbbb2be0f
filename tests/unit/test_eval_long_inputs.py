"""Inputs longer than the window (`long_inputs: windows`): how an input is cut into
windows, how their vectors are pooled, sentence embeddings over windows, and a real
fine-tune of a tiny BERT on long documents whose label only their second half decides,
where reading windows beats truncation by more than the seed spread."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from bertcore.eval import finetune
from bertcore.eval.config import EmbeddingsConfig, TaskConfig
from bertcore.eval.embeddings import embed
from bertcore.eval.encoder import Features, TaskModel, load_encoder, load_tokenizer, mean_pool
from bertcore.eval.readers import TextExample
from bertcore.eval.windows import Windowing, long_input_counts, pool_windows, split_windows
from tiny_bert import save_tiny_bert

torch.set_num_threads(1)

FILLER = ["river", "stone", "table", "window", "cloud", "paper", "garden", "road", "chair", "lamp", "door", "field"]
POSITIVE = ["bright", "happy", "great"]
NEGATIVE = ["gloomy", "awful", "sad"]
WINDOW = 32
"""max_seq_length of the tests: 30 text tokens and [CLS], [SEP]."""
FILLER_WORDS, TAIL_WORDS = 44, 20
"""A document: 44 neutral words (more than a window holds), then 20 words, 4 of them
the label's. Every word is one token in the test's vocabulary."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    lines = [" ".join(FILLER + POSITIVE + NEGATIVE)] * 5 + [" ".join(FILLER)]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert_long"), lines, vocab_size=200, layers=2, max_positions=64)


def _document(rng: random.Random, label: str) -> str:
    tail = [rng.choice(FILLER) for _ in range(TAIL_WORDS)]
    for i in rng.sample(range(TAIL_WORDS), 4):
        tail[i] = rng.choice(POSITIVE if label == "pos" else NEGATIVE)
    return " ".join([rng.choice(FILLER) for _ in range(FILLER_WORDS)] + tail)


def _tsv(path, seed: int, n: int) -> str:
    rng = random.Random(seed)
    rows = [(_document(rng, label), label) for label in ("neg", "pos") * (n // 2)]
    path.write_text("sentence\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def long_task(tmp_path_factory) -> TaskConfig:
    folder = tmp_path_factory.mktemp("long_docs")
    return TaskConfig(
        name="long_docs",
        type="classification",
        format="tsv",
        train=_tsv(folder / "train.tsv", 1, 48),
        validation=_tsv(folder / "dev.tsv", 2, 64),
        epochs=4,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_length=WINDOW,
        pooling="mean",
        seeds=[1, 2, 3],
    )


# -- windows and pooling --------------------------------------------------------------------------


def test_windows_cover_every_token_each_framed_and_stride_apart(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    text = " ".join(FILLER * 5)  # 60 one-token words
    pieces = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = split_windows(tokenizer, text, None, Windowing(WINDOW, 10, "mean", 16))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert all(len(w) <= WINDOW and w[0] == cls and w[-1] == sep for w in windows.input_ids)
    texts = [w[1:-1] for w in windows.input_ids]
    assert [t == pieces[10 * i : 10 * i + len(t)] for i, t in enumerate(texts)] == [True] * len(
        texts
    )  # 10 tokens apart
    assert (
        texts[-1][-1] == pieces[-1] and not windows.cut and len(texts) == 4
    )  # starts 0, 10, 20, 30: the last reaches the end
    # Default stride: half a window's text; at most max_windows, and the rest is said to be cut.
    halves = split_windows(tokenizer, text, None, Windowing(WINDOW, None, "mean", 16)).input_ids
    assert halves[1][1:16] == halves[0][16:31]
    capped = split_windows(tokenizer, text, None, Windowing(WINDOW, 10, "mean", 2))
    assert len(capped.input_ids) == 2 and capped.cut
    # A stride longer than a window's text is shortened to it: no token is skipped.
    assert sum(
        len(w) - 2 for w in split_windows(tokenizer, text, None, Windowing(WINDOW, 100, "mean", 16)).input_ids
    ) == len(pieces)


def test_a_pair_repeats_its_first_text_and_windows_the_second(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    windows = split_windows(tokenizer, "bright happy", " ".join(FILLER * 3), Windowing(WINDOW, 12, "mean", 16))
    first = tokenizer("bright happy", add_special_tokens=False)["input_ids"]
    assert len(windows.input_ids) > 1
    for ids, types in zip(windows.input_ids, windows.token_type_ids):
        assert ids[1 : 1 + len(first)] == first and ids[1 + len(first)] == tokenizer.sep_token_id
        assert types.count(0) == len(first) + 2 and len(ids) <= WINDOW
    # A first text longer than half the window is cut to half, so the second still has room.
    long_first = split_windows(tokenizer, " ".join(FILLER * 4), "river stone", Windowing(WINDOW, 12, "mean", 16))
    assert long_first.token_type_ids[0].count(0) == (WINDOW - 3) // 2 + 2


def test_pooling_the_windows_of_each_input():
    vectors = torch.tensor(
        [[1.0, -2.0], [3.0, 4.0], [5.0, 0.0], [-1.0, 7.0], [2.0, 2.0], [0.0, -6.0]], requires_grad=True
    )
    owner = torch.tensor([0, 0, 0, 1, 2, 2])
    torch.testing.assert_close(
        pool_windows(vectors, owner, "mean"), torch.tensor([[3.0, 2 / 3], [-1.0, 7.0], [1.0, -2.0]])
    )
    torch.testing.assert_close(pool_windows(vectors, owner, "max"), torch.tensor([[5.0, 4.0], [-1.0, 7.0], [2.0, 2.0]]))
    torch.testing.assert_close(
        pool_windows(vectors, owner, "first"), torch.tensor([[1.0, -2.0], [-1.0, 7.0], [2.0, 2.0]])
    )
    pool_windows(vectors, owner, "max").sum().backward()  # the gradient reaches each input's largest window
    assert vectors.grad.tolist() == [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("pool", ["mean", "max", "first"])
def test_a_windowed_input_scores_the_same_alone_or_in_a_batch(tiny_model, long_task, pool):
    """The windows of one input never mix with another's: padding, other inputs and their
    windows leave an input's logits as they were."""
    task = long_task.model_copy(update={"long_inputs": "windows", "window_pool": pool})
    tokenizer = load_tokenizer(tiny_model)
    rng = random.Random(3)
    examples = [
        TextExample(_document(rng, "pos"), None, "pos"),
        TextExample("river stone", None, "neg"),
        TextExample(_document(rng, "neg") * 2, None, "neg"),
    ]
    features, _ = task.kind.features(examples, tokenizer, task, ["neg", "pos"])
    assert [len(f.windows.input_ids) for f in features] == [4, 1, 8]
    torch.manual_seed(0)
    model = TaskModel(
        load_encoder(tiny_model), task.kind, 2, features=Features(pooling="mean"), window_pool=pool
    ).eval()
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        together = model(**{k: v for k, v in task.kind.batch(features, pad).items() if k != "labels"})
        for i, feature in enumerate(features):
            alone = model(**{k: v for k, v in task.kind.batch([feature], pad).items() if k != "labels"})
            torch.testing.assert_close(together[i], alone[0], atol=1e-5, rtol=1e-4)


def test_long_inputs_are_counted_whether_truncated_or_windowed(tiny_model, long_task):
    tokenizer = load_tokenizer(tiny_model)
    texts = [_document(random.Random(i), "pos") for i in range(3)] + ["river stone"]
    assert long_input_counts(tokenizer, texts, None, long_task) == {"inputs": 4, "longer": 3, "cut": 0}
    capped = long_task.model_copy(update={"long_inputs": "windows", "window_stride": 10, "max_windows": 3})
    assert long_input_counts(tokenizer, texts, None, capped) == {
        "inputs": 4,
        "longer": 3,
        "cut": 3,
    }  # 64 tokens need 5 windows of 30, 10 apart


def test_windows_are_for_sequence_tasks():
    with pytest.raises(ValidationError, match="long_inputs windows is for classification and regression"):
        TaskConfig(
            name="t",
            type="token_classification",
            format="conll",
            train="t.txt",
            validation="d.txt",
            long_inputs="windows",
        )
    assert (
        TaskConfig(
            name="t", type="regression", format="tsv", train="t.tsv", validation="d.tsv", long_inputs="windows"
        ).window_pool
        == "mean"
    )


def test_sentence_embeddings_pool_the_windows_of_a_long_sentence(tiny_model):
    tokenizer, encoder = load_tokenizer(tiny_model), load_encoder(tiny_model).eval()
    long, short = " ".join(FILLER * 5), "river stone table"
    spec = Windowing.of(EmbeddingsConfig(max_seq_length=WINDOW, long_inputs="windows", window_stride=10))
    windowed = embed(encoder, tokenizer, [long, short], pooling="mean", max_seq_length=WINDOW, windowing=spec)
    truncated = embed(encoder, tokenizer, [long, short], pooling="mean", max_seq_length=WINDOW)
    # A short sentence is one window: the same vector either way.
    np.testing.assert_allclose(windowed[1], truncated[1], atol=1e-5)
    # A long one: the mean of its windows' mean-pooled vectors, each computed alone.
    by_hand = []
    with torch.no_grad():
        for ids in split_windows(tokenizer, long, None, spec).input_ids:
            ids_t = torch.tensor([ids])
            hidden = encoder(
                input_ids=ids_t, attention_mask=torch.ones_like(ids_t), token_type_ids=torch.zeros_like(ids_t)
            ).last_hidden_state
            by_hand.append(mean_pool(hidden, torch.ones_like(ids_t))[0].numpy())
    np.testing.assert_allclose(windowed[0], np.mean(by_hand, axis=0), atol=1e-5)
    assert not np.allclose(windowed[0], truncated[0], atol=1e-3)


# -- the acceptance: a real fine-tune on long documents ----------------------------------------------


def test_windows_beat_truncation_when_only_the_second_half_decides(tiny_model, long_task):
    tokenizer = load_tokenizer(tiny_model)
    signal = set(tokenizer.convert_tokens_to_ids(POSITIVE + NEGATIVE))
    documents = [TextExample(_document(random.Random(i), "pos"), None, "pos") for i in range(8)]
    truncated, _ = long_task.kind.features(documents, tokenizer, long_task, ["neg", "pos"])
    assert all(
        len(f.input_ids) == WINDOW and not signal & set(f.input_ids) for f in truncated
    )  # truncation never sees a label word

    scores = {}
    for mode in ("truncate", "windows"):
        task = long_task.model_copy(update={"long_inputs": mode})
        runs = [finetune.run_task(task, tiny_model, tiny_model, seed, random_init=False) for seed in task.seeds]
        scores[mode] = [run["validation"]["accuracy"] for run in runs]
        assert runs[0]["long_inputs"] == {
            "train": {"inputs": 48, "longer": 48, "cut": 0},
            "validation": {"inputs": 64, "longer": 64, "cut": 0},
        }
    spread = max(max(s) - min(s) for s in scores.values())
    gain = float(np.median(scores["windows"]) - np.median(scores["truncate"]))
    assert gain > spread, scores
    assert all(abs(accuracy - 0.5) <= 0.15 for accuracy in scores["truncate"]), (
        scores
    )  # at chance: the first window is filler


def test_the_report_says_per_task_how_many_inputs_were_longer_than_the_window(long_task):
    from bertcore.eval import report
    from bertcore.eval.summary import task_entry

    counts = {"train": {"inputs": 48, "longer": 48, "cut": 0}, "validation": {"inputs": 64, "longer": 60, "cut": 2}}
    run = {
        "seed": 1,
        "labels": ["neg", "pos"],
        "train_examples": 48,
        "validation": {"accuracy": 0.9},
        "long_inputs": counts,
        "skipped": {"train": 0},
        "skipped_problems": [],
    }
    tasks = {
        mode: task_entry(long_task.model_copy(update={"long_inputs": mode, "max_windows": 3}), {"pretrained": [run]})
        for mode in ("truncate", "windows")
    }
    assert tasks["windows"]["long_inputs"]["splits"] == counts and tasks["windows"]["long_inputs"]["mode"] == "windows"
    metrics = {
        "tasks": tasks,
        "verdicts": [],
        "skipped_rows": {"total": 0, "files": {}},
        "embeddings": {
            "sentences": 10,
            "sts_pairs": 0,
            "long_inputs": {"mode": "windows", "max_seq_length": 128, "inputs": 10, "longer": 1, "cut": 0},
        },
    }
    md = report.render_markdown(metrics, {})
    assert (
        "- truncate: 48 of 48 train, 60 of 64 validation inputs longer than 32 tokens; truncated to it "
        "(long_inputs: windows reads them whole)"
    ) in md
    assert (
        "- windows: 48 of 48 train, 60 of 64 validation inputs longer than 32 tokens; read in windows half a "
        "window apart, mean-pooled (2 still cut after 3 windows)"
    ) in md
    assert "1 of the 10 sentences (STS included) were longer than 128 tokens: read in windows." in md
