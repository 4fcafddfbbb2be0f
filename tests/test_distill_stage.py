"""The distill stage on a real local Ray (2 CPUs) with Ray Train workers running DeepSpeed on
CPU: a 2-layer student distilled from a 4-layer teacher that transformers wrote from random
weights (a BertModel, as all-MiniLM-L6-v2 is: no MLM head, so the soft targets are skipped
and said so), exported as a Hugging Face folder that transformers loads, then evaluated
beside its teacher and a random init of its size; and a run killed with SIGKILL, resumed,
ends with the student weights of an uninterrupted run, bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import safetensors.torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from test_pretrain_stage import KILLED_RUN, _wait_for_idle_workers, sigkill_when  # noqa: E402
from test_train import SEED, make_run_root  # noqa: E402

from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE, checkpoint_tag  # noqa: E402
from bertcore.config import StorageConfig  # noqa: E402
from bertcore.distill.config import DistillConfig  # noqa: E402
from bertcore.train.export import HF_FILES  # noqa: E402
from bertcore.train.metrics_log import MetricsLog  # noqa: E402
from bertcore.model.bert import BertForPreTraining  # noqa: E402
from bertcore.model.pretrained import load_into, model_config, read_weights  # noqa: E402
from bertcore.vocab.tokenizer import TOKENIZER_FILES  # noqa: E402
from bertcore.vocab.config import VocabConfig  # noqa: E402
from pipelines.runner import run_stage  # noqa: E402
from pipelines.storage import Storage  # noqa: E402

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
    config = transformers.BertConfig(vocab_size=len(info["tokens"]), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(11)
    transformers.BertModel(config).save_pretrained(str(teacher))
    for name in TOKENIZER_FILES:
        shutil.copyfile(root / "vocab" / name, teacher / name)
    manifest = json.loads((root / "vocab" / "_manifest.json").read_text())
    manifest["config"] = VocabConfig.model_validate({**manifest["config"], "source": "pretrained", "pretrained": str(teacher)}).model_dump(mode="json")
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

    lines = [line for line in (gensim_data / "lee_background.cor").read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    docs = [[s.strip() for s in line.split(". ") if s.strip()] for line in lines[-20:]]
    table = pa.table({"doc_id": [f"d{i}" for i in range(len(docs))], "source": ["news"] * len(docs), "title": [""] * len(docs), "sentences": docs})
    path = root / "corpus" / "validation" / "part-00000.arrow"
    path.parent.mkdir(parents=True)
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    shard = {"path": "validation/part-00000.arrow", "rows": len(docs), "bytes": path.stat().st_size,
             "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "extra": {}}
    manifest = {**like, "stage": "corpus", "fingerprint": "corpus-test", "config": CorpusConfig(inputs=["unused.txt"]).model_dump(mode="json"),
                "shards": [shard], "stats": {}}
    (root / "corpus" / "_manifest.json").write_text(json.dumps(manifest))


def section(teacher: Path, **overrides) -> DistillConfig:
    fields = dict(
        enabled=True, teacher=str(teacher), student={"num_hidden_layers": 2}, loss={"attention": 1.0},
        num_workers=1, learning_rate=1e-3, warmup_steps=5, phases=[{"name": "seq64", "steps": 30, "batch_size": 16, "max_seq_length": 64}],
        checkpoint_every=10, validation_batches=2, eval_every=10, torch_threads=1,
    )
    return DistillConfig.model_validate({**fields, **overrides})


def _fresh_root(inputs, target: Path) -> Path:
    root, _ = inputs
    for part in (*READS, "corpus"):
        shutil.copytree(root / part, target / part)
    return target


def _student(root: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(root / "distill" / "model" / "model.safetensors"))


@pytest.mark.slow
def test_a_student_is_distilled_from_a_bertmodel_teacher_and_exported_for_transformers(ray_cluster, inputs, tmp_path):
    _, teacher = inputs
    root = _fresh_root(inputs, tmp_path / "run")
    manifest, computed = run_stage("distill", section(teacher), root=str(root), storage=STORAGE, seed=SEED, reads=READS)
    assert computed and manifest.stats["steps"] == 30
    stats = manifest.stats
    assert stats["teacher"]["has_mlm_head"] is False and "soft-target loss" in stats["notes"][0]
    assert stats["layer_map"] == [2, 4] and stats["student"]["layers"] == 2 and stats["init"]["from_teacher"]["layers"] == [2, 4]
    assert stats["final"]["soft_target_loss"] is None and stats["final"]["attention_loss"] is not None
    records = MetricsLog(str(root / "distill" / "metrics.jsonl")).records()
    assert records[-1]["loss"] < records[0]["loss"] and all(r["hidden_loss"] > 0 for r in records)
    assert [r["step"] for r in MetricsLog(str(root / "distill" / "validation.jsonl")).records()] == [10, 20, 30]
    assert manifest.headline["student"].startswith("2x32") and manifest.headline["teacher"].startswith("4x32")

    # the export: pretrain/model/'s layout, a BertForMaskedLM that transformers loads and that computes what ours does
    model_dir = root / "distill" / "model"
    assert sorted(os.listdir(model_dir)) == sorted(HF_FILES)
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    theirs = transformers.BertForMaskedLM.from_pretrained(str(model_dir)).eval()
    ours = BertForPreTraining(model_config(str(model_dir)), torch.Generator().manual_seed(0)).eval()
    load_into(ours, read_weights(str(model_dir)))
    ids = torch.randint(5, 500, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs.bert(ids).last_hidden_state
        assert torch.allclose(ours.bert(ids), expected, atol=1e-5)
    # its second layer started as the teacher's fourth and then trained: moved, but nearer it than the teacher's third
    teacher_weights = read_weights(str(teacher))
    trained = _student(root)["bert.encoder.layer.1.output.dense.weight"]
    start, other = teacher_weights["bert.encoder.layer.3.output.dense.weight"], teacher_weights["bert.encoder.layer.2.output.dense.weight"]
    assert not torch.equal(start, trained) and (trained - start).abs().mean() < (trained - other).abs().mean() / 2

    again, computed = run_stage("distill", section(teacher), root=str(root), storage=STORAGE, seed=SEED, reads=READS)
    assert not computed and again.fingerprint == manifest.fingerprint
    from flows.inspect import Options, inspect

    data, lines = inspect(STORAGE, str(root), "distill", Options())
    assert lines[0].startswith("distill: 30 steps under") and [c["step"] for c in data["checkpoints"]] == [10, 20, 30]
    assert {f["file"] for f in data["model"]["files"]} == set(HF_FILES)
    _evaluate_three_ways(root, teacher, tmp_path)


def _evaluate_three_ways(root: Path, teacher: Path, tmp_path: Path) -> None:
    """The evaluate stage after distillation: teacher, student and a student-sized random
    init on a word-similarity task and an STS file, the speed of each, and the lines on what
    the student keeps."""
    from bertcore.eval.config import EvaluateConfig
    from bertcore.sample_data import gensim_data_dir

    sts = tmp_path / "sts.tsv"
    pairs = [("the minister said", "the minister told", 4.5), ("fire crews fought", "the fires burned", 3.0), ("the bank rates", "a cricket match", 0.5),
             ("police said", "the police told", 4.0), ("the talks ended", "the match began", 1.0), ("oil prices rose", "the price of oil rose", 4.8)]
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{score}\n" for a, b, score in pairs))
    cfg = EvaluateConfig.model_validate({
        "tasks": [{"name": "wordsim353", "type": "word_similarity", "format": "word_pairs", "validation": str(gensim_data_dir() / "wordsim353.tsv"),
                   "seeds": [1, 2, 3]}],
        "embeddings": {"sentences": 40, "num_pairs": 100, "max_seq_length": 64, "sts": {"file": str(sts)}},
        "intrinsic": {"max_batches": 2, "fill_mask": 0},
        "speed": {"batch_size": 4, "max_seq_length": 32, "passes": 2},
    })
    manifest, computed = run_stage("evaluate", cfg, root=str(root), storage=STORAGE, seed=SEED, reads=EVALUATE_READS)
    metrics = json.loads((root / "eval" / "metrics.json").read_text())
    assert computed and metrics["subject"] == "student"
    assert metrics["models"]["teacher"]["uri"] == str(teacher) and metrics["models"]["student"]["uri"].endswith("distill/model")
    assert metrics["models"]["random_init"]["random_init"] and metrics["models"]["random_init"]["config"]["num_hidden_layers"] == 2
    task = metrics["tasks"]["wordsim353"]
    assert task["student"]["runs"][0]["seed"] == 1 and len(task["random_init"]["runs"]) == 3 and len(task["teacher"]["runs"]) == 1
    assert set(metrics["embeddings"]) >= {"teacher", "student", "random_init"} and metrics["embeddings"]["sts_pairs"] == 6
    assert set(metrics["speed"]) == {"teacher", "student", "random_init"} and all(s["sequences_per_s"] > 0 for s in metrics["speed"].values())
    assert "nsp_accuracy" not in metrics["intrinsic"]["seq64"]["student"]  # exported without an NSP head
    lines = [line for line in metrics["verdicts"] if "the teacher's gain" in line or "nothing to keep" in line]
    assert [line.split(" (")[0] for line in lines] == ["wordsim353", "STS", "STS"] and all("x its speed" in line for line in lines)
    assert lines == manifest.stats["verdicts"][-3:]
    assert "## Distillation: teacher, student, random init" in (root / "eval" / "report.md").read_text()


@pytest.mark.slow
def test_a_sigkilled_distillation_resumes_to_the_student_of_an_uninterrupted_run(ray_cluster, inputs, tmp_path):
    _, teacher = inputs
    cfg = section(teacher, phases=[{"name": "seq64", "steps": 40, "batch_size": 16, "max_seq_length": 64}], validation_batches=0)
    reference_root, killed_root = _fresh_root(inputs, tmp_path / "reference"), _fresh_root(inputs, tmp_path / "killed")
    run_stage("distill", cfg, root=str(reference_root), storage=STORAGE, seed=SEED, reads=READS)

    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, ray_cluster.get_runtime_context().gcs_address, str(killed_root), cfg.model_dump_json(),
         str(SEED), "distill", ",".join(READS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    first_marker = killed_root / "distill" / CHECKPOINTS / checkpoint_tag(10) / COMPLETE
    log = killed_root / "distill" / "metrics.jsonl"
    sigkill_when(process, lambda: first_marker.exists() and len(MetricsLog(str(log)).records()) >= 14)
    _wait_for_idle_workers(ray_cluster, cpus=2)
    assert 14 <= len(MetricsLog(str(log)).records()) < 40, "the kill did not land in the middle of the run"
    assert not (killed_root / "distill" / "model").exists()

    resumed, computed = run_stage("distill", cfg, root=str(killed_root), storage=STORAGE, seed=SEED, reads=READS)
    assert computed and resumed.stats["steps"] == 40

    def trajectory(root):
        return [(r["step"], r["data_hash"], r["loss"]) for r in MetricsLog(str(root / "distill" / "metrics.jsonl")).records()]

    assert trajectory(killed_root) == trajectory(reference_root)
    reference, after = _student(reference_root), _student(killed_root)
    assert sorted(after) == sorted(reference)
    assert all(torch.equal(after[name], reference[name]) for name in reference), "the resumed student differs from the uninterrupted one"
