"""The modern family downstream of pretraining, on a tiny ModernBertForMaskedLM folder as
transformers saves it: fine-tuning reads it through AutoModel for every task shape (a
pooled label, a tag per token, QA spans over windows), `long_inputs: whole` reads an input
up to the model's own length, its ONNX export (fp32 and int8) computes what PyTorch does,
and the serving engine's embeddings and masked words are the model's own on either runtime."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from bertcore.eval import finetune
from bertcore.eval.tasks import TaskConfig
from test_eval_end_to_end import _conll, _corpus, _good_rows, _ner_sentences, _qa_items, _squad, _write_tsv
from tiny_bert import save_tiny_bert

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def modern(tmp_path_factory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("modern"), _corpus(), vocab_size=300, max_positions=512, modern=True)


def test_every_task_shape_fine_tunes_on_the_modern_encoder(modern, tmp_path):
    good = TaskConfig(
        name="contains-good",
        type="classification",
        format="tsv",
        train=_write_tsv(tmp_path / "train.tsv", ("sentence", "label"), _good_rows(1, 64)),
        validation=_write_tsv(tmp_path / "dev.tsv", ("sentence", "label"), _good_rows(2, 32)),
        labels=["neg", "pos"],
        positive_label="pos",
        epochs=8,
        batch_size=16,
        learning_rate=3e-3,
        max_seq_length=32,
        pooling="mean",
    )
    result = finetune.run_task(good, modern, modern, seed=1, random_init=False)
    assert result["validation"]["accuracy"] >= 0.8, result["validation"]  # majority: 0.5
    assert result["pooler"] == "fresh"  # ModernBERT has no pooler
    ner = TaskConfig(
        name="ner",
        type="token_classification",
        format="conll",
        train=_conll(tmp_path / "ner-train.txt", _ner_sentences(1, 40)),
        validation=_conll(tmp_path / "ner-dev.txt", _ner_sentences(2, 12)),
        labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
        epochs=6,
        batch_size=8,
        learning_rate=3e-3,
        max_seq_length=32,
    )
    assert finetune.run_task(ner, modern, modern, seed=1, random_init=False)["validation"]["f1"] >= 0.8
    qa = TaskConfig(
        name="qa",
        type="qa",
        format="squad",
        train=_squad(tmp_path / "qa-train.json", _qa_items(1, 48, False)),
        validation=_squad(tmp_path / "qa-dev.json", _qa_items(2, 16, False)),
        epochs=3,
        batch_size=8,
        learning_rate=3e-3,
        max_seq_length=32,
        doc_stride=12,
        max_query_length=10,
        max_answer_length=5,
    )
    scores = finetune.run_task(qa, modern, modern, seed=1, random_init=False)["validation"]
    assert 0.0 <= scores["exact_match"] <= scores["f1"] <= 1.0


def test_long_inputs_whole_reads_up_to_the_models_length(modern, tmp_path):
    rows = [
        (" ".join(["the good movie was really quite long"] * 30) if i % 2 else "a bad film", "pos" if i % 2 else "neg")
        for i in range(16)
    ]
    fields = dict(
        name="long",
        type="classification",
        format="tsv",
        train=_write_tsv(tmp_path / "long.tsv", ("sentence", "label"), rows),
        validation=_write_tsv(tmp_path / "long-dev.tsv", ("sentence", "label"), rows),
        labels=["neg", "pos"],
        epochs=1,
        batch_size=8,
        max_seq_length=64,
    )
    cut = finetune.run_task(TaskConfig(**fields), modern, modern, seed=1, random_init=False)
    whole = finetune.run_task(TaskConfig(**fields, long_inputs="whole"), modern, modern, seed=1, random_init=False)
    assert cut["long_inputs"]["validation"]["longer"] == 8  # 210 tokens against a window of 64
    assert whole["long_inputs"]["validation"]["longer"] == 0  # the model's 512 positions hold them


def test_onnx_export_and_serving_compute_what_pytorch_does(modern, tmp_path):
    from bertcore.eval.intrinsic import load_pretraining_model
    from bertcore.inference.engine import Engine, EngineSpec, Reading
    from bertcore.inference.export import export_folder
    from bertcore.inference.validate import Job

    sentences = [line for line in _corpus() if len(line.split()) > 4][:24]
    report = export_folder(modern, str(tmp_path / "onnx"), sentences, int8=True, max_length=64)
    assert report["checks"]["fp32"]["max_abs_diff"]["last_hidden_state"] < 1e-4
    int8 = report["checks"]["int8"]
    assert int8["argmax"].startswith("masked-LM prediction") and int8["compared"] > 0 and int8["agreement"] >= 0.8
    ours = load_pretraining_model(modern)
    texts = ("alice lives in [MASK] and alice likes paris .", "the good movie was [MASK] long")
    results = {}
    for runtime in ("torch", "onnx"):
        files = {"onnx_file": str(tmp_path / "onnx" / "model.onnx")} if runtime == "onnx" else {"torch_dir": modern}
        engine = Engine(EngineSpec(folder=modern, embed=Reading(64), mlm_dir=modern, **files))
        results[runtime], _ = engine.run(
            [Job("embed", texts, pooling="mean", normalize=False), Job("fill_mask", texts, top_k=3)]
        )
    tokenizer = engine.tokenizer
    for runtime, (embedded, filled) in results.items():
        for text, vector, per_mask in zip(texts, embedded["embeddings"], filled["predictions"]):
            batch = tokenizer(text, return_tensors="pt")
            with torch.no_grad():
                hidden = ours.encode(batch["input_ids"], attention_mask=batch["attention_mask"])[0]
            assert np.abs(np.array(vector) - hidden.mean(0).numpy()).max() < 1e-4, runtime
            position = int((batch["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0])
            want = ours.mlm_logits(hidden[position]).topk(3).indices.tolist()
            assert [t["token"] for t in per_mask[0]] == want, runtime


def test_a_modern_teacher_distils_a_modern_student_started_from_its_layers():
    from bertcore.distill.config import DistillLoss, StudentConfig
    from bertcore.distill.objective import Distillation, exportable_state
    from bertcore.distill.student import student_config
    from bertcore.model.config import ModelConfig
    from bertcore.model.modernbert import ModernBertForMaskedLM

    teacher_cfg = ModelConfig.named(
        "tiny", 300, model_type="modernbert", hidden_size=32, intermediate_size=48, local_attention=8
    )
    teacher_state = ModernBertForMaskedLM(teacher_cfg, torch.Generator().manual_seed(1)).state_dict()
    student_cfg = student_config(StudentConfig(num_hidden_layers=2), teacher_cfg)
    weights = DistillLoss(soft_targets=1.0, hidden=1.0, attention=1.0, mlm=1.0)
    objective = Distillation(student_cfg, teacher_cfg, teacher_state, [2, 3], weights)
    module = objective.build(torch.Generator().manual_seed(0), torch.device("cpu"))
    state = module.state_dict()
    assert torch.equal(state["model.layers.0.attn.Wqkv.weight"], teacher_state["model.layers.1.attn.Wqkv.weight"])
    assert "model.layers.0.attn_norm.weight" not in state  # layer 0 has none, wherever it came from
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 300, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # padded past the longest real length too: the attention maps are padded back
    mask[:, 20:] = 0
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.3, ids, -100)
    labels[mask == 0] = -100
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask, "labels": labels}
    out = objective.forward(module, batch, torch.device("cpu"))
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(out.sums[k] > 0 for k in ("soft_targets", "hidden", "attention", "mlm"))
    assert set(exportable_state(state)) == set(ModernBertForMaskedLM(student_cfg).state_dict())
