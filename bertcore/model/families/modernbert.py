"""The modern encoder (ModernBERT, Warner et al. 2024): rotary positions (theta 160k on
global layers, 10k on local ones), GeGLU feed-forward, pre-normalisation without biases,
local attention (a window of 128 tokens) with a global layer every third, a final norm and
a decoder tied to the embeddings; trained on padding-free packed batches with MLM only.

The model is bertcore/model/modernbert.py's, laid out so that its state dict is, name for
name, transformers' ModernBertForMaskedLM's (`model.embeddings.tok_embeddings.weight`,
`model.layers.N.attn.Wqkv.weight`, ..., `head.dense.weight`, `decoder.bias`): the export is
a copy, the encoder alone (an embedding model) is ModernBertModel's names without `model.`.

Shapes: base is the paper's (22 layers, hidden 768, GeGLU width 1,152, 12 heads), large
its 28 x 1,024 (2,624); tiny, mini and small are bertcore's, with the paper's proportions
(head width 64, GeGLU width 1.5 x hidden) for CPUs and tests.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from bertcore.model.families.base import Family, Head, ModelConfig, Shape

SIZES = {
    "tiny": Shape(3, 128, 2, 192),
    "mini": Shape(6, 256, 4, 384),
    "small": Shape(12, 512, 8, 768),
    "base": Shape(22, 768, 12, 1152),
    "large": Shape(28, 1024, 16, 2624),
}
ACTIVATIONS = ("gelu", "gelu_new", "relu")
NO_BIAS = ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias")
"""config.json switches that must be off: the model has no biases but the decoder's."""


def layer_is_global(index: int, every: int) -> bool:
    """Layer `index` (0-based) attends globally: layers 0, every, 2 x every, ... (ModernBERT's pattern)."""
    return index % every == 0


