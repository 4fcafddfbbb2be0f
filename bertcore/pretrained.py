"""An existing Hugging Face BERT folder as the starting point of pretraining
(`pretrain.init_from`): its config.json as a ModelConfig, its weights as a state dict with
bertcore.model's names, and loading them into a freshly initialised BertForPreTraining.

Accepted weights: `model.safetensors`, a sharded `model.safetensors.index.json`, or
`pytorch_model.bin` (read with torch.load(weights_only=True), no pickle code runs), saved
from BertForPreTraining, BertForMaskedLM or BertModel. Names are transformers' (so are
bertcore.model's); two older spellings are mapped: `LayerNorm.gamma/beta` of
TensorFlow-converted checkpoints, and BertModel's unprefixed names (`embeddings.*`).
What the checkpoint lacks starts from the seeded initialisation: the NSP head and the
pooler of a BertForMaskedLM (which has neither), the MLM head of a BertModel. A missing
encoder or embedding weight is an error, never silently fresh.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import safetensors
import safetensors.torch
import torch

from bertcore.errors import InputDataError
from bertcore.hf_files import (  # noqa: F401 - the file names live without torch; re-exported here
    CONFIG_FILE,
    PYTORCH_BIN,
    SAFETENSORS_INDEX,
    WEIGHT_FILES,
    WEIGHTS_FILE,
    shard_names,
    weight_files,
)
from bertcore.model import TIED, BertForPreTraining, ModelConfig

SAFETENSORS = WEIGHTS_FILE

MAY_START_FRESH = re.compile(r"bert\.pooler\..*|cls\..*")
"""Model entries a checkpoint may lack (heads and pooler); the rest must be there."""
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")


def model_config(folder: str) -> ModelConfig:
    """The ModelConfig of `folder`/config.json (a BERT encoder; keys bertcore does not use
    are ignored). Models bertcore.model cannot reproduce are refused, naming the key."""
    path = os.path.join(folder, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputDataError(f"{path}: cannot read the model config ({exc})") from None
    refusals = {
        "model_type": (data.get("model_type", "bert") == "bert", "is not a BERT model (bertcore reads model_type bert)"),
        "position_embedding_type": (data.get("position_embedding_type", "absolute") == "absolute", "is not absolute"),
        "is_decoder": (not data.get("is_decoder", False), "makes a decoder"),
        "hidden_act": (data.get("hidden_act", "gelu") in ("gelu", "gelu_new", "relu"), "is not gelu, gelu_new or relu"),
    }
    for key, (ok, why) in refusals.items():
        if not ok:
            raise InputDataError(f"{path}: {key} {data.get(key)!r} {why}; pretrain.init_from needs a BERT encoder")
    missing = [k for k in _SHAPE_FIELDS if k not in data]
    if missing:
        raise InputDataError(f"{path}: {', '.join(missing)} missing; not a BERT config.json")
    try:
        return ModelConfig.model_validate({k: v for k, v in data.items() if k in ModelConfig.model_fields and k != "pre_layer_norm"})
    except ValueError as exc:
        raise InputDataError(f"{path}: {' '.join(str(exc).split())}") from None


def read_weights(folder: str) -> dict[str, torch.Tensor]:
    """The folder's weights with bertcore.model's names (see the module docstring)."""
    found = weight_files(os.listdir(folder))
    if not found:
        raise InputDataError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)}); pretrain.init_from needs a saved model folder")
    path = os.path.join(folder, found[0])
    try:
        if found[0] == SAFETENSORS:
            raw = safetensors.torch.load_file(path)
        elif found[0] == SAFETENSORS_INDEX:
            raw = {}
            for shard in shard_names(path):
                raw.update(safetensors.torch.load_file(os.path.join(folder, shard)))
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's weights-only loader met a pickle that names code to run
        found = re.search(r"GLOBAL (\S+)", str(exc))
        raise InputDataError(
            f"{path}: refusing to load: the pickle would call {found.group(1) if found else 'code'} (torch's weights-only "
            "loader stopped it); use the model's safetensors file, or one from a source you trust"
        ) from None
    except (OSError, RuntimeError, KeyError, safetensors.SafetensorError) as exc:
        raise InputDataError(f"{path}: cannot read the weights ({' '.join(str(exc).split())[:200]})") from None
    return canonical_names(raw)


def canonical_names(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' names from older spellings: LayerNorm gamma/beta -> weight/bias, a
    BertModel's `embeddings.*`/`encoder.*`/`pooler.*` -> `bert.*`; buffers dropped."""
    prefixed = not any(k.startswith(("bert.", "cls.")) for k in state)
    out = {}
    for key, tensor in state.items():
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        if prefixed and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = f"bert.{key}"
        if not key.endswith("position_ids"):
            out[key] = tensor
    return out


@dataclass
class InitPlan:
    """How a checkpoint's entries map onto the model."""

    loaded: list[str]
    fresh: list[str]
    """Model entries the checkpoint lacks, left at the seeded initialisation (heads, pooler)."""
    ignored: list[str]
    """Checkpoint entries the model has no place for (e.g. a fine-tuned classifier head)."""


def plan(checkpoint_keys: Iterable[str], model_keys: Iterable[str], where: str) -> InitPlan:
    """Which entries load, start fresh, or are ignored; a missing entry that may not start
    fresh (an embedding or encoder weight) is an InputDataError naming it."""
    have = set(checkpoint_keys) - set(TIED)  # tied entries come with what they alias
    wanted = [k for k in model_keys if k not in TIED]
    missing = [k for k in wanted if k not in have]
    required = [k for k in missing if not MAY_START_FRESH.fullmatch(k)]
    if required:
        raise InputDataError(f"{where}: the checkpoint lacks {required[:3]} ({len(required)} entries of the encoder); is it a BERT model?")
    ignored = sorted(have - set(wanted))
    bert_ignored = [k for k in ignored if k.startswith("bert.")]
    if bert_ignored:
        raise InputDataError(f"{where}: the checkpoint has encoder entries this model has no place for: {bert_ignored[:3]}")
    return InitPlan(loaded=[k for k in wanted if k in have], fresh=missing, ignored=ignored)


def load_into(model: BertForPreTraining, state: Mapping[str, torch.Tensor], where: str = "pretrain.init_from") -> InitPlan:
    """Copy `state` (canonical names) into `model`, whose other entries keep their
    initialisation; shapes must match exactly."""
    own = model.state_dict()
    result = plan(state, own, where)
    for key in result.loaded:
        if tuple(state[key].shape) != tuple(own[key].shape):
            raise InputDataError(f"{where}: {key} has shape {tuple(state[key].shape)}, the model expects {tuple(own[key].shape)}")
    model.load_state_dict({k: state[k] for k in result.loaded}, strict=False)
    return result
