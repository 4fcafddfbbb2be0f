"""The shape of an encoder (`ModelConfig`), its bounds and the constants its state dict
follows, without torch: recipes, `bertpipe status` and the config reference read them, and
importing torch takes seconds. The family (`model_type`: bert, roberta, modernbert; see
bertcore/model/families/) says what a shape means: its named sizes, its parameter count, its
positions and its Hugging Face config; bertcore/model/bert.py and bertcore/model/modernbert.py
build the models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from bertcore.model.families import Head, family
from bertcore.model.families.bert import SIZES as BERT_SIZES
from bertcore.model.families.bert import TIED as BERT_TIED
from bertcore.model.families.bert import bert_parameter_count
from bertcore.section import Section

IGNORE_INDEX = -100
"""Label of a position the MLM loss skips (same as PyTorch's and HF's default)."""

NO_NSP_LABEL = IGNORE_INDEX
"""next_sentence_label of an example without an NSP target (objectives without NSP). The
same value as IGNORE_INDEX, so the data loader's labels go in unchanged and HF's NSP loss
skips them too."""

TIED = BERT_TIED
"""BERT's tied entries (bertcore/model/families/bert.py); another family's are its `tied`."""
TIED_KEYS = tuple(TIED)

SizeName = Literal["tiny", "mini", "small", "medium", "base", "large"]

NAMED_SIZES: dict[str, tuple[int, int, int]] = {name: (s.layers, s.hidden, s.heads) for name, s in BERT_SIZES.items()}
"""BERT's named shapes (layers, hidden, heads); each family lists its own (`Family.sizes`)."""


MAX_SIZES: dict[str, int] = {
    "num_hidden_layers": 256,
    "hidden_size": 16_384,
    "num_attention_heads": 256,
    "intermediate_size": 65_536,
    "vocab_size": 1 << 20,
    "max_position_embeddings": 65_536,
    "type_vocab_size": 1_024,
}
"""The largest value of each size a config may give (BERT-large: 24 layers, 1,024 wide, 16
heads, 4,096 intermediate, 30,522 entries, 512 positions; the largest published
vocabularies are about 250,000). Above them a config.json is damaged or hostile, and
building its model would exhaust memory before anything said so."""
MAX_PARAMETERS = 20_000_000_000
"""The most parameters a config may describe (80 GB of fp32 weights)."""

ModelType = Literal["bert", "roberta", "modernbert"]
"""The families (bertcore/model/families/), by their transformers model_type."""


def parameter_count(vocab: int, hidden: int, layers: int, intermediate: int, positions: int, types: int = 2) -> int:
    """Parameters of a BertForPreTraining of this shape, from the sizes alone (no torch)."""
    return bert_parameter_count(vocab, hidden, layers, intermediate, positions, types)