class ModernBert(Family):
    name = "modernbert"
    model = "bertcore.model.modernbert:ModernBertForMaskedLM"
    sizes: ClassVar[dict[str, Shape]] = SIZES
    vocab_layout = None  # any vocabulary: the model reads ids, not segments
    nsp_head = False
    rotary = True
    tied: ClassVar[dict[str, str]] = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}
    encoder_prefix = "model."
    may_start_fresh = re.compile(r"head\..*|decoder\..*")
    batch_keys = ("input_ids", "attention_mask", "labels", "cu_seqlens", "position_ids", "max_seqlen")
    onnx_fusion = None  # onnxruntime's optimizer knows no rotary encoder: the graph is quantised unfused
    layer_pattern = re.compile(r"model\.layers\.(\d+)\.")
    mlm_head_entry = "head.dense.weight"
    defaults: ClassVar[dict[str, Any]] = {
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "type_vocab_size": 1,
    }

    def check(self, cfg: ModelConfig) -> None:
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        if head_dim % 2:
            raise ValueError(f"hidden_size / num_attention_heads ({head_dim}) must be even: rotary positions pair dims")
        if cfg.pre_layer_norm:
            raise ValueError("pre_layer_norm is a BERT option; the modernbert family is pre-norm by design")
        if cfg.local_attention < 2 or cfg.local_attention % 2:
            raise ValueError(f"local_attention ({cfg.local_attention}) must be an even window of at least 2 tokens")

    def parameter_count(self, cfg: ModelConfig) -> int:
        """Embeddings V x H and their norm; per layer Wqkv (3H x H), Wo (H x H), Wi (2I x
        H), the GeGLU output (H x I) and two norms (layer 0 has no attention norm); the final
        norm; the head's dense and norm; the decoder's bias (its matrix is the embeddings)."""
        v, h, i, layers = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        layer = 4 * h * h + 3 * h * i + 2 * h
        return v * h + h + layers * layer - h + h + (h * h + h) + v

    def flops_per_token(self, cfg: ModelConfig, seq_len: float, masked_fraction: float = 0.0) -> float:
        """6 x the matrix weights (Wqkv, Wo, Wi, GeGLU output: 4H^2 + 3HI per layer) plus
        attention, 12 x H x the keys a token attends per layer: all `seq_len` on global
        layers, at most local_attention + 1 on local ones; plus the MLM head on the masked share."""
        h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        keys = sum(
            seq_len if layer_is_global(k, cfg.global_attn_every_n_layers) else min(seq_len, cfg.local_attention + 1)
            for k in range(layers)
        )
        mlm_head = 6 * (h * h + cfg.vocab_size * h) * masked_fraction
        return float(6 * layers * (4 * h * h + 3 * h * i) + 12 * h * keys + mlm_head)

    def architecture(self, head: Head) -> str:
        return "ModernBertModel" if head == "encoder" else "ModernBertForMaskedLM"

    def hf_config(self, cfg: ModelConfig, head: Head, specials: Any = None) -> dict[str, Any]:
        every = cfg.global_attn_every_n_layers
        return {
            "architectures": [self.architecture(head)],
            "model_type": "modernbert",
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "hidden_activation": cfg.hidden_act,
            "max_position_embeddings": cfg.max_position_embeddings,
            "initializer_range": cfg.initializer_range,
            "norm_eps": cfg.layer_norm_eps,
            "norm_bias": False,
            "pad_token_id": cfg.pad_token_id,
            # ModernBertConfig's defaults are the ids of its own 50,368-entry vocabulary: name this one's
            **{
                f"{role}_token_id": None if specials is None else getattr(specials, which)
                for role, which in (("cls", "cls"), ("bos", "cls"), ("sep", "sep"), ("eos", "sep"))
            },
            "attention_bias": False,
            "attention_dropout": cfg.attention_probs_dropout_prob,
            "embedding_dropout": cfg.hidden_dropout_prob,
            "mlp_bias": False,
            "mlp_dropout": cfg.hidden_dropout_prob,
            "decoder_bias": True,
            "classifier_bias": False,
            "classifier_activation": cfg.hidden_act,
            "local_attention": cfg.local_attention,
            "layer_types": [
                "full_attention" if layer_is_global(k, every) else "sliding_attention"
                for k in range(cfg.num_hidden_layers)
            ],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": cfg.global_rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
            },
            # what transformers 4.48-4.57 read instead of layer_types and rope_parameters
            "global_attn_every_n_layers": every,
            "global_rope_theta": cfg.global_rope_theta,
            "local_rope_theta": cfg.local_rope_theta,
            "tie_word_embeddings": True,
        }

    def exported_name(self, key: str, head: Head) -> str | None:
        if head == "encoder":
            return key.removeprefix(self.encoder_prefix) if key.startswith(self.encoder_prefix) else None
        return key

    def canonical_name(self, key: str, prefixed: bool) -> str:
        """A ModernBertModel's unprefixed `embeddings.*`, `layers.*`, `final_norm.*` -> `model.*`."""
        if not prefixed and key.startswith(("embeddings.", "layers.", "final_norm.")):
            return f"model.{key}"
        return key

    def is_prefixed(self, names) -> bool:
        return any(k.startswith(("model.", "head.", "decoder.")) for k in names)

    def config_fields(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
            if k not in data
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)} missing; not a ModernBERT config.json")
        biased = [k for k in NO_BIAS if data.get(k)]
        if biased or data.get("decoder_bias", True) is False:
            raise ValueError(
                f"{(biased or ['decoder_bias'])[0]} differs from ModernBERT's; {where} needs the paper's layout "
                "(biases only on the decoder)"
            )
        activation = data.get("hidden_activation", "gelu")
        if activation not in ACTIVATIONS:
            raise ValueError(f"hidden_activation {activation!r} is not {', '.join(ACTIVATIONS)}; {where}")
        layers = int(data["num_hidden_layers"])
        every = int(data.get("global_attn_every_n_layers", 3))
        types = data.get("layer_types")
        if types is not None:
            globals_at = [k for k, t in enumerate(types) if t == "full_attention"]
            every = globals_at[1] if len(globals_at) > 1 else max(layers, 1)
            expected = ["full_attention" if layer_is_global(k, every) else "sliding_attention" for k in range(layers)]
            if list(types) != expected:
                raise ValueError(f"layer_types is not a global layer every n-th one; {where} needs that pattern")
        rope = data.get("rope_parameters") or {}
        thetas = {}
        for kind, old, default in (
            ("full_attention", "global_rope_theta", 160_000.0),
            ("sliding_attention", "local_rope_theta", 10_000.0),
        ):
            params = rope.get(kind) or {}
            if params.get("rope_type", "default") != "default":
                raise ValueError(f"rope_parameters.{kind}.rope_type {params['rope_type']!r} is not default; {where}")
            thetas[old] = float(params.get("rope_theta", data.get(old, default)))
        return {
            "model_type": self.name,
            "vocab_size": data["vocab_size"],
            "hidden_size": data["hidden_size"],
            "num_hidden_layers": layers,
            "num_attention_heads": data["num_attention_heads"],
            "intermediate_size": data["intermediate_size"],
            "hidden_act": activation,
            "max_position_embeddings": data.get("max_position_embeddings", 8192),
            "initializer_range": data.get("initializer_range", 0.02),
            "layer_norm_eps": data.get("norm_eps", 1e-5),
            "pad_token_id": data.get("pad_token_id") or 0,
            "hidden_dropout_prob": data.get("embedding_dropout", 0.0),
            "attention_probs_dropout_prob": data.get("attention_dropout", 0.0),
            "type_vocab_size": 1,
            "local_attention": data.get("local_attention", 128),
            "global_attn_every_n_layers": every,
            **thetas,
        }

    def expected_shapes(self, cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
        h = cfg.hidden_size
        return {
            "model.embeddings.tok_embeddings.weight": ((cfg.vocab_size, h), "vocab_size, hidden_size"),
            "model.layers.0.attn.Wqkv.weight": ((3 * h, h), "hidden_size"),
            "model.layers.0.mlp.Wi.weight": ((2 * cfg.intermediate_size, h), "intermediate_size, hidden_size"),
        }

    def layer_key(self, index: int, rest: str) -> str:
        return f"model.layers.{index}.{rest}"

    def moved_layer(self, entries: dict[str, Any], index: int) -> dict[str, Any]:
        """Layer 0 has no attention norm (the embeddings end with one): moved there, a
        layer leaves its norm behind; moved from there, it gains a norm of ones."""
        entries = dict(entries)
        if index == 0:
            entries.pop("attn_norm.weight", None)
        elif "attn_norm.weight" not in entries and "mlp_norm.weight" in entries:
            entries["attn_norm.weight"] = entries["mlp_norm.weight"].new_ones(entries["mlp_norm.weight"].shape)
        return entries

    def dropout_overrides(self, p: float) -> dict[str, float]:
        return {"embedding_dropout": p, "mlp_dropout": p, "attention_dropout": p}

    def describe(self, cfg: ModelConfig) -> str:
        return (
            f"modernbert: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, GeGLU {cfg.intermediate_size}, "
            f"local window {cfg.local_attention} with a global layer every {cfg.global_attn_every_n_layers}"
        )


MODERNBERT = ModernBert()
