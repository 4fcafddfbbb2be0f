"""An existing Hugging Face BERT folder as the starting point of pretraining
(`pretrain.init_from`): its config.json as a ModelConfig, its weights as a state dict with
bertcore.model.bert's names, and loading them into a freshly initialised BertForPreTraining.

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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import safetensors
import safetensors.torch
import torch

from bertcore.errors import InputDataError
from bertcore.model.bert import TIED, BertForPreTraining, ModelConfig
from bertcore.model.folder import canonical_key, is_prefixed, read_config, read_header, weights_path
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

MAY_START_FRESH = re.compile(r"bert\.pooler\..*|cls\..*")
"""Model entries a checkpoint may lack (heads and pooler); the rest must be there."""


def model_config(folder: str) -> ModelConfig:
    """The ModelConfig of `folder`/config.json (bertcore/model/folder.py `read_config`)."""
    return read_config(folder, "pretrain.init_from")


def read_weights(folder: str, key: str = "pretrain.init_from") -> dict[str, torch.Tensor]:
    """The folder's weights with bertcore.model.bert's names (see the module docstring). The
    driver has checked the folder (`check_model_folder`); a pytorch_model.bin is refused
    here too, before anything unpickles it."""
    name, path = weights_path(folder, key)
    paths = [path] if name == SAFETENSORS else [os.path.join(folder, shard) for shard in shard_names(path)]
    raw = {}
    for one in paths:
        read_header(one)  # a truncated or header-bombed file is one line naming it
        try:
            raw.update(safetensors.torch.load_file(one))
        except (OSError, RuntimeError, safetensors.SafetensorError) as exc:
            raise InputDataError(f"{one}: cannot read the weights ({' '.join(str(exc).split())[:200]})") from None
    return canonical_names(raw)


def canonical_names(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' names from older spellings: LayerNorm gamma/beta -> weight/bias, a
    BertModel's `embeddings.*`/`encoder.*`/`pooler.*` -> `bert.*`; buffers dropped."""
    prefixed = is_prefixed(state)
    return {canonical_key(key, prefixed): tensor for key, tensor in state.items() if not key.endswith("position_ids")}


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
        raise InputDataError(
            f"{where}: the checkpoint lacks {required[:3]} ({len(required)} entries of the encoder); is it a "
            "BERT model?"
        )
    ignored = sorted(have - set(wanted))
    bert_ignored = [k for k in ignored if k.startswith("bert.")]
    if bert_ignored:
        raise InputDataError(
            f"{where}: the checkpoint has encoder entries this model has no place for: {bert_ignored[:3]}"
        )
    return InitPlan(loaded=[k for k in wanted if k in have], fresh=missing, ignored=ignored)


def load_into(
    model: BertForPreTraining, state: Mapping[str, torch.Tensor], where: str = "pretrain.init_from"
) -> InitPlan:
    """Copy `state` (canonical names) into `model`, whose other entries keep their
    initialisation; shapes must match exactly."""
    own = model.state_dict()
    result = plan(state, own, where)
    for key in result.loaded:
        if tuple(state[key].shape) != tuple(own[key].shape):
            raise InputDataError(
                f"{where}: {key} has shape {tuple(state[key].shape)}, the model expects {tuple(own[key].shape)}"
            )
    model.load_state_dict({k: state[k] for k in result.loaded}, strict=False)
    return result
