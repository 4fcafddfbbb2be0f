"""A Hugging Face model folder (the pretrain or distill stage's model/) to ONNX files in a
local folder, checked against PyTorch on held-out sentences:

    model.onnx        fp32, fused (onnx.py: inputs, outputs, dynamic axes, fusions)
    model.int8.onnx   with int8=True: ONNX Runtime's dynamic int8 quantization of it
    config.json, vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json
                      copied from the model folder, so the folder is all a server needs

`export_folder` returns what the export manifest records: the outputs, the head, the
settings, the checks (checks.py) and the time each step took. When the fp32 graph differs
from PyTorch by more than `tolerance` it raises ExportCheckFailed (one line) and the
files are not to be published.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from bertcore.errors import BertpipeError, InputDataError
from bertcore.eval import kinds

FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
ONNX_FILES = (FP32_FILE, INT8_FILE)
COPIED = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
INT8_GOAL = 0.99
"""Share of int8 predictions that should equal PyTorch fp32's (the issue's goal)."""


class ExportCheckFailed(BertpipeError):
    """The fp32 ONNX graph does not compute what the PyTorch model does."""


def inference_model(model_dir: str, head_file: str | None):
    """(InferenceModel, TaskHead or None) for the folder, with the saved task model's head."""
    from bertcore.eval.encoder import load_encoder, pooler_source
    from bertcore.inference.onnx import InferenceModel

    pooler = pooler_source(model_dir) == "pretrained"
    if head_file is None:
        return InferenceModel(load_encoder(model_dir), pooler=pooler).eval(), None
    from bertcore.eval.heads import load_task_model

    task, head = load_task_model(head_file, model_dir)
    return InferenceModel(task=task, pooler=pooler).eval(), head


def _example(tokenizer, sentences: Sequence[str], max_length: int, pairs: bool = False) -> dict:
    """The batch the exporter traces: three sentences (with `pairs`, three sentence pairs)
    padded to the longest, one column more when the length would equal the batch size or be
    1 (see onnx.export)."""
    import torch

    texts = (list(sentences) * 4)[:4]
    batch = tokenizer(
        texts[:3],
        texts[1:4] if pairs else None,
        padding=True,
        truncation=True,
        max_length=max_length,
        return_token_type_ids=True,
        return_tensors="pt",
    )
    batch = {name: batch[name].long() for name in ("input_ids", "attention_mask", "token_type_ids")}
    if batch["input_ids"].shape[1] in (1, 3):
        pad = tokenizer.pad_token_id or 0
        batch = {
            name: torch.nn.functional.pad(t, (0, 1), value=pad if name == "input_ids" else 0)
            for name, t in batch.items()
        }
    return batch


class MaskedLMHead:
    """hidden states (..., H) -> masked-LM scores (..., V) through a family model's head."""

    def __init__(self, model):
        self.model = model

    def __call__(self, hidden):
        import torch

        with torch.no_grad():
            return self.model.mlm_logits(hidden)


def mlm_head(model_dir: str) -> MaskedLMHead | None:
    """The folder's masked-LM head (bertcore's model of its family, bertcore/model/families/,
    used from the last hidden states on), or None when its weights hold none."""
    from bertcore.eval.intrinsic import load_pretraining_model
    from bertcore.model.folder import check_model_folder

    if not check_model_folder(model_dir, "the model folder").has_mlm_head:
        return None
    return MaskedLMHead(load_pretraining_model(model_dir))


