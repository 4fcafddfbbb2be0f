"""The student of an embedding teacher is an embedding model: a tiny BertModel teacher (no MLM
head) written here with the sentence-transformers files of a published embedding model,
its student exported from the distill objective's start, and that folder loaded as users
load the teacher: `SentenceTransformer(path)` with the teacher's pooling and vectors equal
to bertpipe's own, and transformers' AutoModel with nothing missing or unexpected. Also
how the layout is read (a teacher without those files: mean pooling; modules the student
cannot have: left out and said so) and the line the run prints on how to load it."""

from __future__ import annotations

import json
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers

from bertcore.distill.config import DistillLoss, StudentConfig
from bertcore.distill.objective import Distillation, exportable_state
from bertcore.distill.student import student_config
from bertcore.errors import InputDataError
from bertcore.eval.embeddings import embed
from bertcore.eval.encoder import load_encoder, load_tokenizer
from bertcore.model import sentence_files
from bertcore.model.pretrained import model_config, read_weights
from bertcore.train.export import HF_FILES, export_checkpoint
from bertcore.vocab.config import VocabConfig
from bertcore.vocab.tokenizer import save_tokenizer, train_wordpiece

SENTENCES = [
    "the minister said the talks would go on",
    "fire crews fought the blaze through the night",
    "oil prices rose again on monday",
    "the match was called off after rain",
    "police said two men were arrested",
]
ST_FILES = ["modules.json", "sentence_bert_config.json", "1_Pooling/config.json"]


def _teacher(folder, modules: list[dict] | None, pooling: dict | None = None, settings: dict | None = None) -> str:
    """A 4-layer BertModel (no MLM head, like all-MiniLM-L6-v2) on a vocabulary trained
    here, with the sentence-transformers files given."""
    cfg = VocabConfig(vocab_size=120, bert_layout=False, limit_alphabet=60)
    save_tokenizer(train_wordpiece(SENTENCES * 4, cfg), cfg, str(folder))
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(7)
    transformers.BertModel(config).save_pretrained(str(folder))
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if settings is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    return str(folder)


def _modules(*kinds: str) -> list[dict]:
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    return [
        {"idx": i, "name": str(i), "path": paths[k], "type": f"sentence_transformers.models.{k}"}
        for i, k in enumerate(kinds)
    ]


CLS_POOLING = {
    "word_embedding_dimension": 32,
    "pooling_mode_cls_token": True,
    "pooling_mode_mean_tokens": False,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
}


def _student(teacher: str, out) -> str:
    """The 2-layer student the distill objective starts from (teacher layers 2 and 4),
    exported as the distill stage exports the student of a teacher without an MLM head."""
    teacher_cfg = model_config(teacher)
    student_cfg = student_config(StudentConfig(num_hidden_layers=2), teacher_cfg)
    objective = Distillation(student_cfg, teacher_cfg, read_weights(teacher), [2, 4], DistillLoss(soft_targets=0.0))
    state = exportable_state(objective.build(torch.Generator().manual_seed(0), torch.device("cpu")).state_dict())
    export_checkpoint(state, student_cfg, teacher, str(out), nsp=False, sentence=sentence_files.read_layout(teacher))
    return str(out)


