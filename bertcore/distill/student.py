"""The student: its shape from `distill.student` and the teacher's config, the layer map,
and its start from the teacher (DistilBERT: the embeddings and every k-th layer).

Which teacher layer a student layer copies is the one the layer map pairs it with, so the
start and the hidden-state loss agree: with 3 of 6 layers, student layers 1-3 start as
teacher layers 2, 4 and 6 and are compared with their outputs. The MLM head and the pooler
come along when the teacher has them; the NSP head, which distillation does not train,
starts fresh.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from bertcore.distill.config import DistillConfig, StudentConfig, default_layer_map
from bertcore.errors import ConfigError
from bertcore.model.config import NAMED_SIZES, ModelConfig

_LAYER = re.compile(r"bert\.encoder\.layer\.(\d+)\.(.*)")
_CARRIED = ("bert.embeddings.", "cls.predictions.", "bert.pooler.")
"""Entries copied as they are (when the teacher has them)."""


def student_config(cfg: StudentConfig, teacher: ModelConfig) -> ModelConfig:
    """The student's shape: a named size or the teacher's, with the fields the section
    sets; the vocabulary, positions, segments, activation and dropouts are the teacher's."""
    shape = {
        "num_hidden_layers": cfg.layers(teacher.num_hidden_layers),
        "hidden_size": cfg.hidden_size or (NAMED_SIZES[cfg.model_size][1] if cfg.model_size else teacher.hidden_size),
        "num_attention_heads": cfg.num_attention_heads
        or (NAMED_SIZES[cfg.model_size][2] if cfg.model_size else teacher.num_attention_heads),
    }
    if cfg.intermediate_size is not None:
        shape["intermediate_size"] = cfg.intermediate_size
    elif cfg.model_size is None and cfg.hidden_size is None:
        shape["intermediate_size"] = teacher.intermediate_size
    else:
        shape["intermediate_size"] = 4 * shape["hidden_size"]
    try:
        return ModelConfig.model_validate({**teacher.model_dump(), **shape})
    except ValueError as exc:
        raise ConfigError(f"distill.student: {' '.join(str(exc).split())}") from None


def layer_map(cfg: DistillConfig, student_layers: int, teacher_layers: int) -> list[int]:
    """distill.layer_map, or the evenly spaced default; checked against both models."""
    chosen = cfg.layer_map or default_layer_map(student_layers, teacher_layers)
    if len(chosen) != student_layers:
        raise ConfigError(
            f"distill.layer_map names {len(chosen)} teacher layers but the student has {student_layers}; "
            "give one per student layer"
        )
    if max(chosen) > teacher_layers:
        raise ConfigError(
            f"distill.layer_map {chosen}: the teacher has {teacher_layers} layers; name layers 1 to {teacher_layers}"
        )
    return chosen


def check_from_teacher(student: ModelConfig, teacher: ModelConfig) -> None:
    """init: from_teacher copies weights, so every copied shape must be the teacher's."""
    for key in (
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "vocab_size",
    ):
        if getattr(student, key) != getattr(teacher, key):
            raise ConfigError(
                f"distill.student.init: from_teacher copies the teacher's layers, but the student's {key} is "
                f"{getattr(student, key)} "
                f"and the teacher's {getattr(teacher, key)}; keep the teacher's {key} or set "
                "distill.student.init: random"
            )


def from_teacher_state(teacher: Mapping[str, torch.Tensor], pairs: list[int]) -> dict[str, torch.Tensor]:
    """The student's starting weights (bertcore.model.bert names): the teacher's embeddings,
    MLM head and pooler, and student layer i = teacher layer pairs[i] (1-based). Tensors
    are copies (the teacher's stay untouched)."""
    layers: dict[int, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in teacher.items():
        if key.startswith(_CARRIED):
            out[key] = tensor.detach().clone()
        elif match := _LAYER.fullmatch(key):
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = tensor
    for student_layer, teacher_layer in enumerate(pairs):
        for name, tensor in layers.get(teacher_layer - 1, {}).items():
            out[f"bert.encoder.layer.{student_layer}.{name}"] = tensor.detach().clone()
    return out