def export_folder(
    model_dir: str,
    out_dir: str,
    sentences: Sequence[str],
    *,
    head_file: str | None = None,
    int8: bool = False,
    tolerance: float = 1e-3,
    max_length: int = 128,
    batch_size: int = 16,
    seed: int = 0,
) -> dict:
    """Export `model_dir` (with the saved task model `head_file`) to `out_dir` and check it
    on `sentences` (held-out text, at most `max_length` tokens each); returns the report."""
    from bertcore.eval.encoder import load_tokenizer
    from bertcore.inference import checks, onnx

    if not sentences:
        raise InputDataError(
            "no held-out sentences to check the ONNX export on (the corpus stage's validation split is empty)"
        )
    onnx.require()
    timings: dict[str, float] = {}
    model, head = inference_model(model_dir, head_file)
    tokenizer = load_tokenizer(model_dir)
    max_length = min(
        max_length, model.encoder.config.max_position_embeddings, head.max_seq_length if head else max_length
    )
    pairs = bool(head and head.pairs)  # traced and checked on pairs: token types 0 and 1 both reach the graph
    batches = checks.tokenize(tokenizer, sentences, max_length=max_length, batch_size=batch_size, pairs=pairs)
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    fusions = onnx.export(model, os.path.join(out_dir, FP32_FILE), _example(tokenizer, sentences, max_length, pairs))
    timings["export_s"] = round(time.perf_counter() - started, 3)

    started = time.perf_counter()
    reference = checks.torch_outputs(model, batches)
    fp32 = checks.onnx_outputs(onnx.session(os.path.join(out_dir, FP32_FILE)), batches)
    per_token = ["last_hidden_state"] + (["logits"] if head and not kinds.get(head.type).pooled else [])
    differences = checks.max_differences(reference, fp32, batches, per_token)
    report = {
        "outputs": model.output_names,
        "fusions": fusions,
        "head": asdict(head) if head else None,
        "sample": {
            "sentences": len(sentences),
            "pairs": pairs,
            "tokens": int(sum(b["attention_mask"].sum() for b in batches)),
            "max_length": max_length,
            "batch_size": batch_size,
        },
        "checks": {"fp32": {"max_abs_diff": differences, "tolerance": tolerance}},
    }
    worst = max(differences, key=differences.get)
    if differences[worst] > tolerance:
        raise ExportCheckFailed(
            f"the fp32 ONNX graph differs from PyTorch by {differences[worst]:.2e} in {worst} on "
            f"{len(sentences)} held-out sentences "
            f"(tolerance {tolerance:g}): the export is wrong; please report it (--tolerance sets the limit)"
        )
    if int8:
        onnx.quantize_int8(os.path.join(out_dir, FP32_FILE), os.path.join(out_dir, INT8_FILE))
        report["checks"]["int8"] = _int8_checks(
            model, head, model_dir, tokenizer, batches, reference, os.path.join(out_dir, INT8_FILE), seed
        )
    timings["checks_s"] = round(time.perf_counter() - started, 3)
    for name in COPIED:
        if os.path.isfile(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, name))
    report["timings"] = timings
    return report


def _int8_checks(model, head, model_dir: str, tokenizer, batches, reference, path: str, seed: int) -> dict:
    """The int8 figures of checks.py's module docstring."""
    from bertcore.inference import checks, onnx

    session = onnx.session(path)
    got = checks.onnx_outputs(session, batches)
    figures: dict = {
        "max_abs_diff": checks.max_differences(reference, got, batches),
        "embedding_cosine": checks.cosines(checks.mean_pooled(reference, batches), checks.mean_pooled(got, batches)),
    }
    shape = kinds.get(head.type).head_shape if head is not None else None
    if shape in checks.ARGMAX:
        figures["argmax"] = f"task head ({head.task}, {head.type})"
        figures.update(
            checks.agreement(
                checks.task_predictions(reference, batches, shape), checks.task_predictions(got, batches, shape)
            )
        )
    elif head is not None:
        figures["argmax"] = f"none: {head.task} is a regression task (max_abs_diff.logits is its figure)"
        figures.update(agreement=None, compared=0)
    elif (mlm := mlm_head(model_dir)) is not None:
        rng = np.random.default_rng(seed)
        masked, positions = checks.mask_tokens(batches, rng, tokenizer.mask_token_id, tokenizer.all_special_ids)
        want = checks.mlm_predictions(mlm, checks.torch_outputs(model, masked), positions)
        figures["argmax"] = "masked-LM prediction at 15% of the tokens, masked"
        figures.update(
            checks.agreement(want, checks.mlm_predictions(mlm, checks.onnx_outputs(session, masked), positions))
        )
    else:
        figures["argmax"] = "nearest neighbour of each sentence's mean-pooled embedding among the sample"
        want, have = checks.mean_pooled(reference, batches), checks.mean_pooled(got, batches)
        figures.update(checks.agreement(checks.neighbours(want), checks.neighbours(have)))
    figures["goal"] = INT8_GOAL
    figures["meets_goal"] = None if figures["agreement"] is None else figures["agreement"] >= INT8_GOAL
    return figures
