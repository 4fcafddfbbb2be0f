"""The fine-tuning habits of the BERT literature as task options (layer-wise learning-rate
decay, frozen lower layers, dropout, early stopping, pooling, chosen layers and a learned
scalar mix), the floors reported beside each score, and the word-similarity task, on a
tiny BERT saved in-process (random weights, WordPiece vocabulary trained here)."""

from __future__ import annotations

import random

import pytest
import torch

from bertcore.eval import finetune
from bertcore.eval.config import EvaluateConfig, TaskConfig
from bertcore.eval.encoder import (
    Features,
    TaskModel,
    freeze_lower_layers,
    load_encoder,
    load_tokenizer,
    parameter_groups,
    pooler_source,
)
from bertcore.eval.kinds import KINDS
from bertcore.eval.kinds.word_similarity import read_word_pairs
from bertcore.eval.readers import TaskDataError, TextExample
from tiny_bert import save_tiny_bert

torch.set_num_threads(1)

ANIMALS = ["cat", "dog", "horse", "cow", "sheep", "goat"]
TOOLS = ["hammer", "saw", "drill", "wrench", "chisel", "spade"]


def _corpus() -> list[str]:
    rng = random.Random(0)
    lines = [f"the {rng.choice(ANIMALS)} ate the grass and the {rng.choice(ANIMALS)} slept" for _ in range(60)]
    lines += [f"he used a {rng.choice(TOOLS)} and a {rng.choice(TOOLS)} on the wood" for _ in range(60)]
    lines += ["this film was good", "that film was bad", "a good story", "a dull story"]
    return lines


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A 3-layer BertForPreTraining folder with a fast tokenizer, as the pretrain stage writes it."""
    return save_tiny_bert(
        tmp_path_factory.mktemp("tiny_bert_options"), _corpus(), vocab_size=200, layers=3, max_positions=64
    )


def _rows(seed: int, n: int) -> list[tuple[str, str]]:
    """ "animal" sentences against "tool" sentences: learnable from the words alone."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 2:
            rows.append((f"the {rng.choice(ANIMALS)} ate the grass", "animal"))
        else:
            rows.append((f"he used a {rng.choice(TOOLS)} on the wood", "tool"))
    return rows


