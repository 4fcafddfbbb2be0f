"""Held-out pretraining scores of an exported model: masked-LM loss, perplexity and
accuracy, and next-sentence (or sentence-order) accuracy, on batches of the examples
stage's validation sequences.

The model is bertcore's `BertForPreTraining` loaded from the Hugging Face folder the
pretrain stage exports (same parameter names), so the MLM head runs on the masked
positions only, not on every token. The baseline is the same architecture with seeded
fresh weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import safetensors.torch
import torch

from bertcore.errors import InputDataError
from bertcore.eval.metrics import PretrainingMeter
from bertcore.model import IGNORE_INDEX, BertForPreTraining, ModelConfig
from bertcore.pretrained import load_into
from bertcore.rng import keyed_seed


def model_config_of(model_dir: str) -> ModelConfig:
    """The ModelConfig recorded in `model_dir`/config.json (keys transformers adds are ignored)."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputDataError(f"{path}: cannot read the model config ({exc})") from None
    if data.get("model_type", "bert") != "bert":
        raise InputDataError(f"{path}: model_type {data['model_type']!r} is not a BERT model")
    return ModelConfig.model_validate({k: v for k, v in data.items() if k in ModelConfig.model_fields})


def load_pretraining_model(model_dir: str, *, random_init: bool = False, seed: int = 0) -> BertForPreTraining:
    """The model in `model_dir` (config.json + model.safetensors), in eval mode; with
    random_init, the same architecture with fresh weights drawn from (seed, "random-init")."""
    cfg = model_config_of(model_dir)
    generator = torch.Generator().manual_seed(keyed_seed(seed, "random-init") >> 1)
    model = BertForPreTraining(cfg, generator=generator)  # a private generator: the global RNG is left alone
    if not random_init:
        path = os.path.join(model_dir, "model.safetensors")
        try:
            state = safetensors.torch.load_file(path)
        except (OSError, safetensors.SafetensorError) as exc:
            raise InputDataError(f"{path}: cannot read the weights ({exc})") from None
        load_into(model, state, where=path)  # a masked-LM export has no NSP head or pooler: those stay seeded
    return model.eval()


@torch.no_grad()
def held_out_scores(model: BertForPreTraining, batches: Iterable[dict], *, max_batches: int | None = None) -> dict:
    """MLM loss (mean over masked tokens), perplexity exp(loss) and accuracy, NSP loss and
    accuracy where the batches carry NSP labels, and the counts behind them.

    batches: dicts as `bertcore.data.ExamplesLoader` yields them (input_ids,
    token_type_ids, attention_mask (B, T); labels (B, T) with -100 where nothing is
    predicted; next_sentence_label (B,) with -100 where there is no NSP target)."""
    model.eval()
    meter = PretrainingMeter()
    sequences = count = 0
    for batch in batches:
        if max_batches is not None and count >= max_batches:
            break
        sequence = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])  # (B, T, H)
        selected = batch["labels"] != IGNORE_INDEX  # (B, T)
        mlm_logits = model.cls.predictions(sequence[selected])  # (M, V)
        nsp_logits = model.cls.seq_relationship(model.bert.pooler(sequence))  # (B, 2)
        meter.update(mlm_logits, batch["labels"][selected], nsp_logits, batch["next_sentence_label"])
        sequences += batch["input_ids"].shape[0]
        count += 1
    return {**meter.result(), "sequences": sequences, "batches": count, "masked_tokens": meter.mlm_count}
