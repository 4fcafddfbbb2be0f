"""The student: its shape from `distill.student` and the teacher's config, the layer map,
and its start from the teacher (DistilBERT: the embeddings and every k-th layer).

Which teacher layer a student layer copies is the one the layer map pairs it with, so the
start and the hidden-state loss agree: with 3 of 6 layers, student layers 1-3 start as
teacher layers 2, 4 and 6 and are compared with their outputs. The MLM head and the pooler
come along when the teacher has them; the NSP head, which distillation does not train,
starts fresh.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from bertcore.distill.config import DistillConfig, StudentConfig, default_layer_map
from bertcore.errors import ConfigError
from bertcore.model.config import ModelConfig
from bertcore.model.families import Family


def student_config(cfg: StudentConfig, teacher: ModelConfig) -> ModelConfig:
    """The student's shape: a named size or the teacher's, with the fields the section
    sets; the vocabulary, positions, segments, activation and dropouts are the teacher's."""
    named = None
    if cfg.model_size is not None:
        sizes = teacher.family.sizes  # the student is of the teacher's family
        if cfg.model_size not in sizes:
            raise ConfigError(
                f"distill.student.model_size: the {teacher.model_type} family has no size {cfg.model_size!r} "
                f"({', '.join(sizes)})"
            )
        named = sizes[cfg.model_size]
    layers = cfg.num_hidden_layers or (named.layers if named else cfg.layers(teacher.num_hidden_layers))
    shape = {
        "num_hidden_layers": layers,
        "hidden_size": cfg.hidden_size or (named.hidden if named else teacher.hidden_size),
        "num_attention_heads": cfg.num_attention_heads or (named.heads if named else teacher.num_attention_heads),
    }
    if cfg.intermediate_size is not None:
        shape["intermediate_size"] = cfg.intermediate_size
    elif cfg.model_size is None and cfg.hidden_size is None:
        shape["intermediate_size"] = teacher.intermediate_size
    else:
        shape["intermediate_size"] = (named.intermediate if named else None) or 4 * shape["hidden_size"]
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


def from_teacher_state(
    teacher: Mapping[str, torch.Tensor], pairs: list[int], family: Family
) -> dict[str, torch.Tensor]:
    """The student's starting weights (the family's names): the teacher's entries outside
    the layers (embeddings, MLM head, pooler, a final norm), but its NSP head, and student
    layer i = teacher layer pairs[i] (1-based), as the family places a layer's entries
    (`Family.moved_layer`). Tensors are copies (the teacher's stay untouched)."""
    layers: dict[int, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in teacher.items():
        if match := family.layer_pattern.match(key):
            layers.setdefault(int(match.group(1)), {})[key[match.end() :]] = tensor
        elif not key.startswith(family.nsp_only):
            out[key] = tensor.detach().clone()
    for student_layer, teacher_layer in enumerate(pairs):
        entries = family.moved_layer(layers.get(teacher_layer - 1, {}), student_layer)
        for name, tensor in entries.items():
            out[family.layer_key(student_layer, name)] = tensor.detach().clone()
    return out