def _no_load_report(folder: str) -> None:
    """transformers' AutoModel loads the folder with no missing, unexpected or resized
    weight and logs nothing about it."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        _, info = transformers.AutoModel.from_pretrained(folder, output_loading_info=True)
    finally:
        logger.removeHandler(handler)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set(), info
    assert not [r.getMessage() for r in records]


def _kinds(model) -> list[str]:
    return [type(module).__name__ for module in model]


def _pooling(model) -> dict:
    """How the loaded model pools, as sentence-transformers (6.x) says it."""
    config = next(module for module in model if type(module).__name__ == "Pooling").get_config_dict()
    return {key: config[key] for key in ("pooling_mode", "embedding_dimension")}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_student_of_an_embedding_teacher_loads_in_sentence_transformers_with_the_teachers_pooling(tmp_path):
    from sentence_transformers import SentenceTransformer

    teacher = _teacher(
        tmp_path / "teacher",
        _modules("Transformer", "Pooling", "Normalize"),
        CLS_POOLING,
        {"max_seq_length": 48, "do_lower_case": False},
    )
    folder = _student(teacher, tmp_path / "student")
    assert sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files
    ) == sorted([*HF_FILES, *ST_FILES])
    assert json.loads((tmp_path / "student" / "config.json").read_text())["architectures"] == ["BertModel"]
    _no_load_report(folder)

    model = SentenceTransformer(folder, device="cpu")
    assert _pooling(model) == {"pooling_mode": "cls", "embedding_dimension": 32} and "Normalize" in _kinds(model)
    assert model.max_seq_length == 48
    theirs = model.encode(SENTENCES, convert_to_numpy=True)
    ours = embed(load_encoder(folder), load_tokenizer(folder), SENTENCES, pooling="cls", max_seq_length=48)
    assert _cosines(theirs, ours).min() >= 0.999
    assert np.allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)  # the teacher's Normalize came along


def test_a_teacher_without_sentence_transformers_files_gets_mean_pooling(tmp_path):
    from sentence_transformers import SentenceTransformer

    teacher = _teacher(tmp_path / "teacher", None)
    layout = sentence_files.read_layout(teacher)
    assert (layout.source, layout.pooling_name, layout.normalize) == ("default", "mean", False)
    folder = _student(teacher, tmp_path / "student")
    _no_load_report(folder)
    model = SentenceTransformer(folder, device="cpu")
    assert _pooling(model) == {"pooling_mode": "mean", "embedding_dimension": 32} and _kinds(model) == [
        "Transformer",
        "Pooling",
    ]
    assert model.max_seq_length == 64  # the model's positions
    ours = embed(load_encoder(folder), load_tokenizer(folder), SENTENCES, pooling="mean", max_seq_length=64)
    assert _cosines(model.encode(SENTENCES, convert_to_numpy=True), ours).min() >= 0.999


def test_modules_the_student_cannot_have_are_left_out_and_a_module_path_may_not_leave_the_folder(tmp_path):
    teacher = _teacher(tmp_path / "teacher", _modules("Transformer", "Pooling", "Dense", "Normalize"), CLS_POOLING)
    layout = sentence_files.read_layout(teacher)
    assert (
        layout.left_out == ["sentence_transformers.models.Dense"] and layout.normalize and layout.pooling_name == "cls"
    )
    folder = _student(teacher, tmp_path / "student")
    written = json.loads((tmp_path / "student" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in written] == ["Transformer", "Pooling", "Normalize"] and os.path.isdir(
        folder
    )
    assert sentence_files.listed_files(sentence_files.parse_modules(written, "modules.json")) == [
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
    ]

    (tmp_path / "teacher" / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "../elsewhere"}])
    )
    with pytest.raises(InputDataError, match=r"modules.json: module path '\.\./elsewhere' leaves the folder"):
        sentence_files.read_layout(teacher)


def test_the_run_says_how_to_load_an_embedding_student():
    from flows.summary import next_commands

    summaries = [{"stage": "distill", "model": "/runs/distill/distill/model", "model_kind": "sentence-transformers"}]
    lines = next_commands(summaries, "/runs/distill", "configs/distill.yaml", [])
    assert lines[0] == (
        'load the student: SentenceTransformer("/runs/distill/distill/model")  (sentence-transformers; its '
        "encoder alone: AutoModel)"
    )
    summaries[0]["model_kind"] = "masked-lm"
    assert next_commands(summaries, "/runs/distill", None, [])[0].startswith(
        "load the student: AutoModelForMaskedLM.from_pretrained("
    )
