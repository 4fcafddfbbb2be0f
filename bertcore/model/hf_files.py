"""The files of a Hugging Face model folder, by name, without torch: the pretrain stage's
declaration (which identifies `pretrain.init_from`) and `bertpipe inspect` need the names,
and loading a recipe or reading a manifest must not wait for torch."""

from __future__ import annotations

import json
from collections.abc import Iterable

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
WEIGHT_FILES = (WEIGHTS_FILE, SAFETENSORS_INDEX, PYTORCH_BIN)
"""Weight files in order of preference; a folder needs one of them."""
MODEL_DIR = "model"
"""Where the pretrain stage puts the exported folder inside its directory."""
START_DIR = "student-start"
"""Where the distill stage puts its student as it was before the first training step (laid
out as model/), which evaluate scores beside the trained student."""
MLM_SUFFIX = "-mlm"
"""Beside a BertForPreTraining folder (model/), its BertForMaskedLM twin (model-mlm/): what
AutoModelForMaskedLM and the fill-mask pipeline load without unexpected keys."""


def weight_files(names: Iterable[str]) -> list[str]:
    """The weight file of a folder listing (by preference), or [] when it has none."""
    present = set(names)
    return [next(name for name in WEIGHT_FILES if name in present)] if present & set(WEIGHT_FILES) else []


def shard_names(index_path: str) -> list[str]:
    """The safetensors shards a model.safetensors.index.json names, sorted."""
    with open(index_path, encoding="utf-8") as handle:
        return sorted(set(json.load(handle)["weight_map"].values()))
