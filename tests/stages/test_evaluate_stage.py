"""The evaluate stage on local Ray: every task type end to end on files written here, the
baseline and the MLM sanity check on a model trained briefly on the demo examples, bad
input surfacing as one-line errors or counted skips, S3 task files, re-runs, and the
Prefect artifacts."""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from bertcore import figures
from bertcore.config import StorageConfig, resolved_yaml
from bertcore.errors import BertpipeError, ConfigError, InputDataError
from bertcore.eval.config import EvaluateConfig
from flows.artifacts import publish_stage
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline, run_stage
from pipelines.stage_dir import Manifest, StageDir
from pipelines.storage import Storage

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVAL_DIR = "eval"
TRAIN_STEPS = 30
"""Optimizer steps of the tiny model: enough to learn the frequent tokens, which is all the sanity check needs."""


def evaluate(cfg: EvaluateConfig, root: str, storage: Storage, seed: int, force: bool = False) -> tuple[Manifest, bool]:
    """The evaluate stage on this section alone."""
    return run_stage("evaluate", cfg, root=root, storage=storage, seed=seed, force=force)


# -- upstream: the demo's corpus, vocab and examples plus a briefly trained tiny model -------------


def _train_tiny_model(root: str, steps: int) -> list[dict]:
    """Train bertcore's tiny BERT on the demo's seq128 examples and export it as the pretrain
    stage would (model/ in the Hugging Face layout, metrics.jsonl); returns the log."""
    import safetensors.torch

    from bertcore.model.bert import BertForPreTraining, ModelConfig
    from bertcore.train.loader import ExamplesLoader

    vocab_dir = os.path.join(root, "vocab")
    with open(os.path.join(vocab_dir, "vocab.txt"), encoding="utf-8") as handle:
        size = len(handle.read().rstrip("\n").split("\n"))
    cfg = ModelConfig.named("tiny", vocab_size=size, max_position_embeddings=128)
    model = BertForPreTraining(cfg, generator=torch.Generator().manual_seed(0))
    loader = ExamplesLoader(
        sorted(glob.glob(os.path.join(root, "examples/seq128/train/*.arrow"))), 16, seed=1, pad_id=cfg.pad_token_id
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    records = []
    try:
        model.train()
        for step, batch in zip(range(1, steps + 1), iter(loader)):
            out = model(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                labels=batch["labels"],
                next_sentence_label=batch["next_sentence_label"],
            )
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            accuracy = int(out.mlm_correct) / max(1, int(out.mlm_count))
            records.append(
                {"step": step, "loss": out.loss.item(), "mlm_accuracy": accuracy, "phase": "seq128", "lr": 2e-3}
            )
    finally:
        torch.set_num_threads(threads)
    model_dir = os.path.join(root, "pretrain", "model")
    os.makedirs(model_dir)
    safetensors.torch.save_model(model, os.path.join(model_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(cfg.to_hf_config_dict(), handle)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(vocab_dir, name), model_dir)
    with open(os.path.join(root, "pretrain", "metrics.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
        handle.write('{"step": 31, "loss": 7.')  # a line cut short by a crash: left out, counted
    return records


@pytest.fixture(scope="module")
def template(demo_pipeline, tmp_path_factory) -> str:
    """A run root with the demo's corpus, vocab and examples and a finished pretrain stage."""
    cfg, _ = demo_pipeline
    root = str(tmp_path_factory.mktemp("eval-template"))
    for name in ("corpus", "vocab", "examples"):
        shutil.copytree(os.path.join(cfg.run.root, name), os.path.join(root, name))
    _train_tiny_model(root, TRAIN_STEPS)
    manifest = Manifest(
        stage="pretrain",
        code_version="test",
        fingerprint="pretrain-test-fp",
        inputs={},
        config={
            "model_size": "tiny",
            "phases": [{"name": "seq128", "steps": TRAIN_STEPS, "batch_size": 16, "max_seq_length": 128}],
        },
        shards=[],
        stats={},
        timings={},
    )
    StageDir(Storage(cfg.storage), root, "pretrain").write_manifest(manifest, resolved_yaml(cfg))
    return root


@pytest.fixture
def root(template, tmp_path) -> str:
    """A private copy of the template, so each test's eval/ starts empty."""
    target = str(tmp_path / "run")
    shutil.copytree(template, target)
    return target


@pytest.fixture
def storage() -> Storage:
    return Storage(StorageConfig())


# -- task files -----------------------------------------------------------------------------------

ADJECTIVES = ["long", "short", "funny", "dull", "loud", "quiet", "odd", "fine"]
NOUNS = ["film", "story", "plot", "actor", "scene", "music", "ending", "book"]
CITIES = ["Paris", "Berlin", "Seoul", "Lima", "Oslo", "Cairo"]
PEOPLE = ["Alice", "Bob", "Carol", "David", "Emma", "Frank"]


def _sentence(rng: random.Random, good: bool) -> str:
    words = ["the", rng.choice(NOUNS), "was", rng.choice(ADJECTIVES)]
    if good:
        words.insert(rng.randrange(len(words) + 1), "good")
    return " ".join(words)


def _tsv(path, header, rows, extra_lines=()) -> str:
    lines = ["\t".join(map(str, r)) for r in [header, *rows]] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _classification_rows(seed: int, n: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(_sentence(rng, i % 2 == 0), "pos" if i % 2 == 0 else "neg") for i in range(n)]


def _pairs(seed: int, n: int) -> list[tuple[str, str, float]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = _sentence(rng, rng.random() < 0.5), _sentence(rng, rng.random() < 0.5)
        rows.append((a, b, float(len(set(a.split()) & set(b.split())))))
    return rows


def _conll(path, seed: int, n: int) -> str:
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(n):
        words = [rng.choice(PEOPLE), "lives", "in", rng.choice(CITIES), "."]
        lines += [f"{w} {t}" for w, t in zip(words, ["B-PER", "O", "O", "B-LOC", "O"])] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def _squad(path, seed: int, n: int) -> str:
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        person, city = rng.choice(PEOPLE), rng.choice(CITIES)
        context = f"{_sentence(rng, False)} . {person} lives in {city} . {_sentence(rng, False)}"
        answer = {"text": city, "answer_start": context.index(f"in {city}") + 3}
        paragraphs.append(
            {
                "context": context,
                "qas": [{"id": f"q{seed}-{i}", "question": f"where does {person} live ?", "answers": [answer]}],
            }
        )
    path.write_text(
        json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}), encoding="utf-8"
    )
    return str(path)


def _quick(**fields) -> dict:
    """Settings that keep one fine-tuning run to a second or two."""
    return {"epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "max_seq_length": 48, "seeds": [1], **fields}


def _only_tasks(tasks: list[dict], baseline: bool = False) -> EvaluateConfig:
    return EvaluateConfig(tasks=tasks, baseline=baseline, intrinsic={"enabled": False}, embeddings={"enabled": False})


# -- end to end -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_task_type_with_baseline_intrinsic_and_embeddings(root, storage, tmp_path):
    files = tmp_path / "tasks"
    files.mkdir()
    # One malformed row (a missing label column) in the classification training file, skipped.
    sentiment_train = _tsv(
        files / "train.tsv", ("sentence", "label"), _classification_rows(1, 24), ["a row without its label"]
    )
    cfg = EvaluateConfig(
        tasks=[
            _quick(
                name="sentiment",
                type="classification",
                format="tsv",
                train=sentiment_train,
                validation=_tsv(files / "dev.tsv", ("sentence", "label"), _classification_rows(2, 12)),
                labels=["neg", "pos"],
                positive_label="pos",
                on_error="skip",
                seeds=[1, 2],
            ),
            _quick(
                name="overlap",
                type="regression",
                format="tsv",
                text_a="sentence1",
                text_b="sentence2",
                label_column="score",
                train=_tsv(files / "pairs-train.tsv", ("sentence1", "sentence2", "score"), _pairs(3, 20)),
                validation=_tsv(files / "pairs-dev.tsv", ("sentence1", "sentence2", "score"), _pairs(4, 10)),
            ),
            _quick(
                name="ner",
                type="token_classification",
                format="conll",
                train=_conll(files / "ner-train.txt", 5, 16),
                validation=_conll(files / "ner-dev.txt", 6, 8),
                labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
            ),
            _quick(
                name="qa",
                type="qa",
                format="squad",
                train=_squad(files / "qa-train.json", 7, 12),
                validation=_squad(files / "qa-dev.json", 8, 6),
                doc_stride=16,
                max_query_length=12,
                max_answer_length=4,
            ),
            {
                "name": "simlex",
                "type": "word_similarity",
                "format": "word_pairs",
                "validation": "{demo_data}/simlex999.txt",
                "seeds": [1, 2],
            },
        ],
        intrinsic={"max_batches": 10},
        embeddings={
            "sentences": 60,
            "num_pairs": 300,
            "sts": {"file": _tsv(files / "sts.tsv", ("sentence1", "sentence2", "score"), _pairs(9, 12))},
        },
    )
    manifest, computed = evaluate(cfg, root, storage, seed=11)
    assert computed and manifest.stage == "evaluate"
    eval_dir = os.path.join(root, EVAL_DIR)
    kept = {
        f"heads/pretrained/{name}.safetensors" for name in ("sentiment", "overlap", "ner", "qa")
    }  # tasks that train
    assert {s.path for s in manifest.shards if not s.path.startswith("tensorboard/")} == {
        "metrics.json",
        "report.md",
        "plots/pretraining.png",
        "plots/tasks.png",
    } | kept
    assert [
        s.path for s in manifest.shards if s.path.startswith("tensorboard/events.out.tfevents")
    ]  # the scores for TensorBoard

    def strict(constant):
        raise AssertionError(f"metrics.json holds {constant}")

    with open(os.path.join(eval_dir, "metrics.json"), encoding="utf-8") as handle:
        metrics = json.load(handle, parse_constant=strict)

    expected_metrics = {
        "sentiment": {"accuracy", "f1", "macro_f1", "mcc"},
        "overlap": {"pearson", "spearman", "mse"},
        "ner": {"precision", "recall", "f1", "token_accuracy"},
        "qa": {"exact_match", "f1"},
        "simlex": {"spearman", "pearson"},
    }
    for name, names in expected_metrics.items():
        task = metrics["tasks"][name]
        for model in ("pretrained", "random_init"):
            seeds = 1 if name == "simlex" and model == "pretrained" else 2 if name in ("sentiment", "simlex") else 1
            assert set(task[model]["validation"]) == names, (name, model)
            assert len(task[model]["runs"]) == seeds
            assert all(s["n"] + s["n_nan"] == seeds for s in task[model]["validation"].values())
        assert set(task["gain"]) == names
    # The malformed row: skipped, counted, and named with its file.
    assert metrics["tasks"]["sentiment"]["skipped"] == {"train": 1, "validation": 0}
    assert metrics["tasks"]["sentiment"]["train_examples"] == 24
    assert metrics["skipped_rows"] == {"total": 1, "files": {sentiment_train: 1}}
    assert "line 26" in metrics["tasks"]["sentiment"]["skipped_problems"][0]
    assert [s["file"] for s in manifest.skipped] == [sentiment_train]

    # Floors beside the scores, and a verdict per task: the validation file is balanced.
    sentiment = metrics["tasks"]["sentiment"]
    assert sentiment["baselines"]["validation"]["majority"]["accuracy"] == 0.5
    assert sentiment["baselines"]["chance"] == {"accuracy": 0.5, "mcc": 0.0}
    assert sentiment["pooler"] == {"pretrained": "pretrained", "random_init": "fresh"}
    for name, task in metrics["tasks"].items():
        assert (
            task["verdict"]["text"]
            and f"{name} ({figures.name(task['primary_metric'])}): {task['verdict']['text']}" in metrics["verdicts"]
        )
    simlex = metrics["tasks"]["simlex"]
    assert simlex["word_pairs"]["pairs"] == 999 and simlex["train_examples"] == 0
    assert len(simlex["pretrained"]["runs"]) == 1  # nothing trained: one score whatever the seed, computed once
    assert simlex["verdict"]["p_value"] >= 1 / 3 and not simlex["verdict"]["measurable"]  # 2 draws cannot show a gain

    # Sanity check: even 30 steps of pretraining beat random weights on held-out MLM.
    mlm = metrics["intrinsic"]["seq128"]
    assert set(metrics["intrinsic"]) == {"seq128"}  # the phase the pretrain stage trained on
    assert mlm["pretrained"]["sequences"] == mlm["random_init"]["sequences"] > 0
    assert mlm["pretrained"]["masked_tokens"] == mlm["random_init"]["masked_tokens"]  # the same stored masks
    assert mlm["pretrained"]["mlm_accuracy"] > mlm["random_init"]["mlm_accuracy"] + 0.01
    assert mlm["pretrained"]["mlm_loss"] < mlm["random_init"]["mlm_loss"] - 0.3
    assert mlm["pretrained"]["mlm_perplexity"] < mlm["random_init"]["mlm_perplexity"]
    assert 0.0 <= mlm["pretrained"]["nsp_accuracy"] <= 1.0
    # 30 steps learn token frequencies, no more: at the unigram baseline, which the verdict says.
    unigram = mlm["pretrained"]["baselines"]["unigram"]
    assert unigram["token"] == "the" and 0.03 < unigram["mlm_accuracy"] < 0.08
    assert abs(mlm["pretrained"]["mlm_accuracy"] - unigram["mlm_accuracy"]) < 0.02
    assert any(
        line.startswith("seq128 validation MLM accuracy") and "unigram plateau" in line for line in metrics["verdicts"]
    )
    balance = mlm["pretrained"]["baselines"]["nsp_balance"]
    assert (
        balance["is_next"] + balance["random"] == pytest.approx(1.0)
        and balance["pairs"] == mlm["pretrained"]["sequences"]
    )
    assert any(line.startswith("seq128 validation NSP accuracy") for line in metrics["verdicts"])
    # Fill-mask on held-out sentences: the masked word and the model's guesses.
    assert len(metrics["fill_mask"]) == 5
    for item in metrics["fill_mask"]:
        assert item["text"].count("[MASK]") == 1 and len(item["predictions"]) == 5 and item["answer"].isalpha()

    embeddings = metrics["embeddings"]
    assert embeddings["sentences"] == 60 and embeddings["sts_pairs"] == 12
    for model in ("pretrained", "random_init"):
        assert set(embeddings[model]) == {"cls", "mean"}
        for scores in embeddings[model].values():
            assert -1.0 <= scores["anisotropy"] <= 1.0 and "sts_spearman" in scores
    assert embeddings["pretrained"] != embeddings["random_init"]

    assert metrics["pretraining_log"]["records"] == TRAIN_STEPS and metrics["pretraining_log"]["unreadable_lines"] == 1
    with open(os.path.join(eval_dir, "report.md"), encoding="utf-8") as handle:
        md = handle.read()
    for name in expected_metrics:
        assert f"| {name} |" in md
    assert "## Validation masked LM" in md and "## Sentence embeddings" in md and "Skipped input rows" in md
    assert "## Verdict" in md and "## Fill-mask on held-out sentences" in md
    assert manifest.stats["verdicts"] == metrics["verdicts"]
    for plot in ("pretraining", "tasks"):
        with open(os.path.join(eval_dir, "plots", f"{plot}.png"), "rb") as handle:
            assert handle.read(8) == PNG_MAGIC

    # Same inputs: cached. Manifest gone (a crash before it was written): the finished jobs are
    # read back from _progress/ and give the same numbers without fine-tuning again.
    again, computed = evaluate(cfg, root, storage, seed=11)
    assert not computed and again.fingerprint == manifest.fingerprint
    # a flipped byte in the report: damaged, and written again from the finished jobs
    report_path = os.path.join(eval_dir, "report.md")
    with open(report_path, "rb") as handle:
        original = bytearray(handle.read())
    with open(report_path, "wb") as handle:
        handle.write(bytes(original[:10]) + bytes([original[10] ^ 0x01]) + bytes(original[11:]))
    assert StageDir(storage, root, EVAL_DIR).state(manifest.fingerprint) == "damaged"
    repaired, computed = evaluate(cfg, root, storage, seed=11)
    assert computed and StageDir(storage, root, EVAL_DIR).state(repaired.fingerprint) == "complete"
    with open(report_path, "rb") as handle:
        assert handle.read()[:200] == bytes(original[:200])
    os.remove(os.path.join(eval_dir, "_manifest.json"))
    resumed, computed = evaluate(cfg, root, storage, seed=11)
    with open(os.path.join(eval_dir, "metrics.json"), encoding="utf-8") as handle:
        rerun = json.load(handle)
    assert computed and rerun["timings"]["jobs_reused"] == rerun["timings"]["jobs"] == 18
    assert rerun["tasks"] == metrics["tasks"] and rerun["intrinsic"] == metrics["intrinsic"]

    rows = manifest.tables["evaluation-scores"]
    assert {r["section"] for r in rows} == {"pretraining", "fine-tuning", "no training", "embeddings"}
    assert {r["name"] for r in rows if r["section"] == "no training"} == {"simlex"}  # word similarity trains nothing
    assert manifest.report == "report.md"


def test_dynamic_masking_draws_the_same_masks_for_both_models_and_every_run(root, storage):
    cfg = EvaluateConfig(intrinsic={"max_batches": 3, "batch_size": 16}, embeddings={"enabled": False})
    path = os.path.join(root, EVAL_DIR, "metrics.json")

    def scores(force: bool) -> dict:
        evaluate(cfg, root, storage, seed=5, force=force)
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)["intrinsic"]["seq128"]

    static = scores(force=False)
    # The same shards declared as written for dynamic masking: the stage draws the masks.
    examples = StageDir(storage, root, "examples")
    manifest = examples.manifest()
    manifest.config["masking"] = "dynamic"
    storage.write_json(examples.path("_manifest.json"), manifest.to_json())
    dynamic = scores(force=True)
    assert (
        dynamic["pretrained"]["batches"] == 3
        and dynamic["pretrained"]["sequences"] == static["pretrained"]["sequences"]
    )
    # The quota per sequence is the same either way, the positions are not: other scores.
    assert (
        dynamic["pretrained"]["masked_tokens"]
        == static["pretrained"]["masked_tokens"]
        == dynamic["random_init"]["masked_tokens"]
    )
    assert dynamic["pretrained"]["mlm_loss"] != static["pretrained"]["mlm_loss"]
    assert scores(force=True) == dynamic  # a fixed seed: every run scores the same masks


# -- bad input ------------------------------------------------------------------------------------


def test_malformed_row_is_one_error_naming_file_and_line(root, storage, tmp_path):
    train = _tsv(tmp_path / "train.tsv", ("sentence", "label"), _classification_rows(1, 6)[:1], ["no label here"])
    cfg = _only_tasks([_quick(name="s", type="classification", format="tsv", train=train, cross_validation_folds=2)])
    with pytest.raises(InputDataError) as err:
        evaluate(cfg, root, storage, seed=1)
    message = str(err.value)
    assert f"{train}, line 3" in message and "on_error: skip" in message and "\n" not in message
    assert not os.path.exists(os.path.join(root, EVAL_DIR, "_manifest.json"))


def test_missing_task_file_names_the_key(root, storage, tmp_path):
    cfg = _only_tasks(
        [
            _quick(
                name="s",
                type="classification",
                format="tsv",
                train=_tsv(tmp_path / "t.tsv", ("sentence", "label"), _classification_rows(1, 4)),
                validation=str(tmp_path / "nope.tsv"),
            )
        ]
    )
    with pytest.raises(ConfigError, match=r"evaluate\.tasks\[0\]\.validation: .*nope\.tsv does not exist"):
        evaluate(cfg, root, storage, seed=1)


def test_without_a_pretrained_model_the_error_says_which_stage_to_run(storage, tmp_path):
    with pytest.raises(BertpipeError, match="pretrain stage has no output"):
        evaluate(EvaluateConfig(), str(tmp_path), storage, seed=1)


def test_task_files_on_s3(root, s3_bucket, tmp_path):
    import boto3

    endpoint, bucket = s3_bucket
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    rows = _classification_rows(1, 12)
    local = _tsv(tmp_path / "x.tsv", ("sentence", "label"), rows, ["broken"])
    client.upload_file(local, bucket, "tasks/train.tsv")
    s3_storage = Storage(StorageConfig(endpoint_url=endpoint))
    uri = f"s3://{bucket}/tasks/train.tsv"
    task = _quick(name="s", type="classification", format="tsv", train=uri, cross_validation_folds=2)

    # A malformed row is reported with the S3 URI, not the worker's local copy.
    with pytest.raises(InputDataError, match=rf"{uri}, line 14"):
        evaluate(_only_tasks([task]), root, s3_storage, seed=1)
    manifest, _ = evaluate(_only_tasks([{**task, "on_error": "skip"}]), root, s3_storage, seed=1)
    with open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8") as handle:
        metrics = json.load(handle)
    assert metrics["skipped_rows"] == {"total": 1, "files": {uri: 1}}
    assert metrics["tasks"]["s"]["train_examples"] == 12
    assert [s["file"] for s in manifest.skipped] == [uri]


def test_editing_a_task_file_reruns_and_run_reads_the_pipeline_section(root, storage, tmp_path):
    train = _tsv(tmp_path / "t.tsv", ("sentence", "label"), _classification_rows(1, 8))
    evaluate_cfg = _only_tasks(
        [_quick(name="s", type="classification", format="tsv", train=train, cross_validation_folds=2)]
    )
    examples_cfg = Manifest.from_json(
        json.load(open(os.path.join(root, "examples", "_manifest.json"), encoding="utf-8"))
    ).config
    cfg = PipelineConfig(
        run={"root": root, "seed": 3}, corpus={"inputs": ["unused.txt"]}, examples=examples_cfg, evaluate=evaluate_cfg
    )
    first, computed = Pipeline(cfg, storage).run("evaluate")
    assert computed
    with open(os.path.join(root, EVAL_DIR, "_config.yaml"), encoding="utf-8") as handle:
        assert yaml.safe_load(handle)["evaluate"]["tasks"][0]["train"] == train
    assert not Pipeline(cfg, storage).run("evaluate")[1]
    _tsv(tmp_path / "t.tsv", ("sentence", "label"), _classification_rows(2, 8))  # same path, new content
    second, computed = Pipeline(cfg, storage).run("evaluate")
    assert computed and second.fingerprint != first.fingerprint

    # the run summary's figures and `bertpipe inspect evaluate` show the stored scores
    from flows.inspect import Options, inspect

    metrics = json.load(open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8"))
    median = metrics["tasks"]["s"]["pretrained"]["validation"]["accuracy"]["median"]
    assert "random_init" not in metrics["tasks"]["s"]  # baseline: false
    assert second.headline["tasks with a measurable gain"] == "0 of 1"  # no baseline: nothing to measure a gain against
    data, lines = inspect(storage, root, "evaluate", Options())
    row = next(r for r in data["scores"] if r["name"] == "s" and r["metric"] == "accuracy")
    assert (row["pretrained"], row["random_init"]) == (median, None) and row["section"] == "fine-tuning"
    assert any(
        line.split()[:3] == ["s", "accuracy", f"{100 * median:.1f}%"] for line in lines[lines.index("fine-tuning:") :]
    )


def test_the_model_fine_tuned_on_the_whole_training_file_is_kept_for_export(root, storage, tmp_path):
    """Cross-validated without a test file, the folds' models each miss a fold: the first
    seed's job fits one more on everything and keeps it, with what export needs to know."""
    from bertcore.eval.config import TaskConfig
    from bertcore.eval.finetune import fine_tuned_model
    from bertcore.eval.heads import load_task_model, read_head
    from pipelines.storage import sha256_file

    train = _tsv(tmp_path / "t.tsv", ("sentence", "label"), _classification_rows(5, 10))
    task = _quick(
        name="s",
        type="classification",
        format="tsv",
        train=train,
        cross_validation_folds=2,
        seeds=[4, 9],
        pooling="mean",
    )
    manifest, _ = evaluate(_only_tasks([task]), root, storage, seed=3)
    assert [s.path for s in manifest.shards if s.path.startswith("heads/")] == [
        "heads/pretrained/s.safetensors"
    ]  # one seed's
    path = os.path.join(root, EVAL_DIR, "heads", "pretrained", "s.safetensors")
    model_dir = os.path.join(root, "pretrain", "model")
    head = read_head(path)
    assert (head.task, head.type, head.labels, head.seed, head.pooling) == (
        "s",
        "classification",
        ["neg", "pos"],
        4,
        "mean",
    )
    assert head.trained_on == "the whole training file (10 examples)"
    assert head.encoder_sha256 == sha256_file(os.path.join(model_dir, "model.safetensors"))
    metrics = json.load(open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8"))
    assert metrics["tasks"]["s"]["saved_model"] == "heads/pretrained/s.safetensors"
    # it is the seed's fit on the whole file: the same fit again gives the same weights
    saved, _ = load_task_model(path, model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the job ran (evaluate.num_threads)
    try:
        again = fine_tuned_model(TaskConfig.model_validate(task), model_dir, model_dir, 4)
    finally:
        torch.set_num_threads(threads)
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, saved.state_dict()[name]), name


def _choice_rows(seed: int, n: int) -> list[dict]:
    """SWAG-style rows: a context, four endings, the index of the right one (the ending that says "good")."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        right = rng.randrange(4)
        endings = {f"ending{k}": _sentence(rng, k == right) for k in range(4)}
        rows.append({"context": f"the {rng.choice(NOUNS)} started .", "label": right} | endings)
    return rows


def test_a_multiple_choice_task_runs_from_the_recipe_to_its_verdict(root, storage, tmp_path):
    """The kind added as one module and one registry line: the stage plans it, checks its
    files, fine-tunes the subject and random init on it, scores, judges and reports it, and
    keeps its head for export."""
    from bertcore.eval.heads import load_task_model, read_head

    files = {}
    for split, seed, n in (("train", 1, 40), ("validation", 2, 24)):
        files[split] = str(tmp_path / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(r) + "\n" for r in _choice_rows(seed, n)), encoding="utf-8")
    task = _quick(
        name="endings",
        type="multiple_choice",
        format="jsonl",
        text_a="context",
        choices=[f"ending{k}" for k in range(4)],
        epochs=6,
        learning_rate=2e-3,
        pooling="mean",
        **files,
    )
    manifest, computed = evaluate(_only_tasks([task], baseline=True), root, storage, seed=7)
    assert computed and "heads/pretrained/endings.safetensors" in {s.path for s in manifest.shards}
    with open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8") as handle:
        entry = json.load(handle)["tasks"]["endings"]
    described = (entry["type"], entry["primary_metric"], entry["labels"], entry["train_examples"])
    assert described == ("multiple_choice", "accuracy", [], 40)
    assert entry["baselines"]["chance"] == {"accuracy": 0.25}
    majority = entry["baselines"]["validation"]["majority"]["accuracy"]
    assert entry["pretrained"]["validation"]["accuracy"]["median"] >= 0.75 > majority  # it learned which is right
    assert set(entry["random_init"]["validation"]) == {"accuracy"} and entry["verdict"]["text"]
    with open(os.path.join(root, EVAL_DIR, "report.md"), encoding="utf-8") as handle:
        assert "| endings | multiple_choice | accuracy |" in handle.read()
    path = os.path.join(root, EVAL_DIR, "heads", "pretrained", "endings.safetensors")
    assert (read_head(path).type, read_head(path).num_outputs) == ("multiple_choice", 1)  # one score per candidate
    model, _ = load_task_model(path, os.path.join(root, "pretrain", "model"))
    assert model.kind.head_shape == "choice"


def test_train_fractions_are_jobs_of_their_own_resumed_by_marker_and_drawn_as_a_curve(root, storage, tmp_path):
    """Each fraction is one job per model and seed (the whole file keeps its job's old
    name); a fraction that leaves a label out is refused before any job starts; metrics.json
    holds every point with its spread, and the report draws them."""
    train = _tsv(tmp_path / "train.tsv", ("sentence", "label"), _classification_rows(1, 16))
    dev = _tsv(tmp_path / "dev.tsv", ("sentence", "label"), _classification_rows(2, 8))
    task = _quick(
        name="few",
        type="classification",
        format="tsv",
        train=train,
        validation=dev,
        seeds=[1, 2],
        train_fractions=[0.25, 0.5, 1.0],
        pooling="mean",
    )
    progress = os.path.join(root, EVAL_DIR, "_progress")
    with pytest.raises(InputDataError) as err:
        evaluate(_only_tasks([task | {"train_fractions": [0.05, 1.0]}], baseline=True), root, storage, seed=5)
    assert str(err.value).startswith(
        "evaluate.tasks[0].train_fractions: 0.05 of task 'few''s 16 training examples keeps 1, fewer than its 2 labels;"
    )
    assert not os.path.exists(progress) or not os.listdir(progress)  # refused at plan time: no job ran

    cfg = _only_tasks([task], baseline=True)
    manifest, computed = evaluate(cfg, root, storage, seed=5)
    assert computed and "plots/label_fractions.png" in {s.path for s in manifest.shards}
    markers = sorted(os.listdir(progress))
    assert (
        len(markers) == 12
        and "finetune__few__random_init__fraction0.25__seed2.json" in markers
        and "finetune__few__pretrained__seed1.json" in markers
    )
    with open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8") as handle:
        metrics = json.load(handle)
    entry = metrics["tasks"]["few"]
    assert entry["train_fraction"] == 1.0 and entry["fit_examples"] == [16]
    curve = entry["learning_curve"]
    assert [p["fraction"] for p in curve["points"]] == [0.25, 0.5, 1.0]
    assert [p["fit_examples"] for p in curve["points"]] == [[4], [8], [16]]
    for point in curve["points"]:
        for model in ("pretrained", "random_init"):
            summary = point[model]
            assert len(summary["values"]) == 2 and summary["min"] <= summary["median"] <= summary["max"]
            assert (summary["min"], summary["max"]) == (min(summary["values"]), max(summary["values"]))
        assert point["verdict"]["text"]
    assert (
        curve["points"][-1]["pretrained"]["median"] == entry["pretrained"]["validation"]["accuracy"]["median"]
    )  # the headline is the whole file
    with open(os.path.join(root, EVAL_DIR, "report.md"), encoding="utf-8") as handle:
        assert "## Few labels" in handle.read()
    with open(os.path.join(root, EVAL_DIR, "plots", "label_fractions.png"), "rb") as handle:
        assert handle.read(8) == PNG_MAGIC

    os.remove(os.path.join(root, EVAL_DIR, "_manifest.json"))  # a crash after the jobs: every one is read back
    _, computed = evaluate(cfg, root, storage, seed=5)
    with open(os.path.join(root, EVAL_DIR, "metrics.json"), encoding="utf-8") as handle:
        again = json.load(handle)
    assert computed and again["timings"]["jobs_reused"] == again["timings"]["jobs"] == 12
    assert again["tasks"] == metrics["tasks"]


# -- configuration --------------------------------------------------------------------------------


def test_demo_section_validates_and_expands_the_sample_data_path():
    from bertcore.sample_data import SENTIMENT, gensim_data_dir
    from pipelines.registry import load_config

    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.yaml")).evaluate
    tasks = {t.name: t for t in cfg.tasks}
    assert tasks["polarity"].train == str(gensim_data_dir() / SENTIMENT) and os.path.isfile(tasks["polarity"].train)
    assert tasks["polarity"].cross_validation_folds == 5 and tasks["polarity"].encoding == "cp1252" and cfg.baseline
    for name in ("simlex999", "wordsim353"):
        assert tasks[name].type == "word_similarity" and os.path.isfile(tasks[name].validation)


def test_section_rejects_repeated_task_names_and_unknown_keys():
    from pydantic import ValidationError

    task = {"name": "a", "type": "classification", "format": "tsv", "train": "t.tsv", "cross_validation_folds": 2}
    with pytest.raises(ValidationError, match="repeated: a"):
        EvaluateConfig(tasks=[task, task])
    with pytest.raises(ValidationError, match="max_batch"):
        EvaluateConfig(intrinsic={"max_batch": 3})
    sts = EvaluateConfig(embeddings={"sts": {"file": "{demo_data}/x.tsv"}}).embeddings.sts
    assert "{demo_data}" not in sts.file


def test_task_file_placeholders_are_expanded_however_the_task_is_built():
    from bertcore.eval.tasks import TaskConfig
    from bertcore.sample_data import gensim_data_dir

    splits = ("train", "validation", "test")
    fields = {"name": "a", "type": "classification", "format": "tsv"} | {s: f"{{demo_data}}/{s}.tsv" for s in splits}
    expected = {s: str(gensim_data_dir() / f"{s}.tsv") for s in splits}
    for task in (
        TaskConfig(**fields),
        EvaluateConfig(tasks=[fields]).tasks[0],
        EvaluateConfig(tasks=[TaskConfig(**fields)]).tasks[0],
    ):
        assert {s: getattr(task, s) for s in expected} == expected


# -- Prefect --------------------------------------------------------------------------------------


def _evaluated(tmp_path) -> tuple[Manifest, StageDir]:
    """A finished evaluate directory with a report and a score table, written here."""
    directory = StageDir(Storage(StorageConfig()), str(tmp_path), EVAL_DIR)
    report = directory.publish("report.md", lambda path: open(path, "w").write("# Evaluation report\n\nhello"), rows=0)
    rows = [
        {
            "section": "fine-tuning",
            "name": "sst",
            "metric": "accuracy",
            "pretrained": 0.9,
            "random_init": 0.6,
            "gain": 0.3,
        }
    ]
    manifest = Manifest(
        "evaluate",
        "1",
        "fp",
        {},
        {},
        [report],
        {"tasks": {"sst": {"pretrained": 0.9}}},
        {},
        report="report.md",
        tables={"evaluation-scores": rows},
    )
    return manifest, directory


def test_publish_artifacts_outside_a_run_does_nothing(tmp_path):
    assert publish_stage("evaluate", *_evaluated(tmp_path), computed=True) is False


@pytest.mark.slow
def test_publish_artifacts_in_a_flow(prefect_harness, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    manifest, directory = _evaluated(tmp_path)

    @flow
    def publish() -> bool:
        return publish_stage("evaluate", manifest, directory, computed=True)

    state = publish(return_state=True)
    assert state.result() is True
    run_id = state.state_details.flow_run_id

    async def read(key: str):
        # this flow run's: other tests of the session publish artifacts under the same keys
        only = ArtifactFilter(key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=only)

    import asyncio

    markdown = asyncio.run(read("evaluate-report"))
    table = asyncio.run(read("evaluation-scores"))
    stats = asyncio.run(read("evaluate-stats"))
    assert markdown and "hello" in markdown[0].data
    assert table and "sst" in str(table[0].data)
    assert stats and "tasks.sst.pretrained" in str(stats[0].data)


# -- from pretraining to fine-tuning ----------------------------------------------------------------


def test_fine_tuning_starts_from_what_pretraining_exported(root):
    """No defect between the pretrain stage's model/ and fine-tuning: bit-identical encoder
    weights, the pooler loaded rather than fresh, the examples stage's tokenisation, and
    pretraining's segment layout for pairs."""
    from pyarrow import ipc

    from bertcore.eval import diagnostics, finetune
    from bertcore.eval.config import TaskConfig
    from bertcore.train.loader import ExamplesLoader

    model_dir = os.path.join(root, "pretrain", "model")
    start = diagnostics.encoder_start(model_dir)
    assert (
        start["max_abs_diff"] == 0.0
        and start["fresh"] == []
        and start["pooler"] == "pretrained"
        and start["tensors"] > 30
    )
    sentences = []
    for path in glob.glob(os.path.join(root, "corpus", "validation", "*.arrow")):
        with ipc.open_file(path) as reader:
            sentences += [s for doc in reader.read_all().column("sentences").to_pylist() for s in doc][:300]
    agreement = diagnostics.tokenizer_agreement(model_dir, os.path.join(root, "vocab"), sentences)
    assert agreement["identical"] == agreement["sentences"] == len(sentences) > 100
    assert diagnostics.pair_layout(model_dir, sentences[0], sentences[1]) == {
        "starts_with_cls": True,
        "ends_with_sep": True,
        "token_types_match": True,
        "all_attended": True,
    }
    validation = sorted(glob.glob(os.path.join(root, "examples", "seq128", "validation", "*.arrow")))

    def batches():
        return ExamplesLoader(validation, 32, seed=1, pad_id=0, shuffle=False, even_batches=False)

    before = diagnostics.mlm_scores_of_encoder(model_dir, None, batches(), max_batches=3)
    same = diagnostics.mlm_scores_of_encoder(
        model_dir, finetune.load_encoder(model_dir).state_dict(), batches(), max_batches=3
    )
    assert same["mlm_loss"] == before["mlm_loss"] and same["mlm_accuracy"] == before["mlm_accuracy"]
    rows = _classification_rows(1, 16)
    task = TaskConfig(
        **_quick(
            name="s",
            type="classification",
            format="tsv",
            train=_tsv(Path(root) / "t.tsv", ("sentence", "label"), rows),
            cross_validation_folds=2,
            learning_rate=5e-3,
            epochs=2,
        )
    )
    tuned = finetune.fine_tuned_model(task, model_dir, model_dir, seed=1).encoder.state_dict()
    assert diagnostics.relative_change(finetune.load_encoder(model_dir).state_dict(), tuned) > 0.0
    # the MLM head reads the fine-tuned encoder: its loss moves (the accuracy of a model
    # still at the unigram plateau may not: it keeps predicting the most frequent tokens)
    assert (
        diagnostics.mlm_scores_of_encoder(model_dir, tuned, batches(), max_batches=3)["mlm_loss"] != before["mlm_loss"]
    )


def test_the_fingerprint_holds_what_task_files_contain_not_where_they_are(tmp_path):
    """A reinstall moves the bundled task files ({demo_data} expands elsewhere): the
    evaluate stage stays complete. A task file whose content changes makes it stale."""
    from pipelines.registry import load_config

    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"

    def fingerprint(folder: Path) -> str:
        cfg = load_config(
            demo,
            [
                f"run.root={tmp_path / 'run'}",
                (
                    f"evaluate.tasks=[{{name: pol, type: classification, format: fasttext, train: "
                    f"'{folder / 'pol.txt'}', cross_validation_folds: 2}}]"
                ),
            ],
        )
        return Pipeline(cfg).expected_fingerprint("evaluate")

    first, second = tmp_path / "site-a", tmp_path / "site-b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "pol.txt").write_text("__label__1 a fine film\n__label__0 a dull film\n", encoding="utf-8")
    assert fingerprint(first) == fingerprint(second)
    (second / "pol.txt").write_text("__label__1 a fine film\n__label__0 a very dull film\n", encoding="utf-8")
    assert fingerprint(first) != fingerprint(second)
