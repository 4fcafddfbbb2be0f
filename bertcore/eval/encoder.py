"""The encoder under evaluation and what a task head reads from it.

Loading: the encoder is whatever `transformers.AutoModel` loads from a local Hugging Face
folder (the pretrain stage's `model/`; a BertForPreTraining or BertForMaskedLM checkpoint
loads as its BertModel and the pretraining heads are dropped). `pooler_source` says
whether the folder holds a pooler (trained by next-sentence prediction) or the loader
starts a fresh one; `random_init` builds the same architecture from config.json with
fresh weights, the no-pretraining baseline.

Features (`Features`): which hidden states a head reads and how they become one vector per
token or per sequence, the choices of the BERT paper's feature-based comparison (Devlin et
al. 2019, table 7): the last layer, chosen layers concatenated or summed, or a learned
softmax-weighted sum of layers (the scalar mix of ELMo, Peters et al. 2018). Hidden state
0 is the embedding output, k the output of layer k. Sequence tasks pool with BERT's pooler
(tanh layer on [CLS]), the [CLS] state itself, or the mean over real tokens.

Optimisation helpers: parameter groups with layer-wise learning-rate decay (Sun et al.
2019, "How to Fine-Tune BERT for Text Classification?") and freezing of the lower layers.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch
from torch import nn

from bertcore.eval.settings import Combine, Pooling
from bertcore.eval.windows import pool_windows
from bertcore.model.families import FAMILIES
from bertcore.vocab.morphemes import split_as_recorded


@contextlib.contextmanager
def quiet_transformers():
    """Silences transformers' load report (the unused MLM/NSP head weights of a pretraining
    checkpoint are expected here) and its progress bars."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_tokenizer(tokenizer_dir: str):
    """The fast tokenizer saved in a local folder (tokenizer.json required: QA needs offsets),
    splitting text as its vocabulary was split in pretraining (BERT's words, or Korean
    morphemes: bertcore/vocab/morphemes.py), so every task text is split as the corpus was."""
    from transformers import AutoTokenizer

    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not tokenizer.is_fast:
        raise ValueError(
            f"{tokenizer_dir}: no fast tokenizer (tokenizer.json) found; the pretrain stage's model/ folder has one"
        )
    return split_as_recorded(tokenizer, tokenizer_dir)


def load_encoder(encoder_dir: str, *, random_init: bool = False, dropout: float | None = None) -> nn.Module:
    """The encoder in a local Hugging Face folder; with random_init, the same architecture
    with fresh weights (initialised from the global torch RNG, which the caller seeds).
    dropout, when given, replaces the folder's hidden and attention dropout."""
    from transformers import AutoConfig, AutoModel

    with quiet_transformers():
        config = AutoConfig.from_pretrained(encoder_dir)
        if dropout is not None:  # the family's dropout keys (BERT's hidden/attention, ModernBERT's three)
            known = FAMILIES.get(getattr(config, "model_type", "bert"), FAMILIES["bert"])
            config = AutoConfig.from_pretrained(encoder_dir, **known.dropout_overrides(dropout))
        if random_init:
            return AutoModel.from_config(config)
        return AutoModel.from_pretrained(encoder_dir, config=config)


def pooler_source(encoder_dir: str, *, random_init: bool = False) -> str:
    """ "pretrained" when the folder's weights hold BERT's pooler (trained with the NSP
    head), "fresh" when the loader initialises one (a checkpoint without NSP, or the
    random-init baseline)."""
    if random_init:
        return "fresh"
    path = os.path.join(encoder_dir, "model.safetensors")
    if os.path.isfile(path):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as handle:
            names = set(handle.keys())
        return "pretrained" if names & {"bert.pooler.dense.weight", "pooler.dense.weight"} else "fresh"
    with open(os.path.join(encoder_dir, "config.json"), encoding="utf-8") as handle:
        architectures = json.load(handle).get("architectures") or []
    return "pretrained" if any(a in ("BertForPreTraining", "BertModel") for a in architectures) else "fresh"


