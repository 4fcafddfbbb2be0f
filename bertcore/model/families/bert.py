"""BERT (Devlin et al. 2019): absolute positions, post-LayerNorm, MLM + NSP heads; the model
is bertcore/model/bert.py's BertForPreTraining, whose names are transformers'.

Exports: BertForPreTraining (trained with NSP) with its BertForMaskedLM twin, or
BertForMaskedLM alone, or BertModel for an embedding model (the encoder's names without
`bert.`, the pooler kept).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from bertcore.model.families.base import Family, Head, ModelConfig, Shape

TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
"""BertLMPredictionHead ties its decoder to the word embeddings and to predictions.bias."""
NSP_ONLY = ("bert.pooler.", "cls.seq_relationship.")
"""Entries only the next-sentence objective trains: left out of a masked-LM export."""
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
"""What a BERT config.json must give."""
MODERN_ONLY = ("local_attention", "global_attn_every_n_layers", "global_rope_theta", "local_rope_theta")
"""ModelConfig fields of the modern family, left out of a BERT config.json."""

# (layers, hidden, heads): Devlin et al. 2019 (base, large); Turc et al. 2019 (the rest).
SIZES = {
    "tiny": Shape(2, 128, 2),
    "mini": Shape(4, 256, 4),
    "small": Shape(4, 512, 8),
    "medium": Shape(8, 512, 8),
    "base": Shape(12, 768, 12),
    "large": Shape(24, 1024, 16),
}


def bert_parameter_count(vocab: int, hidden: int, layers: int, intermediate: int, positions: int, types: int) -> int:
    """Parameters of a BertForPreTraining of this shape: embeddings (V + P + T) x H and
    their LayerNorm; per layer the four attention matrices, the two feed-forward matrices,
    biases and two LayerNorms; pooler, MLM transform and bias (the decoder is tied to the
    word embeddings), NSP head."""
    embeddings = (vocab + positions + types) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden * intermediate + intermediate + hidden + 4 * hidden
    heads = (hidden * hidden + hidden) + (hidden * hidden + 3 * hidden) + vocab + (2 * hidden + 2)
    return embeddings + layers * layer + heads


class Bert(Family):
    name = "bert"
    model = "bertcore.model.bert:BertForPreTraining"
    sizes: ClassVar[dict[str, Shape]] = SIZES
    vocab_layout = "bert"
    nsp_head = True
    tied: ClassVar[dict[str, str]] = TIED
    encoder_prefix = "bert."
    may_start_fresh = re.compile(r"bert\.pooler\..*|cls\..*")
    batch_keys = ("input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label")
    onnx_fusion = "bert"
    layer_pattern = re.compile(r"bert\.encoder\.layer\.(\d+)\.")
    nsp_only = ("cls.seq_relationship.",)
    mlm_head_entry = "cls.predictions.transform.dense.weight"
    """The tensor a model with the masked-LM head has and an encoder alone lacks."""

    def parameter_count(self, cfg: ModelConfig) -> int:
        return bert_parameter_count(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.num_hidden_layers,
            cfg.intermediate_size,
            cfg.max_position_embeddings,
            cfg.type_vocab_size,
        )

    def flops_per_token(self, cfg: ModelConfig, seq_len: float, masked_fraction: float = 0.0) -> float:
        """6 * N + 12 * L * H * T (+ the MLM head on the masked share); see
        bertcore/model/config.py `encoder_flops_per_token`."""
        h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        matmul_weights = layers * (4 * h * h + 2 * h * i)
        attention = 12 * layers * h * seq_len
        mlm_head = 6 * (h * h + cfg.vocab_size * h) * masked_fraction
        return float(6 * matmul_weights + attention + mlm_head)

    def architecture(self, head: Head) -> str:
        return {"pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM", "encoder": "BertModel"}[head]

    def _hf_fields(self, cfg: ModelConfig) -> dict[str, Any]:
        if cfg.pre_layer_norm:
            raise ValueError(
                "pre_layer_norm models have no transformers BERT equivalent; export needs pre_layer_norm: false"
            )
        return cfg.model_dump(exclude={"pre_layer_norm", "model_type", *MODERN_ONLY})

    def hf_config(self, cfg: ModelConfig, head: Head, specials: Any = None) -> dict[str, Any]:
        return {
            "architectures": [self.architecture(head)],
            "model_type": "bert",
            **self._hf_fields(cfg),
            "position_embedding_type": "absolute",  # read by transformers 4.x, ignored by 5.x
            "tie_word_embeddings": True,
        }

    def exported_name(self, key: str, head: Head) -> str | None:
        if head == "encoder":
            return key.removeprefix(self.encoder_prefix) if key.startswith(self.encoder_prefix) else None
        return key if head == "pretraining" or not key.startswith(NSP_ONLY) else None

    def canonical_name(self, key: str, prefixed: bool) -> str:
        """LayerNorm gamma/beta (TensorFlow conversions) -> weight/bias; a BertModel's
        unprefixed `embeddings.*`, `encoder.*`, `pooler.*` -> `bert.*`."""
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        if not prefixed and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = f"bert.{key}"
        return key

    def is_prefixed(self, names) -> bool:
        return any(k.startswith(("bert.", "cls.")) for k in names)

    def config_fields(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        refusals = {
            "position_embedding_type": (
                data.get("position_embedding_type", "absolute") == "absolute",
                "is not absolute",
            ),
            "is_decoder": (not data.get("is_decoder", False), "makes a decoder"),
            "hidden_act": (
                data.get("hidden_act", "gelu") in ("gelu", "gelu_new", "relu"),
                "is not gelu, gelu_new or relu",
            ),
        }
        for name, (ok, why) in refusals.items():
            if not ok:
                raise ValueError(f"{name} {data.get(name)!r} {why}; {where} needs a BERT encoder")
        missing = [k for k in SHAPE_FIELDS if k not in data]
        if missing:
            raise ValueError(f"{', '.join(missing)} missing; not a BERT config.json")
        kept = {k: v for k, v in data.items() if k not in ("pre_layer_norm", "model_type", *MODERN_ONLY)}
        return kept | {"model_type": self.name}

    def expected_shapes(self, cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
        h = cfg.hidden_size
        return {
            "bert.embeddings.word_embeddings.weight": ((cfg.vocab_size, h), "vocab_size, hidden_size"),
            "bert.embeddings.position_embeddings.weight": (
                (cfg.max_position_embeddings, h),
                "max_position_embeddings, hidden_size",
            ),
            "bert.embeddings.token_type_embeddings.weight": ((cfg.type_vocab_size, h), "type_vocab_size, hidden_size"),
            "bert.encoder.layer.0.intermediate.dense.weight": (
                (cfg.intermediate_size, h),
                "intermediate_size, hidden_size",
            ),
        }

    def dropout_overrides(self, p: float) -> dict[str, float]:
        return {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}

    def layer_key(self, index: int, rest: str) -> str:
        return f"bert.encoder.layer.{index}.{rest}"


BERT = Bert()
