"""An existing Hugging Face encoder folder as the starting point of pretraining
(`pretrain.init_from`): its config.json as a ModelConfig, its weights as a state dict with
the names of its family's model (bertcore/model/families/), and loading them into a freshly
initialised model of that family.

Accepted weights: `model.safetensors` or a sharded `model.safetensors.index.json`, saved
from BertForPreTraining, BertForMaskedLM or BertModel; a `pytorch_model.bin` is refused with
the command that converts it (bertcore/model/folder.py: safetensors only). Names are transformers' (so are
bertcore.model.bert's); two older spellings are mapped: `LayerNorm.gamma/beta` of
TensorFlow-converted checkpoints, and BertModel's unprefixed names (`embeddings.*`).
What the checkpoint lacks starts from the seeded initialisation: the NSP head and the
pooler of a BertForMaskedLM (which has neither), the MLM head of a BertModel. A missing
encoder or embedding weight is an error, never silently fresh.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import safetensors
import safetensors.torch
import torch

from bertcore.errors import InputDataError
from bertcore.model.config import ModelConfig
from bertcore.model.families import Family
from bertcore.model.folder import read_config, read_header, weights_path
from bertcore.model.hf_files import (  # noqa: F401 - the file names live without torch; re-exported here
    CONFIG_FILE,
    PYTORCH_BIN,
    SAFETENSORS_INDEX,
    WEIGHT_FILES,
    WEIGHTS_FILE,
    shard_names,
    weight_files,
)

SAFETENSORS = WEIGHTS_FILE


def model_config(folder: str) -> ModelConfig:
    """The ModelConfig of `folder`/config.json (bertcore/model/folder.py `read_config`)."""
    return read_config(folder, "pretrain.init_from")


def read_weights(folder: str, key: str = "pretrain.init_from") -> dict[str, torch.Tensor]:
    """The folder's weights with the names of its family's model (see the module
    docstring; the family is config.json's). The driver has checked the folder
    (`check_model_folder`); a pytorch_model.bin is refused here too, before anything
    unpickles it."""
    name, path = weights_path(folder, key)
    paths = [path] if name == SAFETENSORS else [os.path.join(folder, shard) for shard in shard_names(path)]
    raw = {}
    for one in paths:
        read_header(one)  # a truncated or header-bombed file is one line naming it
        try:
            raw.update(safetensors.torch.load_file(one))
        except (OSError, RuntimeError, safetensors.SafetensorError) as exc:
            raise InputDataError(f"{one}: cannot read the weights ({' '.join(str(exc).split())[:200]})") from None
    return canonical_names(raw, read_config(folder, key).family)


def canonical_names(state: Mapping[str, torch.Tensor], family: Family) -> dict[str, torch.Tensor]:
    """The family's model names from a file's (`Family.canonical_name`: older spellings,
    an encoder-only model's unprefixed names, RoBERTa's); buffers dropped."""
    prefixed = family.is_prefixed(state)
    return {
        family.canonical_name(key, prefixed): tensor
        for key, tensor in state.items()
        if not key.endswith("position_ids")
    }


@dataclass
class InitPlan:
    """How a checkpoint's entries map onto the model."""

    loaded: list[str]
    fresh: list[str]
    """Model entries the checkpoint lacks, left at the seeded initialisation (heads, pooler)."""
    ignored: list[str]
    """Checkpoint entries the model has no place for (e.g. a fine-tuned classifier head)."""


def plan(checkpoint_keys: Iterable[str], model_keys: Iterable[str], where: str, family: Family) -> InitPlan:
    """Which entries load, start fresh, or are ignored; a missing entry that may not start
    fresh (an embedding or encoder weight) is an InputDataError naming it."""
    have = set(checkpoint_keys) - set(family.tied)  # tied entries come with what they alias
    wanted = [k for k in model_keys if k not in family.tied]
    missing = [k for k in wanted if k not in have]
    required = [k for k in missing if not family.may_start_fresh.fullmatch(k)]
    if required:
        raise InputDataError(
            f"{where}: the checkpoint lacks {required[:3]} ({len(required)} entries of the encoder); is it a "
            f"{family.name} model?"
        )
    ignored = sorted(have - set(wanted))
    bert_ignored = [k for k in ignored if k.startswith(family.encoder_prefix)]
    if bert_ignored:
        raise InputDataError(
            f"{where}: the checkpoint has encoder entries this model has no place for: {bert_ignored[:3]}"
        )
    return InitPlan(loaded=[k for k in wanted if k in have], fresh=missing, ignored=ignored)


def load_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str = "pretrain.init_from") -> InitPlan:
    """Copy `state` (canonical names) into `model` (a family's pretraining model, its `cfg`
    naming the family), whose other entries keep their initialisation; shapes must match
    exactly."""
    own = model.state_dict()
    result = plan(state, own, where, model.cfg.family)
    for key in result.loaded:
        if tuple(state[key].shape) != tuple(own[key].shape):
            raise InputDataError(
                f"{where}: {key} has shape {tuple(state[key].shape)}, the model expects {tuple(own[key].shape)}"
            )
    model.load_state_dict({k: state[k] for k in result.loaded}, strict=False)
    return result