def hidden_states(
    encoder: nn.Module, input_ids, attention_mask, token_type_ids
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
    """(every hidden state, embeddings output first, each (B, T, H); pooled (B, H) or None).
    An encoder that returns a bare tensor (B, T, H) gives a single hidden state."""
    try:
        out = encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, output_hidden_states=True
        )
    except TypeError:  # an encoder without output_hidden_states
        out = encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if isinstance(out, torch.Tensor):
        return (out,), None
    states = getattr(out, "hidden_states", None) or (out.last_hidden_state,)
    # the last state is the encoder's output: a model that ends with a norm (ModernBERT) records
    # its last layer's output before it (for BERT the two are the same tensor)
    states = (*states[:-1], out.last_hidden_state)
    return tuple(states), getattr(out, "pooler_output", None)


def encode(encoder: nn.Module, input_ids, attention_mask, token_type_ids) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(last hidden (B, T, H), pooled (B, H) or None) from any supported encoder."""
    out = encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if isinstance(out, torch.Tensor):
        return out, None
    return out.last_hidden_state, getattr(out, "pooler_output", None)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, H) mean of the hidden states (B, T, H) over real tokens (special tokens included)."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


def layer_indexes(layers: Sequence[int] | Literal["all"], num_states: int) -> list[int]:
    """Indexes into the num_states hidden states (embeddings output + one per layer);
    negative ones count from the end; "all" is every state."""
    if layers == "all":
        return list(range(num_states))
    out = []
    for layer in layers:
        index = layer + num_states if layer < 0 else layer
        if not 0 <= index < num_states:
            raise ValueError(
                f"layer {layer} does not exist: the encoder has {num_states} hidden states (0 = embeddings, "
                f"{num_states - 1} = last layer)"
            )
        out.append(index)
    return out


class ScalarMix(nn.Module):
    """gamma * sum_k softmax(w)_k h_k over the chosen hidden states (Peters et al. 2018)."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(count))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        mix = torch.softmax(self.weights, dim=0)
        return self.gamma * sum(w * h for w, h in zip(mix, states))


@dataclass(frozen=True)
class Features:
    """What a head reads: hidden states `layers` combined by `combine`; sequence tasks then
    pool with `pooling`."""

    layers: Sequence[int] | Literal["all"] = (-1,)
    combine: Combine = "concat"
    pooling: Pooling = "pooler"

    def width(self, hidden: int, num_states: int) -> int:
        """Size of the combined vector of one token."""
        count = len(layer_indexes(self.layers, num_states))
        return hidden * count if self.combine == "concat" else hidden

    @property
    def last_only(self) -> bool:
        return list(self.layers) == [-1] if self.layers != "all" else False


class HeadReads(Protocol):
    """What TaskModel asks of a task kind (a TaskKind of bertcore/eval/kinds/): its name, and
    whether its head reads one pooled vector per row or every token."""

    name: ClassVar[str]
    pooled: ClassVar[bool]


