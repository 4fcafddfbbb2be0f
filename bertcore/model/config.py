"""The shape of a BERT encoder (`ModelConfig`, the named sizes) and the constants its
state dict follows, without torch: recipes, `bertpipe status` and the config reference
read them, and importing torch takes seconds. bertcore/model/bert.py builds the model from them.

RoBERTa (`model_type: roberta`, Liu et al. 2019) is the same encoder with three
differences of data, not of architecture: its position ids start after the padding id
(real tokens at pad_token_id + 1, + 2, ..., padding at pad_token_id: 514 positions for 512
tokens with <pad> = 1), one token type, and LayerNorm epsilon 1e-5. `roberta_shape` gives
them; `roberta_name` maps the state dict onto transformers' RobertaForMaskedLM names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from bertcore.section import Section

IGNORE_INDEX = -100
"""Label of a position the MLM loss skips (same as PyTorch's and HF's default)."""

NO_NSP_LABEL = IGNORE_INDEX
"""next_sentence_label of an example without an NSP target (objectives without NSP). The
same value as IGNORE_INDEX, so the data loader's labels go in unchanged and HF's NSP loss
skips them too."""

TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
"""state_dict entry that aliases another -> the entry it aliases (BertLMPredictionHead ties
them). Whatever rebuilds a full state dict from stored tensors fills these in from here."""

TIED_KEYS = tuple(TIED)

ROBERTA_NAMES = (
    ("bert.", "roberta."),
    ("cls.predictions.transform.dense.", "lm_head.dense."),
    ("cls.predictions.transform.LayerNorm.", "lm_head.layer_norm."),
    ("cls.predictions.decoder.", "lm_head.decoder."),
    ("cls.predictions.bias", "lm_head.bias"),
)
"""bertcore's (BertForPreTraining's) name prefix -> transformers' RobertaForMaskedLM's."""
ROBERTA_UNEXPORTED = ("bert.pooler.", "cls.seq_relationship.")
"""Entries RobertaForMaskedLM has no place for (it has neither a pooler nor an NSP head)."""


def roberta_name(key: str) -> str | None:
    """transformers' RobertaForMaskedLM name of a bertcore state-dict entry; None for the
    pooler and the NSP head, which it does not hold."""
    if key.startswith(ROBERTA_UNEXPORTED):
        return None
    for ours, theirs in ROBERTA_NAMES:
        if key.startswith(ours):
            return theirs + key[len(ours) :]
    raise ValueError(f"{key} has no RobertaForMaskedLM name")


def from_roberta_name(key: str) -> str:
    """bertcore's name of a transformers RoBERTa entry (`roberta.*`, `lm_head.*`); other names unchanged."""
    for ours, theirs in ROBERTA_NAMES:
        if key.startswith(theirs):
            return ours + key[len(theirs) :]
    return key


"""Files that store each tensor once (safetensors, transformers' `save_pretrained`) leave
these out; load such files with strict=False and expect exactly these keys missing."""

SizeName = Literal["tiny", "mini", "small", "medium", "base", "large"]

# (layers, hidden, heads): Devlin et al. 2019 (base, large); Turc et al. 2019 (the rest).
NAMED_SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


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

ModelType = Literal["bert", "roberta"]


def roberta_shape(pad_token_id: int, max_length: int = 512) -> dict[str, Any]:
    """RoBERTa's departures from a named BERT shape, for a vocabulary whose <pad> has id
    `pad_token_id` and sequences of up to `max_length` tokens (roberta-base: 514 positions)."""
    return {
        "model_type": "roberta",
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": pad_token_id,
        "max_position_embeddings": max_length + pad_token_id + 1,
    }


