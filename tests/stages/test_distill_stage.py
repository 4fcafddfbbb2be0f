"""The distill stage on a real local Ray (2 CPUs) with Ray Train workers running DeepSpeed on
CPU: a 2-layer student distilled from a 4-layer teacher that transformers wrote from random
weights (a BertModel with sentence-transformers files, as all-MiniLM-L6-v2 is: no MLM head,
so the soft targets are skipped and said so), exported as an embedding model that
transformers and sentence-transformers load with the teacher's pooling, its start kept
beside it, then evaluated beside its teacher, its start and a random init of its size; and
a run killed with SIGKILL, resumed, ends with the student weights of an uninterrupted run,
bit for bit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

from bertcore.config import StorageConfig
from bertcore.distill.config import DistillConfig
from bertcore.model.bert import BertForPreTraining
from bertcore.model.pretrained import load_into, model_config, read_weights
from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, checkpoint_tag
from bertcore.train.export import HF_FILES
from bertcore.train.metrics_log import MetricsLog
from bertcore.vocab.config import VocabConfig
from bertcore.vocab.tokenizer import TOKENIZER_FILES
from pipelines.runner import run_stage
from pipelines.storage import Storage
from test_pretrain_stage import _wait_for_idle_workers, sigkill_when, start_killed_run
from test_train import SEED, make_run_root

STORAGE = Storage(StorageConfig())
READS = ("examples", "vocab")
"""An external teacher: the pretrain stage is not part of the run."""
EVALUATE_READS = ("distill", "examples", "corpus")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, gensim_data) -> tuple[Path, Path]:
    """(a run root with the vocab and examples stages' outputs, the teacher's folder): the
    teacher is a 4-layer BertModel on that vocabulary, which the vocab stage 'adopted'."""
    root = tmp_path_factory.mktemp("distill-inputs")
    info = make_run_root(root, gensim_data, max_documents=120, dupe_factor=1)
    teacher = tmp_path_factory.mktemp("teacher")
    config = transformers.BertConfig(
        vocab_size=len(info["tokens"]),
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(11)
    transformers.BertModel(config).save_pretrained(str(teacher))
    for name in TOKENIZER_FILES:
        shutil.copyfile(root / "vocab" / name, teacher / name)
    # published as an embedding model: [CLS] pooling (all-MiniLM-L6-v2 has mean), normalised vectors
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (teacher / "modules.json").write_text(json.dumps(modules))
    (teacher / "1_Pooling").mkdir()
    (teacher / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    (teacher / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    manifest = json.loads((root / "vocab" / "_manifest.json").read_text())
    manifest["config"] = VocabConfig.model_validate(
        {**manifest["config"], "source": "pretrained", "pretrained": str(teacher)}
    ).model_dump(mode="json")
    (root / "vocab" / "_manifest.json").write_text(json.dumps(manifest))
    _corpus(root, gensim_data, manifest)
    return root, teacher


def _corpus(root: Path, gensim_data: Path, like: dict) -> None:
    """What the corpus stage would leave: a validation shard of news articles (evaluate draws
    its embedding sentences there) and its manifest."""
    import hashlib

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from bertcore.text.config import CorpusConfig

    lines = [
        line
        for line in (gensim_data / "lee_background.cor").read_text(encoding="utf-8", errors="replace").splitlines()
        if line.strip()
    ]
    docs = [[s.strip() for s in line.split(". ") if s.strip()] for line in lines[-20:]]
    table = pa.table(
        {
            "doc_id": [f"d{i}" for i in range(len(docs))],
            "source": ["news"] * len(docs),
            "title": [""] * len(docs),
            "sentences": docs,
        }
    )
    path = root / "corpus" / "validation" / "part-00000.arrow"
    path.parent.mkdir(parents=True)
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    shard = {
        "path": "validation/part-00000.arrow",
        "rows": len(docs),
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "extra": {},
    }
    manifest = {
        **like,
        "stage": "corpus",
        "fingerprint": "corpus-test",
        "config": CorpusConfig(inputs=["unused.txt"]).model_dump(mode="json"),
        "shards": [shard],
        "stats": {},
    }
    (root / "corpus" / "_manifest.json").write_text(json.dumps(manifest))


def section(teacher: Path, **overrides) -> DistillConfig:
    fields = dict(
        enabled=True,
        teacher=str(teacher),
        student={"num_hidden_layers": 2},
        loss={"attention": 1.0},
        num_workers=1,
        learning_rate=1e-3,
        warmup_steps=5,
        phases=[{"name": "seq64", "steps": 30, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10,
        validation_batches=2,
        eval_every=10,
        torch_threads=1,
    )
    return DistillConfig.model_validate({**fields, **overrides})


def _fresh_root(inputs, target: Path) -> Path:
    root, _ = inputs
    for part in (*READS, "corpus"):
        shutil.copytree(root / part, target / part)
    return target


def _student(root: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(root / "distill" / "model" / "model.safetensors"))


ST_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json")


def _loads_in_sentence_transformers(folder: str) -> None:
    """SentenceTransformer loads the student with the teacher's modules ([CLS] pooling,
    normalised) and its vectors are bertpipe's own."""
    from sentence_transformers import SentenceTransformer

    from bertcore.eval.embeddings import embed
    from bertcore.eval.encoder import load_encoder, load_tokenizer

    sentences = ["the minister said the talks would go on", "fire crews fought the blaze", "oil prices rose again"]
    model = SentenceTransformer(folder, device="cpu")
    pooling = next(m for m in model if type(m).__name__ == "Pooling").get_config_dict()["pooling_mode"]
    assert pooling == "cls" and [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    theirs = model.encode(sentences, convert_to_numpy=True)
    ours = embed(load_encoder(folder), load_tokenizer(folder), sentences, pooling="cls", max_seq_length=64)
    cosines = (theirs * ours).sum(1) / (np.linalg.norm(theirs, axis=1) * np.linalg.norm(ours, axis=1))
    assert cosines.min() >= 0.999


@pytest.fixture(scope="module")
def distilled(ray_cluster, inputs, tmp_path_factory):
    """One distillation of `section`'s 30 steps, for the export test and as the uninterrupted
    run the SIGKILLed one must match: (root, manifest, computed)."""
    _, teacher = inputs
    root = _fresh_root(inputs, tmp_path_factory.mktemp("distilled") / "run")
    manifest, computed = run_stage("distill", section(teacher), root=str(root), storage=STORAGE, seed=SEED, reads=READS)
    return root, manifest, computed


@pytest.mark.slow
def test_a_student_is_distilled_from_a_bertmodel_teacher_and_exported_as_an_embedding_model_with_its_start(
    distilled, inputs, tmp_path
):
    _, teacher = inputs
    root, manifest, computed = distilled
    assert computed and manifest.stats["steps"] == 30
    stats = manifest.stats
    assert stats["teacher"]["has_mlm_head"] is False and "soft-target loss" in stats["notes"][0]
    assert (
        stats["layer_map"] == [2, 4]
        and stats["student"]["layers"] == 2
        and stats["init"]["from_teacher"]["layers"] == [2, 4]
    )
    assert stats["final"]["soft_target_loss"] is None and stats["final"]["attention_loss"] is not None
    records = MetricsLog(str(root / "distill" / "metrics.jsonl")).records()
    assert records[-1]["loss"] < records[0]["loss"] and all(r["hidden_loss"] > 0 for r in records)
    assert [r["step"] for r in MetricsLog(str(root / "distill" / "validation.jsonl")).records()] == [10, 20, 30]
    assert manifest.headline["student"].startswith("2x32") and manifest.headline["teacher"].startswith("4x32")

    # the export: the teacher is an embedding model, and so is its student: a BertModel that transformers loads with no
    # load report and that computes what ours does, with the teacher's sentence-transformers modules and pooling
    model_dir = root / "distill" / "model"
    assert sorted(
        os.path.relpath(os.path.join(d, f), model_dir) for d, _, names in os.walk(model_dir) for f in names
    ) == sorted([*HF_FILES, *ST_FILES])
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["BertModel"]
    assert stats["export"]["layout"] == "sentence-transformers" and stats["export"]["sentence"]["pooling"] == "cls"
    theirs, info = transformers.AutoModel.from_pretrained(str(model_dir), output_loading_info=True)
    assert info["missing_keys"] == info["unexpected_keys"] == set()
    ours = BertForPreTraining(model_config(str(model_dir)), torch.Generator().manual_seed(0)).eval()
    load_into(ours, read_weights(str(model_dir)))
    ids = torch.randint(5, 500, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs.eval()(ids).last_hidden_state
        assert torch.allclose(ours.bert(ids), expected, atol=1e-5)
    _loads_in_sentence_transformers(str(model_dir))
    # its second layer started as the teacher's fourth and then trained: moved, but nearer it than the teacher's third
    teacher_weights = read_weights(str(teacher))
    trained = _student(root)["encoder.layer.1.output.dense.weight"]
    start, other = (
        teacher_weights["bert.encoder.layer.3.output.dense.weight"],
        teacher_weights["bert.encoder.layer.2.output.dense.weight"],
    )
    assert not torch.equal(start, trained) and (trained - start).abs().mean() < (trained - other).abs().mean() / 2
    # the start, kept beside it in the same layout and listed in the manifest: the teacher's layers 2 and 4, untrained
    begun = safetensors.torch.load_file(str(root / "distill" / "student-start" / "model.safetensors"))
    assert torch.equal(begun["encoder.layer.1.output.dense.weight"], start) and sorted(begun) == sorted(_student(root))
    assert {s.path for s in manifest.shards_under("student-start/")} == {
        f"student-start/{name}" for name in (*HF_FILES, *ST_FILES)
    }

    again, computed = run_stage("distill", section(teacher), root=str(root), storage=STORAGE, seed=SEED, reads=READS)
    assert not computed and again.fingerprint == manifest.fingerprint
    from flows.inspect import Options, inspect

    data, lines = inspect(STORAGE, str(root), "distill", Options())
    assert lines[0].startswith("distill: 30 steps under") and [c["step"] for c in data["checkpoints"]] == [10, 20, 30]
    assert {f["file"] for f in data["model"]["files"]} == {*HF_FILES, *ST_FILES}
    _evaluate_three_ways(root, teacher, tmp_path)


def _evaluate_three_ways(root: Path, teacher: Path, tmp_path: Path) -> None:
    """The evaluate stage after distillation: teacher, student, its start and a
    student-sized random init on a word-similarity task and an STS file, the speed of each,
    and the lines on what the student keeps and where its gain comes from."""
    from bertcore.eval.config import EvaluateConfig
    from bertcore.sample_data import gensim_data_dir

    sts = tmp_path / "sts.tsv"
    pairs = [
        ("the minister said", "the minister told", 4.5),
        ("fire crews fought", "the fires burned", 3.0),
        ("the bank rates", "a cricket match", 0.5),
        ("police said", "the police told", 4.0),
        ("the talks ended", "the match began", 1.0),
        ("oil prices rose", "the price of oil rose", 4.8),
    ]
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{score}\n" for a, b, score in pairs))
    cfg = EvaluateConfig.model_validate(
        {
            "tasks": [
                {
                    "name": "wordsim353",
                    "type": "word_similarity",
                    "format": "word_pairs",
                    "validation": str(gensim_data_dir() / "wordsim353.tsv"),
                    "seeds": [1, 2, 3],
                }
            ],
            "embeddings": {"sentences": 40, "num_pairs": 100, "max_seq_length": 64, "sts": {"file": str(sts)}},
            "intrinsic": {"max_batches": 2, "fill_mask": 0},
            "speed": {"batch_size": 4, "max_seq_length": 32, "passes": 2},
        }
    )
    manifest, computed = run_stage("evaluate", cfg, root=str(root), storage=STORAGE, seed=SEED, reads=EVALUATE_READS)
    metrics = json.loads((root / "eval" / "metrics.json").read_text())
    assert computed and metrics["subject"] == "student"
    assert metrics["models"]["teacher"]["uri"] == str(teacher) and metrics["models"]["student"]["uri"].endswith(
        "distill/model"
    )
    assert (
        metrics["models"]["random_init"]["random_init"]
        and metrics["models"]["random_init"]["config"]["num_hidden_layers"] == 2
    )
    assert metrics["models"]["student_start"]["uri"] == "distill/student-start"
    task = metrics["tasks"]["wordsim353"]
    assert (
        task["student"]["runs"][0]["seed"] == 1
        and len(task["random_init"]["runs"]) == 3
        and len(task["teacher"]["runs"]) == 1
    )
    assert len(task["student_start"]["runs"]) == 1  # word similarity trains nothing: one score
    assert (
        set(metrics["embeddings"]) >= {"teacher", "student", "student_start", "random_init"}
        and metrics["embeddings"]["sts_pairs"] == 6
    )
    assert set(metrics["speed"]) == {"teacher", "student", "random_init"} and all(
        s["sequences_per_s"] > 0 for s in metrics["speed"].values()
    )
    # an embedding model has no MLM head: no held-out MLM nor fill-mask, and a note says why
    assert metrics["intrinsic"] == {} and any("no MLM head" in note for note in metrics["notes"])
    lines = [line for line in metrics["verdicts"] if "the teacher's gain" in line or "nothing to keep" in line]
    assert [line.split(" (")[0] for line in lines] == ["wordsim353", "STS", "STS"] and all(
        "x its speed" in line for line in lines
    )
    assert all("the start gave" in line and "and training" in line for line in lines)
    assert lines == manifest.stats["verdicts"][-3:]
    report_text = (root / "eval" / "report.md").read_text()
    assert (
        "## Distillation: teacher, student, student start, random init" in report_text
        and "| student start |" in report_text
    )


@pytest.mark.slow
def test_a_sigkilled_distillation_resumes_to_the_student_of_an_uninterrupted_run(
    ray_cluster, distilled, inputs, tmp_path
):
    _, teacher = inputs
    cfg = section(teacher)  # the uninterrupted run is `distilled`'s
    reference_root, killed_root = distilled[0], _fresh_root(inputs, tmp_path / "killed")

    process = start_killed_run(ray_cluster, killed_root, cfg, "distill", READS)
    first_marker = killed_root / "distill" / CHECKPOINTS / checkpoint_tag(10) / COMPLETE
    log = killed_root / "distill" / "metrics.jsonl"
    sigkill_when(process, lambda: first_marker.exists() and len(MetricsLog(str(log)).records()) >= 14)
    _wait_for_idle_workers(ray_cluster, cpus=2)
    assert 14 <= len(MetricsLog(str(log)).records()) < 30, "the kill did not land in the middle of the run"
    assert not (killed_root / "distill" / "model").exists()

    resumed, computed = run_stage("distill", cfg, root=str(killed_root), storage=STORAGE, seed=SEED, reads=READS)
    assert computed and resumed.stats["steps"] == 30

    def trajectory(root):
        return [
            (r["step"], r["data_hash"], r["loss"])
            for r in MetricsLog(str(root / "distill" / "metrics.jsonl")).records()
        ]

    assert trajectory(killed_root) == trajectory(reference_root)
    reference, after = _student(reference_root), _student(killed_root)
    assert sorted(after) == sorted(reference)
    assert all(torch.equal(after[name], reference[name]) for name in reference), (
        "the resumed student differs from the uninterrupted one"
    )