class TaskModel(nn.Module):
    """Encoder + one linear head. A pooled kind's head (classification, regression,
    multiple choice) reads one pooled vector per row, the others' (tags, QA spans) every
    position; `features` chooses the hidden states (default: BERT's fine-tuning setup, the
    pooler over the last layer). Inputs read in windows (bertcore/eval/windows.py) come
    with `window_owner`, and their windows' vectors are combined by `window_pool` before
    the head."""

    def __init__(
        self,
        encoder: nn.Module,
        kind: HeadReads,
        num_outputs: int,
        dropout: float = 0.1,
        hidden_size: int | None = None,
        features: Features = Features(),
        window_pool: str = "mean",
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.kind = kind
        self.task_type = kind.name  # the name a saved head records (bertcore/eval/heads.py)
        self.features = features
        self.window_pool = window_pool
        config = getattr(encoder, "config", None)
        hidden = hidden_size or getattr(config, "hidden_size", None)
        if hidden is None:
            raise ValueError("TaskModel: pass hidden_size for an encoder without config.hidden_size")
        num_states = getattr(config, "num_hidden_layers", 0) + 1  # 1: an encoder that returns (B, T, H) only
        self.indexes = layer_indexes(features.layers, num_states)
        if features.pooling == "pooler" and not features.last_only and kind.pooled:
            raise ValueError(
                "pooling 'pooler' reads the last layer only; use pooling 'cls' or 'mean' with other layers"
            )
        self.mix = ScalarMix(len(self.indexes)) if features.combine == "scalar_mix" else None
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(features.width(hidden, num_states), num_outputs)

    def _combined(self, states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        chosen = [states[i] for i in self.indexes]
        if self.mix is not None:
            return self.mix(chosen)
        if self.features.combine == "sum":
            return torch.stack(chosen).sum(0)
        return torch.cat(chosen, dim=-1)  # (B, T, k*H)

    def head_input(self, states: tuple[torch.Tensor, ...], pooled: torch.Tensor | None, attention_mask) -> torch.Tensor:
        """What the head reads, from the encoder's hidden states and pooled output: (B, F)
        for a pooled kind, (B, T, F) for the others."""
        if self.kind.pooled:
            if self.features.pooling == "pooler" and pooled is not None:
                return pooled  # (B, H)
            if self.features.pooling == "mean":
                return mean_pool(self._combined(states), attention_mask)
            return self._combined(states)[:, 0]  # cls, or "pooler" on an encoder without one
        return self._combined(states)  # (B, T, F)

    def forward(
        self, input_ids, attention_mask, token_type_ids, window_owner: torch.Tensor | None = None
    ) -> torch.Tensor:
        """window_owner (W,): with windows, the rows are W windows of B inputs and this is
        each window's input (pooled kinds only)."""
        states, pooled = hidden_states(self.encoder, input_ids, attention_mask, token_type_ids)
        features = self.head_input(states, pooled, attention_mask)
        if window_owner is not None:
            features = pool_windows(features, window_owner, self.window_pool)  # (W, F) -> (B, F)
        # the kind's head shape: (B, C) labels, (B, 1) a score or a candidate's, (B, T, C) tags, (B, T, 2) start/end
        return self.head(self.dropout(features))


# --- optimisation --------------------------------------------------------------------------


def _layer_of(name: str, num_layers: int) -> int:
    """Depth of an encoder parameter: 0 embeddings, k for layer k-1 (BERT's encoder.layer.{k-1},
    ModernBERT's layers.{k-1}), num_layers + 1 for what sits above the last layer (pooler,
    a final norm)."""
    if name.startswith("embeddings."):
        return 0
    parts = name.split(".")
    found = next((p for p in ("layer", "layers") if p in parts), None)
    if found is not None:
        position = parts.index(found)
        if position + 1 < len(parts) and parts[position + 1].isdigit():
            return int(parts[position + 1]) + 1
    return num_layers + 1


def freeze_lower_layers(encoder: nn.Module, k: int) -> int:
    """Freezes the embeddings and the lowest k transformer layers (k = 0 freezes nothing);
    returns the number of frozen weights."""
    if k <= 0:
        return 0
    num_layers = encoder.config.num_hidden_layers
    if k > num_layers:
        raise ValueError(f"freeze_layers {k} exceeds the encoder's {num_layers} layers")
    frozen = 0
    for name, param in encoder.named_parameters():
        if _layer_of(name, num_layers) <= k:
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def _no_decay(name: str) -> bool:
    return name.endswith(("bias", "gamma")) or "norm" in name.lower() or "mix.weights" in name


def parameter_groups(
    model: TaskModel, learning_rate: float, weight_decay: float, layer_lr_decay: float = 1.0
) -> list[dict]:
    """AdamW groups: weight decay except on biases and LayerNorms; with layer_lr_decay d < 1,
    encoder parameters at depth l (0 embeddings .. L the last layer) get learning_rate *
    d^(L + 1 - l), the head (and pooler, scalar mix) learning_rate."""
    num_layers = getattr(getattr(model.encoder, "config", None), "num_hidden_layers", 0)
    groups: dict[tuple[float, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        lr = learning_rate
        if name.startswith("encoder.") and layer_lr_decay != 1.0:
            depth = min(_layer_of(name.removeprefix("encoder."), num_layers), num_layers + 1)
            lr = learning_rate * layer_lr_decay ** (num_layers + 1 - depth)
        decay = 0.0 if _no_decay(name) else weight_decay
        groups.setdefault((lr, decay), []).append(param)
    return [{"params": params, "lr": lr, "weight_decay": decay} for (lr, decay), params in groups.items()]