def parameter_count(vocab: int, hidden: int, layers: int, intermediate: int, positions: int, types: int = 2) -> int:
    """Parameters of a BertForPreTraining of this shape, from the sizes alone (no torch):
    embeddings (V + P + T) x H and their LayerNorm; per layer the four attention matrices,
    the two feed-forward matrices, biases and two LayerNorms; pooler, MLM transform and
    bias (the decoder is tied to the word embeddings), NSP head."""
    embeddings = (vocab + positions + types) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden * intermediate + intermediate + hidden + 4 * hidden
    heads = (hidden * hidden + hidden) + (hidden * hidden + 3 * hidden) + vocab + (2 * hidden + 2)
    return embeddings + layers * layer + heads


class ModelConfig(Section):
    """Shape and regularisation of a BERT encoder with pretraining heads."""

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
    """bert: positions 0..T-1, exported as BERT; roberta: RoBERTa's position ids (real tokens from pad_token_id + 1 on,
    padding at pad_token_id, so max_position_embeddings is the longest sequence + pad_token_id + 1), exported as
    RobertaForMaskedLM. A byte-level BPE vocabulary makes the pretrain stage build one (roberta_shape)."""

    @property
    def position_offset(self) -> int:
        """Position id of a sequence's first token: 0, RoBERTa's pad_token_id + 1."""
        return self.pad_token_id + 1 if self.model_type == "roberta" else 0

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the position embeddings cover (RoBERTa: 2 fewer than its 514)."""
        return self.max_position_embeddings - self.position_offset

    @model_validator(mode="before")
    @classmethod
    def _default_intermediate(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("intermediate_size") is None:
            data = {**data, "intermediate_size": 4 * int(data.get("hidden_size", 768))}
        return data

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        parameters = parameter_count(
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            self.intermediate_size,
            self.max_position_embeddings,
            self.type_vocab_size,
        )
        need = (
            f"such a model holds {parameters:.3g} parameters, {parameters * 4 / 1e9:,.1f} GB of fp32 weights "
            "before gradients and optimizer states"
        )
        for key, limit in MAX_SIZES.items():
            if getattr(self, key) > limit:
                raise ValueError(f"{key} {getattr(self, key):,} is above the {limit:,} bertcore builds ({need})")
        if parameters > MAX_PARAMETERS:
            raise ValueError(
                f"the shape ({self.num_hidden_layers} layers x {self.hidden_size}) is above the "
                f"{MAX_PARAMETERS:.3g} parameters bertcore builds ({need})"
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
        return self

    @classmethod
    def named(cls, size: str, vocab_size: int, **overrides: Any) -> ModelConfig:
        """The published BERT shape `size` (tiny, mini, small, medium, base, large) with the
        given vocabulary; any other field may be overridden."""
        if size not in NAMED_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(NAMED_SIZES)}")
        layers, hidden, heads = NAMED_SIZES[size]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab_size)
        return cls(**{**fields, **overrides})

    def to_hf_config_dict(self, architecture: str = "BertForPreTraining") -> dict[str, Any]:
        """A `config.json` body that `transformers.BertConfig(**d)` accepts and that loads our
        state dict into `transformers.BertForPreTraining` (or the `architecture` named). A
        roberta model's is a RobertaConfig of a RobertaForMaskedLM (names: `roberta_name`)."""
        if self.pre_layer_norm:
            raise ValueError(
                "pre_layer_norm models have no transformers BERT equivalent; export needs pre_layer_norm: false"
            )
        hf = self.model_dump(exclude={"pre_layer_norm", "model_type"})
        if self.model_type == "roberta":
            return {"architectures": ["RobertaForMaskedLM"], "model_type": "roberta", **hf, "tie_word_embeddings": True}
        return {
            "architectures": [architecture],
            "model_type": "bert",
            **hf,
            "position_embedding_type": "absolute",  # read by transformers 4.x, ignored by 5.x
            "tie_word_embeddings": True,
        }


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
    """
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    matmul_weights = layers * (4 * h * h + 2 * h * i)
    attention = 12 * layers * h * seq_len
    mlm_head = 6 * (h * h + cfg.vocab_size * h) * masked_fraction
    return float(6 * matmul_weights + attention + mlm_head)
