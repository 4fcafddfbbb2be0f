"""`bertpipe export --format onnx`: a tiny BERT (random weights, a vocabulary trained here)
laid out as the pretrain stage leaves it, exported to fp32 and int8 ONNX, checked with ONNX
Runtime against PyTorch; the manifest records the figures; a fine-tuned task model saved
as the evaluate stage saves it becomes a logits output; user errors are one line.

The run root is written directly (tests/support/tiny_run.py: corpus validation shard,
pretrain/model/, eval/heads/ and their manifests) instead of running the stages: the export
reads nothing else."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import onnxruntime  # noqa: F401 - the onnx extra is part of dev: without it these tests fail, not skip
import pytest
import torch
import yaml

from bertcore.config import StorageConfig
from pipelines.storage import Storage, sha256_file
from tiny_run import news_sentences, write_run_root

torch.set_num_threads(1)

CHECK_SENTENCES = 40
TASK = "sentiment"


def _recipe(tmp_path, root: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump({"run": {"root": root, "seed": 7}, "corpus": {"inputs": ["unused.txt"]}}), encoding="utf-8"
    )
    return str(path)


@pytest.fixture(scope="module")
def run_root(tmp_path_factory, gensim_data) -> str:
    root = str(tmp_path_factory.mktemp("onnx-run"))
    write_run_root(root, news_sentences(gensim_data), task=TASK)
    return root


@pytest.fixture(scope="module")
def config(run_root):
    from pipelines.registry import parse_config

    return parse_config({"run": {"root": run_root, "seed": 7}, "corpus": {"inputs": ["unused.txt"]}})


@pytest.fixture(scope="module")
def encoder_export(config, run_root):
    """The pretrained encoder exported with int8 (the default stage, no head)."""
    from pipelines.export.onnx import export_onnx

    return export_onnx(
        config, Storage(StorageConfig()), int8=True, sentences=CHECK_SENTENCES, resolved_config="run: {}\n"
    )


def _hf_encoder(run_root):
    from transformers import BertModel

    return BertModel.from_pretrained(os.path.join(run_root, "pretrain", "model")).eval()


def test_fp32_export_matches_pytorch_on_any_batch_and_length(encoder_export, run_root):
    import onnx

    from bertcore.inference.onnx import session

    out, manifest = encoder_export
    assert out == os.path.join(run_root, "onnx", "pretrain")
    graph = onnx.load(os.path.join(out, "model.onnx")).graph
    for tensor in graph.input:  # batch and sequence are symbolic, not the traced 3 x N
        dims = tensor.type.tensor_type.shape.dim
        assert [d.dim_param != "" for d in dims] == [True, True], tensor.name
    assert [o.name for o in graph.output] == ["last_hidden_state", "pooler_output"]
    # ONNX Runtime's BERT fusions found every layer: one Attention node each, the
    # embeddings with their LayerNorm, two residual LayerNorms and a bias GELU per layer
    fused = manifest.stats["fusions"]
    assert fused["Attention"] == 2 and fused["EmbedLayerNormalization"] == 1, fused
    assert fused["SkipLayerNormalization"] == 4 and fused["BiasGelu"] == 2, fused
    assert sum(n.op_type == "Softmax" for n in graph.node) == 0  # no attention left unfused

    reference = _hf_encoder(run_root)
    onnx_session = session(os.path.join(out, "model.onnx"), threads=1)
    rng = np.random.default_rng(0)
    for batch, length in ((1, 5), (4, 37), (2, 64)):
        ids = rng.integers(5, reference.config.vocab_size, (batch, length))
        mask = np.ones_like(ids)
        mask[0, length // 2 :] = 0  # padding in the first row
        types = np.zeros_like(ids)
        types[:, length // 3 :] = 1
        got = onnx_session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        with torch.no_grad():
            want = reference(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                token_type_ids=torch.from_numpy(types),
            )
        real = mask.astype(bool)
        assert np.abs(got[0][real] - want.last_hidden_state.numpy()[real]).max() < 1e-4, (batch, length)
        assert np.abs(got[1] - want.pooler_output.numpy()).max() < 1e-4


def test_manifest_records_files_source_and_figures(encoder_export, run_root):
    import onnx

    from bertcore.train.export import MODEL_DIR

    out, manifest = encoder_export
    on_disk = json.load(open(os.path.join(out, "_manifest.json"), encoding="utf-8"))
    assert on_disk["fingerprint"] == manifest.fingerprint and on_disk["stage"] == "export-onnx"
    files = {s["path"]: s for s in on_disk["shards"]}
    assert {"model.onnx", "model.int8.onnx", "config.json", "vocab.txt", "tokenizer.json"} <= set(files)
    for name, record in files.items():
        assert (
            sha256_file(os.path.join(out, name)) == record["sha256"]
            and os.path.getsize(os.path.join(out, name)) == record["bytes"]
        )
    for name, quantized in (
        ("model.onnx", False),
        ("model.int8.onnx", True),
    ):  # int8: every weight product, none left fp32
        graph = onnx.load(os.path.join(out, name)).graph
        weights = {tensor.name for tensor in graph.initializer}
        assert any(n.op_type == "MatMul" and n.input[1] in weights for n in graph.node) != quantized
        assert any(n.op_type == "MatMulInteger" for n in graph.node) == quantized
    source = on_disk["inputs"]["source"]
    assert source["stage"] == "pretrain" and source["fingerprint"] == "pretrain-test-fp"
    assert source["weights_sha256"] == sha256_file(os.path.join(run_root, "pretrain", MODEL_DIR, "model.safetensors"))
    assert on_disk["config"]["quantize"] == "int8" and on_disk["inputs"]["head"] is None

    stats = on_disk["stats"]
    assert stats["sample"]["sentences"] == CHECK_SENTENCES and stats["sample"]["tokens"] > CHECK_SENTENCES * 5
    fp32 = stats["checks"]["fp32"]
    assert 0 < fp32["max_abs_diff"]["last_hidden_state"] < 1e-4 and fp32["tolerance"] == 1e-3
    int8 = stats["checks"]["int8"]
    # the model folder has an MLM head: int8's masked-token predictions against fp32's
    assert int8["argmax"].startswith("masked-LM") and int8["compared"] >= CHECK_SENTENCES
    assert 0.5 <= int8["agreement"] <= 1.0 and int8["meets_goal"] == (int8["agreement"] >= 0.99)
    assert 0.9 < int8["embedding_cosine"]["min"] <= int8["embedding_cosine"]["mean"] <= 1.0 + 1e-6
    assert 0 < int8["max_abs_diff"]["last_hidden_state"] < 1.0  # int8 moves the numbers, a little
    assert stats["versions"]["onnxruntime"] != "not installed"
    assert open(os.path.join(out, "_config.yaml"), encoding="utf-8").read() == "run: {}\n"


def test_task_head_export_gives_the_fine_tuned_models_logits(config, run_root):
    from bertcore.eval.heads import load_task_model
    from bertcore.inference.onnx import session
    from pipelines.export.onnx import export_onnx

    out, manifest = export_onnx(config, Storage(StorageConfig()), task=TASK, int8=True, sentences=CHECK_SENTENCES)
    assert out == os.path.join(run_root, "onnx", f"pretrain-{TASK}")
    assert manifest.stats["outputs"] == ["last_hidden_state", "pooler_output", "logits"]
    head = manifest.inputs["head"]
    assert head["task"] == TASK and head["sha256"] == sha256_file(
        os.path.join(run_root, "eval", "heads", "pretrained", f"{TASK}.safetensors")
    )
    assert manifest.stats["head"]["labels"] == ["neg", "pos"] and manifest.stats["sample"]["max_length"] == 48
    checks = manifest.stats["checks"]
    assert checks["fp32"]["max_abs_diff"]["logits"] < 1e-4
    assert (
        checks["int8"]["argmax"] == f"task head ({TASK}, classification)"
        and checks["int8"]["compared"] == CHECK_SENTENCES
    )

    model, _ = load_task_model(
        os.path.join(run_root, "eval", "heads", "pretrained", f"{TASK}.safetensors"),
        os.path.join(run_root, "pretrain", "model"),
    )
    ids = torch.randint(5, 300, (3, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        want = model(ids, mask, torch.zeros_like(ids)).numpy()
    got = session(os.path.join(out, "model.onnx"), threads=1).run(
        ["logits"],
        {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros((3, 11), np.int64)},
    )[0]
    assert got.shape == (3, 2) and np.abs(got - want).max() < 1e-4


def test_int8_checks_without_any_head_compare_nearest_neighbours():
    from bertcore.inference import checks

    rng = np.random.default_rng(0)
    reference = rng.normal(size=(20, 8))
    assert checks.agreement(checks.neighbours(reference), checks.neighbours(reference + 1e-6))["agreement"] == 1.0
    shuffled = checks.neighbours(rng.normal(size=(20, 8)))
    assert checks.agreement(checks.neighbours(reference), shuffled)["agreement"] < 0.5
    assert checks.cosines(reference, reference)["min"] == pytest.approx(1.0)


def _cli(*args: str):
    from typer.testing import CliRunner

    from flows.cli import app

    return CliRunner().invoke(app, list(args))


def _one_error_line(result, expected: str) -> None:
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("bertpipe: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--quantize", "int8"], "--quantize need"),
        (["--format", "hf", "--task", "x"], "--task need"),
        (["--format", "onnx", "--quantize", "int4"], "--quantize int4: the one quantization is int8"),
        (["--format", "onnx", "--step", "3"], "--step is for --format hf"),
        (["--format", "onnx", "--stage", "vocab"], "--stage vocab: ONNX export reads a model folder"),
        (["--format", "onnx", "--task", "ner"], "--task ner: the evaluate stage under"),
    ],
)
def test_cli_errors_are_one_line(args, expected, run_root, tmp_path):
    _one_error_line(_cli("export", "-c", _recipe(tmp_path, run_root), *args), expected)


def test_cli_without_onnxruntime_says_what_to_install(run_root, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    _one_error_line(
        _cli("export", "-c", _recipe(tmp_path, run_root), "--format", "onnx"), "pip install 'bertpipe[onnx]'"
    )


def test_cli_export_fails_in_one_line_when_fp32_differs_beyond_the_tolerance(run_root, tmp_path):
    out = tmp_path / "strict"
    result = _cli(
        "export",
        "-c",
        _recipe(tmp_path, run_root),
        "--format",
        "onnx",
        "--out",
        str(out),
        "--tolerance",
        "1e-12",
        "--check-sentences",
        "8",
    )
    _one_error_line(result, "the fp32 ONNX graph differs from PyTorch by")
    assert "tolerance 1e-12" in result.stderr
    assert not (out / "_manifest.json").exists()  # nothing published as complete


def test_a_re_export_replaces_only_the_files_its_own_manifest_lists(run_root, tmp_path):
    """The CLI writes again into a folder an earlier export made; a file the user put there
    stays, a file the earlier manifest listed and this export does not write goes."""
    out = tmp_path / "exported"
    args = [
        "export",
        "-c",
        _recipe(tmp_path, run_root),
        "--format",
        "onnx",
        "--out",
        str(out),
        "--check-sentences",
        "8",
    ]
    first = _cli(*args)
    assert first.exit_code == 0, first.output
    (out / "NOTES.txt").write_text("mine")
    (out / "model.int8.onnx").write_text("an earlier int8 file")
    manifest = json.loads((out / "_manifest.json").read_text())
    manifest["shards"].append({**manifest["shards"][0], "path": "model.int8.onnx"})
    (out / "_manifest.json").write_text(json.dumps(manifest))
    again = _cli(*args)
    assert again.exit_code == 0, again.output
    assert (out / "NOTES.txt").read_text() == "mine" and not (out / "model.int8.onnx").exists()
    assert "model.int8.onnx" not in {s["path"] for s in json.loads((out / "_manifest.json").read_text())["shards"]}


def test_the_default_stage_is_the_last_model_stage_the_recipe_runs():
    from types import SimpleNamespace

    from pipelines.export import onnx as onnx_export

    assert onnx_export.EXPORTABLE == ("pretrain", "distill")
    assert onnx_export.default_stage(SimpleNamespace(off={})) == "distill"
    assert onnx_export.default_stage(SimpleNamespace(off={"distill": "no distill section"})) == "pretrain"
    assert onnx_export.default_stage(SimpleNamespace(off={"pretrain": "an external teacher"})) == "distill"