def _tsv(path, rows) -> str:
    path.write_text("sentence\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> TaskConfig:
    folder = tmp_path_factory.mktemp("kind")
    return TaskConfig(
        name="kind",
        type="classification",
        format="tsv",
        train=_tsv(folder / "train.tsv", _rows(1, 48)),
        validation=_tsv(folder / "dev.tsv", _rows(2, 24)[:20] + [("the cow ate the grass", "animal")] * 4),
        epochs=3,
        learning_rate=3e-3,
        batch_size=8,
        max_seq_length=24,
        seeds=[1],
    )


def _model(tiny_model: str, **features) -> TaskModel:
    torch.manual_seed(0)
    return TaskModel(load_encoder(tiny_model), KINDS["classification"], 2, features=Features(**features))


# -- options --------------------------------------------------------------------------------------


def test_layer_wise_decay_gives_lower_layers_smaller_steps(tiny_model):
    model = _model(tiny_model, pooling="mean")
    groups = parameter_groups(model, 1e-3, 0.01, layer_lr_decay=0.5)
    rate = {id(p): g["lr"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    # 3 layers: embeddings 0.5^4, layer k (0-based) 0.5^(3 - k), the head the full rate.
    assert rate[id(named["encoder.embeddings.word_embeddings.weight"])] == pytest.approx(1e-3 * 0.5**4)
    assert rate[id(named["encoder.encoder.layer.0.attention.self.query.weight"])] == pytest.approx(1e-3 * 0.5**3)
    assert rate[id(named["encoder.encoder.layer.2.output.dense.weight"])] == pytest.approx(1e-3 * 0.5)
    assert rate[id(named["head.weight"])] == pytest.approx(1e-3)
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert (
        decay[id(named["head.bias"])] == 0.0
        and decay[id(named["encoder.encoder.layer.1.output.LayerNorm.weight"])] == 0.0
    )
    assert decay[id(named["head.weight"])] == 0.01
    # Without decay, one rate for everything.
    assert {g["lr"] for g in parameter_groups(model, 1e-3, 0.01)} == {1e-3}


def test_freezing_lower_layers_keeps_them_and_trains_the_rest(tiny_model, task):
    frozen_task = task.model_copy(update={"freeze_layers": 2, "epochs": 1})
    model = _model(tiny_model)
    before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    tokenizer = load_tokenizer(tiny_model)
    examples = [TextExample(a, None, b) for a, b in _rows(3, 16)]
    features, _ = frozen_task.kind.features(examples, tokenizer, frozen_task, ["animal", "tool"])
    finetune._train(model, features, frozen_task, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    after = model.encoder.state_dict()
    unchanged = {k for k in after if torch.equal(before[k], after[k])}
    assert all(k in unchanged for k in after if k.startswith(("embeddings.", "encoder.layer.0.", "encoder.layer.1.")))
    assert not any(k in unchanged for k in after if k.startswith("encoder.layer.2.") and k.endswith("weight"))
    with pytest.raises(ValueError, match="exceeds the encoder's 3 layers"):
        freeze_lower_layers(load_encoder(tiny_model), 4)


def test_dropout_override_reaches_the_encoder(tiny_model):
    encoder = load_encoder(tiny_model, dropout=0.0)
    assert encoder.config.hidden_dropout_prob == 0.0 and encoder.config.attention_probs_dropout_prob == 0.0
    assert load_encoder(tiny_model).config.hidden_dropout_prob == 0.1


@pytest.mark.parametrize(
    "features",
    [
        {"pooling": "mean"},
        {"pooling": "cls", "layers": [-2, -1]},
        {"pooling": "mean", "layers": "all", "combine": "scalar_mix"},
    ],
)
def test_sequence_features_do_not_depend_on_padding(tiny_model, features):
    model = _model(tiny_model, **features).eval()
    tokenizer = load_tokenizer(tiny_model)
    short, long = "the cat slept", "he used a hammer and a saw and a drill on the wood"
    alone = tokenizer([short], return_tensors="pt", return_token_type_ids=True)
    both = tokenizer([short, long], padding=True, return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        a = model(alone["input_ids"], alone["attention_mask"], alone["token_type_ids"])
        b = model(both["input_ids"], both["attention_mask"], both["token_type_ids"])
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-4)
    width = 2 * 32 if features.get("layers") == [-2, -1] else 32
    assert model.head.in_features == width


def test_scalar_mix_learns_its_layer_weights(tiny_model, task):
    mix_task = task.model_copy(
        update={"pooling": "mean", "layers": "all", "combine": "scalar_mix", "freeze_encoder": True, "epochs": 2}
    )
    model = _model(tiny_model, pooling="mean", layers="all", combine="scalar_mix")
    tokenizer = load_tokenizer(tiny_model)
    rows = [TextExample(a, None, b) for a, b in _rows(3, 24)]
    features, _ = mix_task.kind.features(rows, tokenizer, mix_task, ["animal", "tool"])
    finetune._train(model, features, mix_task, tokenizer.pad_token_id, torch.Generator().manual_seed(0))
    assert model.mix.weights.shape == (4,) and not torch.equal(model.mix.weights.detach(), torch.zeros(4))


def test_pooler_without_the_last_layer_is_refused():
    with pytest.raises(ValueError, match="pooler' reads the last layer only"):
        TaskConfig(
            name="t", type="classification", format="tsv", train="t.tsv", cross_validation_folds=2, layers=[-2, -1]
        )


def test_early_stopping_holds_out_part_of_train_and_keeps_the_best_epoch(tiny_model, task):
    stopping = task.model_copy(
        update={"epochs": 30, "early_stopping_patience": 2, "early_stopping_fraction": 0.25, "pooling": "mean"}
    )
    result = finetune.run_task(stopping, tiny_model, tiny_model, seed=1, random_init=False)
    # The held-out quarter is perfectly separable: it reaches its best early, then
    # two epochs without improvement end training long before 30.
    assert result["best_epoch"] is not None and result["epochs_trained"] == result["best_epoch"] + 2 < 30
    assert result["validation"]["accuracy"] >= 0.9
    fit, held = finetune.holdout_split(stopping, [TextExample(a, None, b) for a, b in _rows(1, 48)], 1, "full")
    assert len(held) == 12 and {e.label for e in held} == {"animal", "tool"}
    assert not set(map(id, fit)) & set(map(id, held)) and len(fit) + len(held) == 48
    with pytest.raises(TaskDataError, match="too few training examples"):
        finetune.holdout_split(stopping, [TextExample("a", None, "animal")], 1, "full")


def test_result_has_the_majority_class_floor_and_the_pooler_source(tiny_model, task):
    result = finetune.run_task(task.model_copy(update={"epochs": 1}), tiny_model, tiny_model, seed=1, random_init=True)
    # validation: 10 animal + 10 tool + 4 animal; train's majority (a tie, broken by name) is "animal"
    assert result["baselines"]["validation"]["majority"]["accuracy"] == pytest.approx(14 / 24)
    assert result["baselines"]["validation"]["majority"]["mcc"] == 0.0
    assert result["pooler"] == "fresh" and pooler_source(tiny_model) == "pretrained"
    assert result["device"] == "cpu"


# -- word similarity ------------------------------------------------------------------------------


def _pairs(path) -> str:
    lines = [
        "# word1\tword2\tscore",
        "cat\tdog\t8.0",
        "hammer\tsaw\t7.5",
        "cat\thammer\t1.0",
        "dog\tspade\t0.5",
        "horse\tcow\t8.5",
        "",
        "goat drill 1.2",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_word_pairs_reader_skips_comments_and_names_bad_lines(tmp_path):
    read = read_word_pairs(_pairs(tmp_path / "pairs.txt"))
    assert [(p.a, p.b, p.score) for p in read.examples][:2] == [("cat", "dog", 8.0), ("hammer", "saw", 7.5)]
    assert len(read.examples) == 6  # tab or space separated
    (tmp_path / "bad.txt").write_text("cat\tdog\tvery\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"bad\.txt, line 1: score 'very' is not a number"):
        read_word_pairs(str(tmp_path / "bad.txt"))


@pytest.mark.parametrize("vectors", ["input", "contextual"])
def test_word_similarity_scores_the_encoder_without_training(tiny_model, tmp_path, vectors):
    task = TaskConfig(
        name="sim",
        type="word_similarity",
        format="word_pairs",
        validation=_pairs(tmp_path / "p.txt"),
        word_vectors=vectors,
    )
    first = finetune.run_task(task, tiny_model, tiny_model, seed=1, random_init=False)
    again = finetune.run_task(task, tiny_model, tiny_model, seed=2, random_init=False)
    assert first["validation"] == again["validation"]  # nothing trained: the seed does not matter
    assert -1.0 <= first["validation"]["spearman"] <= 1.0
    assert first["word_pairs"] == {"pairs": 6, "words": 9, "unknown_words": 0}
    randoms = [
        finetune.run_task(task, tiny_model, tiny_model, seed=s, random_init=True)["validation"]["spearman"]
        for s in (1, 2)
    ]
    assert randoms[0] != randoms[1]  # fresh weights per seed: the spread of the baseline


def test_word_similarity_config_is_checked():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="scored on its `validation` file"):
        TaskConfig(name="s", type="word_similarity", format="word_pairs", train="x.txt", validation="y.txt")
    with pytest.raises(ValidationError, match="trains nothing"):
        TaskConfig(name="s", type="word_similarity", format="word_pairs", validation="y.txt", combine="scalar_mix")
    cfg = EvaluateConfig(
        tasks=[
            {
                "name": "simlex",
                "type": "word_similarity",
                "format": "word_pairs",
                "validation": "{demo_data}/simlex999.txt",
            }
        ]
    )
    assert cfg.tasks[0].validation.endswith("simlex999.txt")


def test_fine_tuning_runs_on_the_device_the_process_has(tiny_model, task):
    """On a GPU machine (a Ray job given evaluate.num_gpus) fine-tuning runs on CUDA, on a
    CPU-only one on the CPU; the result records which, and scores the same way either way."""
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    result = finetune.run_task(task.model_copy(update={"epochs": 1}), tiny_model, tiny_model, seed=1, random_init=False)
    assert result["device"] == expected
    assert 0.0 <= result["validation"]["accuracy"] <= 1.0 and result["epochs_trained"] == 1
