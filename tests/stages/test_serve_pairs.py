"""A head fine-tuned on text pairs, end to end: the evaluate stage (on local Ray) fine-tunes
a tiny run's model on a pair task written here and records that the head reads pairs; the
ONNX export traces and checks it on pairs; `bertpipe serve --task` (in-process) answers
/predict on the validation pairs exactly as the evaluate stage predicted them, and refuses
a single text with a 422 that says a pair is needed."""

from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import yaml

from serving import post, serving
from tiny_run import manifest, news_sentences, write_run_root

TASK = "same-topic"
NOUNS = ["film", "story", "plot", "actor", "scene", "music", "ending", "book"]
ADJECTIVES = ["long", "short", "funny", "dull", "loud", "quiet"]


def _pairs(seed: int, n: int) -> list[tuple[str, str, str]]:
    """(a, b, label): "same" when both sentences talk of the same thing."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        noun = rng.choice(NOUNS)
        other = noun if i % 2 == 0 else rng.choice(NOUNS)
        rows.append(
            (
                f"the {noun} was {rng.choice(ADJECTIVES)}",
                f"the {other} seemed {rng.choice(ADJECTIVES)}",
                "same" if other == noun else "different",
            )
        )
    return rows


def _tsv(path, rows) -> str:
    path.write_text("a\tb\tlabel\n" + "".join(f"{a}\t{b}\t{label}\n" for a, b, label in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory, gensim_data, ray_cluster):
    """The tiny run after the evaluate stage fine-tuned the pair task, both models exported
    to ONNX; (root, recipe, task section, the export's manifest)."""
    from bertcore.config import StorageConfig
    from bertcore.eval.config import EvaluateConfig
    from pipelines.export.onnx import export_onnx
    from pipelines.registry import parse_config
    from pipelines.runner import run_stage
    from pipelines.stage_dir import StageDir
    from pipelines.storage import Storage

    root, storage = str(tmp_path_factory.mktemp("pairs-run")), Storage(StorageConfig())
    write_run_root(root, news_sentences(gensim_data), task=None)
    for name, config in (
        ("corpus", {"inputs": ["unused.txt"]}),
        ("examples", {}),
    ):  # what the evaluate stage checks upstream
        directory = StageDir(storage, root, name)
        written = manifest(name, directory.manifest().shards if directory.manifest() else [])
        written.config = config
        directory.write_manifest(written, "")
    files = tmp_path_factory.mktemp("task")
    task = {
        "name": TASK,
        "type": "classification",
        "format": "tsv",
        "text_a": "a",
        "text_b": "b",
        "label_column": "label",
        "train": _tsv(files / "train.tsv", _pairs(1, 64)),
        "validation": _tsv(files / "validation.tsv", _pairs(2, 24)),
        "epochs": 2,
        "batch_size": 8,
        "learning_rate": 1e-3,
        "max_seq_length": 32,
        "seeds": [1],
    }
    evaluate = EvaluateConfig(tasks=[task], baseline=False, intrinsic={"enabled": False}, embeddings={"enabled": False})
    run_stage("evaluate", evaluate, root=root, storage=storage, seed=3, reads=("corpus", "examples", "pretrain"))
    data = {
        "run": {"root": root, "seed": 3},
        "corpus": {"inputs": ["unused.txt"]},
        "serve": {"max_texts": 8, "threads": 1},
    }
    cfg = parse_config(data)
    export_onnx(cfg, storage, task=None, sentences=16)
    _, exported = export_onnx(cfg, storage, task=TASK, sentences=16)
    recipe = files / "serve.yaml"
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    return root, str(recipe), task, exported


def test_the_evaluate_stage_records_a_pair_head_and_the_export_checks_it_on_pairs(run):
    from bertcore.eval.heads import read_head

    root, _, _, exported = run
    head = read_head(os.path.join(root, "eval", "heads", "pretrained", f"{TASK}.safetensors"))
    assert head.pairs is True and head.labels == ["different", "same"]
    assert exported.stats["head"]["pairs"] is True and exported.stats["sample"]["pairs"] is True
    assert exported.stats["checks"]["fp32"]["max_abs_diff"]["logits"] < 1e-3


def test_predict_answers_the_validation_pairs_as_the_evaluate_stage_predicted_them(run):
    from bertcore.eval.config import TaskConfig
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.eval.finetune import predict
    from bertcore.eval.heads import load_task_model
    from bertcore.eval.tasks import read_split

    root, recipe, task_section, _ = run
    model_dir = os.path.join(root, "pretrain", "model")
    task = TaskConfig.model_validate(task_section)
    saved, head = load_task_model(os.path.join(root, "eval", "heads", "pretrained", f"{TASK}.safetensors"), model_dir)
    examples = read_split(task, "validation", head.labels).examples
    tokenizer = load_tokenizer(model_dir)
    features, _ = task.kind.features(examples, tokenizer, task, head.labels)
    torch.set_num_threads(1)
    want = torch.softmax(
        torch.from_numpy(np.stack(predict(saved, task.kind, features, tokenizer.pad_token_id or 0, 64))), -1
    ).numpy()  # the stage's scoring path
    recorded = json.load(open(os.path.join(root, "eval", "metrics.json"), encoding="utf-8"))["tasks"][TASK][
        "pretrained"
    ]["runs"][0]["validation"]["accuracy"]

    with serving(recipe, "--task", TASK) as (url, *_):
        got = []
        for start in range(0, len(examples), 8):
            status, answer = post(
                url + "/predict", {"inputs": [[e.text_a, e.text_b] for e in examples[start : start + 8]]}
            )
            assert status == 200, answer
            got += [{p["label"]: p["score"] for p in predicted} for predicted in answer]
        status, one = post(
            url + "/predict",
            {"inputs": {"text": examples[0].text_a, "text_pair": examples[0].text_b}, "parameters": {}},
        )
        assert status == 200 and one[0][0]["label"] == max(got[0], key=got[0].get)  # Hugging Face's pair shape
        status, refused = post(url + "/predict", {"inputs": examples[0].text_a})
        assert status == 422 and "was fine-tuned on text pairs" in refused["error"], refused

    scores = np.array([[g[label] for label in head.labels] for g in got])
    assert np.abs(scores - want).max() < 1e-4
    accuracy = float(np.mean([head.labels[i] == e.label for i, e in zip(scores.argmax(1), examples)]))
    assert accuracy == pytest.approx(recorded)