class ModelConfig(Section):
    """Shape and regularisation of an encoder with pretraining heads (its family: `model_type`)."""

    vocab_size: int = Field(gt=0)
    """Number of rows of the word-embedding matrix (the tokenizer's vocabulary size)."""
    hidden_size: int = Field(default=768, gt=0)
    """Width of every token representation (H)."""
    num_hidden_layers: int = Field(default=12, gt=0)
    """Number of transformer layers (L)."""
    num_attention_heads: int = Field(default=12, gt=0)
    """Attention heads per layer; must divide hidden_size."""
    intermediate_size: int = Field(default=None, gt=0, validate_default=False)  # type: ignore[assignment]
    """Width of the feed-forward layer; 4 x hidden_size when not given."""
    hidden_act: Literal["gelu", "gelu_new", "relu"] = "gelu"
    """Feed-forward and MLM-transform activation: gelu (exact erf, as BERT), gelu_new (tanh approximation), relu."""
    hidden_dropout_prob: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout on embeddings and on each sublayer's output."""
    attention_probs_dropout_prob: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = Field(default=512, gt=0)
    """Longest sequence the position embeddings cover."""
    type_vocab_size: int = Field(default=2, gt=0)
    """Number of segment (token type) ids: 2 for sentence pairs."""
    layer_norm_eps: float = Field(default=1e-12, gt=0.0)
    """Epsilon of every LayerNorm."""
    initializer_range: float = Field(default=0.02, gt=0.0)
    """Standard deviation of the normal initialisation of weights."""
    pad_token_id: int = Field(default=0, ge=0)
    """Id of [PAD]; its embedding row starts at zero and receives no gradient from the input side."""
    pre_layer_norm: bool = False
    """LayerNorm before each sublayer (pre-LN) instead of after the residual (post-LN, as in
    the BERT paper). Pre-LN models do not export to transformers."""
    model_type: ModelType = "bert"
    """The family (bertcore/model/families/): bert (positions 0..T-1, exported as BERT); roberta (RoBERTa's position
    ids: real tokens from pad_token_id + 1 on, padding at pad_token_id, so max_position_embeddings is the longest
    sequence + pad_token_id + 1; exported as RobertaForMaskedLM; what a byte-level BPE vocabulary makes); modernbert
    (the modern encoder: rotary positions, GeGLU, pre-norm without biases, local/global attention; exported as
    ModernBertForMaskedLM)."""
    local_attention: int = Field(default=128, gt=0)
    """modernbert: the window of a local layer in tokens (a token sees local_attention / 2 on each side)."""
    global_attn_every_n_layers: int = Field(default=3, gt=0)
    """modernbert: layers 0, n, 2n, ... attend globally, the others locally."""
    global_rope_theta: float = Field(default=160_000.0, gt=0.0)
    """modernbert: rotary base of the global layers (the paper: 10,000 at 1,024 tokens, 160,000 from the context
    extension on; a training phase may set it, see pretrain.phases[*].global_rope_theta)."""
    local_rope_theta: float = Field(default=10_000.0, gt=0.0)
    """modernbert: rotary base of the local layers."""

    @property
    def family(self):
        """The model family (bertcore/model/families/) this config belongs to."""
        return family(self.model_type)

    @property
    def position_offset(self) -> int:
        """Position id of a sequence's first token: 0, RoBERTa's pad_token_id + 1."""
        return self.family.position_offset(self)

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the positions cover (RoBERTa: 2 fewer than its 514)."""
        return self.max_position_embeddings - self.position_offset

    @model_validator(mode="before")
    @classmethod
    def _default_intermediate(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("intermediate_size") is None:
            data = {**data, "intermediate_size": 4 * int(data.get("hidden_size", 768))}
        return data

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        for key, limit in MAX_SIZES.items():  # before counting: a hostile size would make the count itself huge
            if getattr(self, key) > limit:
                raise ValueError(
                    f"{key} {getattr(self, key):,} is above the {limit:,} bertcore builds ({self._need()})"
                )
        parameters = self.family.parameter_count(self)
        if parameters > MAX_PARAMETERS:
            raise ValueError(
                f"the shape ({self.num_hidden_layers} layers x {self.hidden_size}) is above the "
                f"{MAX_PARAMETERS:.3g} parameters bertcore builds ({self._need()})"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(f"pad_token_id ({self.pad_token_id}) must be below vocab_size ({self.vocab_size})")
        if self.max_sequence_length < 1:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) leaves no position: RoBERTa's start after "
                f"pad_token_id + 1 = {self.position_offset}; give at least {self.position_offset + 1}"
            )
        self.family.check(self)
        return self

    def _need(self) -> str:
        parameters = self.family.parameter_count(self)
        return (
            f"such a model holds {parameters:.3g} parameters, {parameters * 4 / 1e9:,.1f} GB of fp32 weights "
            "before gradients and optimizer states"
        )

    @classmethod
    def named(cls, size: str, vocab_size: int, **overrides: Any) -> ModelConfig:
        """The named shape `size` of the family `model_type` (in `overrides`; default bert:
        tiny, mini, small, medium, base, large) with the given vocabulary; any other field
        may be overridden."""
        shape = family(overrides.get("model_type", "bert")).shape(size, vocab_size)
        return cls(**{**shape, **overrides})

    def to_hf_config_dict(self, head: Head = "pretraining", specials: Any = None) -> dict[str, Any]:
        """The `config.json` body of a folder holding `head` (pretraining, mlm, encoder): what
        transformers' config class of the family accepts, and that loads our state dict
        under the family's exported names (bertcore/model/families/); `specials`: the
        vocabulary's SpecialIds, for a family whose config names its special tokens."""
        return self.family.hf_config(self, head, specials)


def encoder_flops_per_token(cfg: ModelConfig, seq_len: int, masked_fraction: float = 0.0) -> float:
    """Training FLOPs (forward + backward) per processed token, for an MFU estimate.

        flops = 6 * N + 12 * L * H * T  (+ 6 * (H*H + V*H) * masked_fraction)

    N = L * (4*H*H + 2*H*I) is the number of weights in the encoder's matrix products (Q, K,
    V, attention output, two feed-forward matrices; biases, LayerNorms and embedding lookups
    are negligible). Each weight costs 2 FLOPs per token forward and 4 backward, hence 6*N.
    Attention scores (Q K^T) and the weighted sum (P V) each cost 2*T*H FLOPs per token and
    layer forward, 3x that with backward: 12*L*H*T (Kaplan et al. 2020; Chinchilla appendix F).
    T is the padded sequence length the kernels actually run on. The optional last term is
    the MLM head (transform H*H, vocabulary projection V*H) run on `masked_fraction` of tokens,
    as this model does in training; pooler and NSP work once per sequence and are left out.
    Other families count their own matrices (`Family.flops_per_token`); T is then the mean
    number of keys a token attends.
    """
    return cfg.family.flops_per_token(cfg, seq_len, masked_fraction)
