"""What a model family says about itself: the interface every family module implements.

A family (BERT, RoBERTa, the modern encoder) is one module of this folder with one
`Family` subclass; bertcore/model/families/__init__.py lists them. Everything that differs
between families is answered here, so code outside this folder holds a `Family` and calls
it, never comparing `model_type` with a string:

- its named shapes and the parameter count and training FLOPs of a shape (no torch);
- the model it builds (`build`: torch imported inside), the batch entries that model
  takes, and which state-dict entries alias others (tied weights);
- its place in a Hugging Face folder: the architecture and config.json of each head
  (`Head`), the name each state-dict entry is saved under, the names read back from a
  folder (older spellings included), the tensors whose shapes a folder's config.json must
  agree with, and which entries a checkpoint may lack;
- what a vocabulary must be for it, and what a downstream consumer must know (the dropout
  keys of its config.json, the ONNX fusion it supports, whether it has an NSP head).

Light: no torch at import, so recipes load quickly; `build` imports the model module.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch
    from torch import nn

ModelConfig = Any
"""bertcore.model.config.ModelConfig: not imported here, since it imports this package (its
family decides its sizes); the families read its fields."""

Head = Literal["pretraining", "mlm", "encoder"]
"""What an exported folder holds: the pretraining heads (MLM + NSP where the family has
NSP), the masked-LM head alone, or the encoder alone (an embedding model)."""


@dataclass(frozen=True)
class Shape:
    """A named size: layers, width, heads and the feed-forward width (None: 4 x hidden)."""

    layers: int
    hidden: int
    heads: int
    intermediate: int | None = None


class Family:
    """One model family; see the module docstring. Subclasses set the class attributes and
    override what differs."""

    name: ClassVar[str]
    """The family's `model_type`, as config.json and ModelConfig spell it."""
    sizes: ClassVar[dict[str, Shape]]
    """Named shapes, smallest first."""
    vocab_layout: ClassVar[str | None]
    """The vocabulary layout the family needs (bertcore/examples/vocab_tables.py: bert for
    WordPiece, roberta for byte-level BPE), or None when any will do."""
    nsp_head: ClassVar[bool]
    """Whether the model holds a pooler and a next-sentence head."""
    tied: ClassVar[dict[str, str]]
    """state_dict entry that aliases another -> the entry it aliases."""
    encoder_prefix: ClassVar[str]
    """The prefix of the encoder's entries in the pretraining model's state dict."""
    may_start_fresh: ClassVar[re.Pattern]
    """Entries a checkpoint may lack (heads, pooler): they keep their seeded initialisation."""
    batch_keys: ClassVar[tuple[str, ...]]
    """The loader-batch entries the pretraining model's forward takes (when present)."""
    rotary: ClassVar[bool] = False
    """Whether positions are rotary (a phase may then set the global layers' base)."""
    onnx_fusion: ClassVar[str | None] = None
    """onnxruntime's transformer-optimizer model_type for the fused graph, or None (no fusion)."""
    defaults: ClassVar[dict[str, Any]] = {}
    """ModelConfig fields a named shape of this family sets besides its sizes."""

    # -- shapes (no torch) -----------------------------------------------------------------------
    def shape(self, size: str, vocab_size: int) -> dict[str, Any]:
        """ModelConfig fields of the named size `size`; ValueError naming the sizes there are."""
        if size not in self.sizes:
            raise ValueError(f"the {self.name} family has no size {size!r}; choose one of {', '.join(self.sizes)}")
        s = self.sizes[size]
        fields = dict(num_hidden_layers=s.layers, hidden_size=s.hidden, num_attention_heads=s.heads)
        if s.intermediate is not None:
            fields["intermediate_size"] = s.intermediate
        return {**self.defaults, **fields, "vocab_size": vocab_size, "model_type": self.name}

    def vocabulary_fields(self, pad_token_id: int) -> dict[str, Any]:
        """ModelConfig fields a vocabulary decides for a fresh model of this family."""
        return {"pad_token_id": pad_token_id}

    def check(self, cfg: ModelConfig) -> None:
        """Family-specific checks of a config (ValueError naming the field)."""

    def parameter_count(self, cfg: ModelConfig) -> int:
        """Trainable numbers of the pretraining model (tied matrices once), from the sizes alone."""
        raise NotImplementedError

    def flops_per_token(self, cfg: ModelConfig, seq_len: float, masked_fraction: float = 0.0) -> float:
        """Training FLOPs (forward + backward) per token at attended length `seq_len` (see
        bertcore/model/config.py `encoder_flops_per_token`)."""
        raise NotImplementedError

    def position_offset(self, cfg: ModelConfig) -> int:
        """Position id of a sequence's first token."""
        return 0

    # -- the model (torch) -----------------------------------------------------------------------
    model: ClassVar[str]
    """The pretraining model's class, "module:Class" (imported when built: the model
    modules import torch and the config, which imports this package)."""

    def build(self, cfg: ModelConfig, generator: torch.Generator | None = None) -> nn.Module:
        """The pretraining model, initialised from `generator`."""
        module, name = self.model.split(":")
        return getattr(importlib.import_module(module), name)(cfg, generator=generator)

    # -- Hugging Face folders ----------------------------------------------------------------------
    def architecture(self, head: Head) -> str:
        """transformers' class of a folder holding `head`."""
        raise NotImplementedError

    def exported_heads(self, nsp: bool) -> list[Head]:
        """The folders a trained model is exported as: its own (pretraining when trained
        with NSP and the family has the head, else mlm), then any masked-LM twin."""
        if nsp and self.nsp_head:
            return ["pretraining", "mlm"]
        return ["mlm"]

    def hf_config(self, cfg: ModelConfig, head: Head, specials: Any = None) -> dict[str, Any]:
        """config.json of a folder holding `head`; `specials` (the vocabulary's SpecialIds,
        when known) for families whose config names their special tokens."""
        raise NotImplementedError

    def exported_name(self, key: str, head: Head) -> str | None:
        """The name the state-dict entry `key` is saved under in a folder holding `head`, or
        None when that folder leaves it out (tied entries are never asked about)."""
        raise NotImplementedError

    def canonical_name(self, key: str, prefixed: bool) -> str:
        """bertcore's name of an entry read from a folder (`prefixed`: the file's names
        carry the pretraining model's prefixes; False for an encoder-only file)."""
        raise NotImplementedError

    def is_prefixed(self, names) -> bool:
        """Whether a folder's tensor names are those of a model with heads (not encoder-only)."""
        raise NotImplementedError

    def config_fields(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        """ModelConfig fields from a folder's config.json (`data`; the caller keeps those
        ModelConfig has and validates them); a config this family cannot reproduce raises
        ValueError with the reason (the caller names the file)."""
        raise NotImplementedError

    def expected_shapes(self, cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
        """Canonical tensor name -> (shape, the config fields that decide it): what a
        folder's weights must agree with its config.json on."""
        raise NotImplementedError

    layer_pattern: ClassVar[re.Pattern]
    """Matches the start of a canonical encoder-layer entry, up to the dot after the layer
    index (group 1)."""
    nsp_only: ClassVar[tuple[str, ...]] = ()
    """Entry prefixes only next-sentence prediction trains."""

    def layer_key(self, index: int, rest: str) -> str:
        """The canonical name of entry `rest` of encoder layer `index`."""
        raise NotImplementedError

    def moved_layer(self, entries: dict[str, Any], index: int) -> dict[str, Any]:
        """A layer's entries (names after the layer prefix) placed at layer `index`
        (distillation's start from a teacher); by default unchanged."""
        return entries

    def dropout_overrides(self, p: float) -> dict[str, float]:
        """config.json keys that set every dropout of the encoder to `p` (fine-tuning)."""
        raise NotImplementedError

    def describe(self, cfg: ModelConfig) -> str:
        """A few words for start lines: '2 layers, hidden 128'."""
        return f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}"
