"""The BERT encoder with its pretraining heads (masked LM + next sentence prediction).

Single-device PyTorch: DeepSpeed, Ray and data loading wrap it from outside. Submodule
names follow Hugging Face's `BertForPreTraining`, so `state_dict()` has exactly the keys
and shapes `transformers` saves and loads (tied entries included: `cls.predictions.decoder.
weight` is the word-embedding matrix and `cls.predictions.decoder.bias` is
`cls.predictions.bias`, as in HF). Export is a state-dict copy; files that store shared
tensors once omit the TIED_KEYS.

Two departures from HF that change speed, not results:
- In training, the MLM head (transform + vocabulary projection) runs only on the masked
  positions (about 15% of tokens), never on every token. With a 30k vocabulary the
  projection costs more than a small encoder, so this is the largest saving.
- Attention is `F.scaled_dot_product_attention` on one fused QKV projection.

`model_type="roberta"` gives RoBERTa's position ids (bertcore/model/config.py): the same
modules, exported under transformers' RobertaForMaskedLM names (`roberta_name`).

`pre_layer_norm=True` gives the pre-LN variant (Xiong et al. 2020: LayerNorm before each
sublayer, one final LayerNorm). It reuses the post-LN parameter names (the "output"
LayerNorms act on the sublayer input instead) and adds `bert.encoder.LayerNorm`; HF's
BERT has no such architecture, so it does not export to `transformers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from bertcore.model.config import (  # noqa: F401 - the shape lives without torch; re-exported here
    IGNORE_INDEX,
    NAMED_SIZES,
    NO_NSP_LABEL,
    TIED,
    TIED_KEYS,
    ModelConfig,
    SizeName,
    encoder_flops_per_token,
)

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.roberta_positions = cfg.model_type == "roberta"
        self.pad_token_id = cfg.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        if self.roberta_positions:
            # RoBERTa: real tokens count up from pad + 1, padding sits at pad (B, T)
            real = (input_ids != self.pad_token_id).long()
            positions = torch.cumsum(real, dim=1) * real + self.pad_token_id
        else:
            positions = torch.arange(t, device=input_ids.device)  # (T,), broadcast over the batch
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))  # (B, T, H)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, probs: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """`probs`, when given, receives this layer's attention distributions (B, nh, T, T)
        (before dropout): the explicit softmax then replaces the fused kernel."""
        b, t, h = x.shape
        # One (H, 3H) product instead of three (H, H) ones; the weights stay separate
        # parameters so the checkpoint keeps HF's names. The concatenation is a small copy.
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
        qkv = F.linear(x, w, bias).view(b, t, 3, self.num_heads, h // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, nh, T, hd)
        # mask (B, 1, 1, T) bool, True = key is a real token; padded queries still attend to
        # the real keys, so every row has a finite softmax.
        # With dropout (training) PyTorch picks its unfused "math" kernel; without, a fused one.
        dropout_p = self.dropout_p if self.training else 0.0
        if probs is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:  # what SDPA computes, with the distribution kept (attention distillation reads it)
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            attention = scores.softmax(-1)
            probs.append(attention)
            out = F.dropout(attention, dropout_p) @ v if dropout_p else attention @ v
        return out.transpose(1, 2).reshape(b, t, h)  # (B, T, H)


class BertResidualOutput(nn.Module):
    """A projection back to the hidden size and its LayerNorm: the attention output
    (`attention.output`, from the hidden size) and the feed-forward output (`output`, from
    the intermediate size). The LayerNorm comes after the residual in post-LN, before the
    sublayer in pre-LN."""

    def __init__(self, cfg: ModelConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertResidualOutput(cfg, cfg.hidden_size)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertResidualOutput(cfg, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.pre_layer_norm = cfg.pre_layer_norm

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, probs: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        attn_out, ffn_out = self.attention.output, self.output
        if self.pre_layer_norm:
            # x + Attn(LN(x)), then x + FFN(LN(x))
            x = x + attn_out.dropout(attn_out.dense(self.attention.self(attn_out.LayerNorm(x), mask, probs)))
            hidden = self.act(self.intermediate.dense(ffn_out.LayerNorm(x)))  # (B, T, I)
            return x + ffn_out.dropout(ffn_out.dense(hidden))
        # LN(x + Attn(x)), then LN(x + FFN(x))
        x = attn_out.LayerNorm(x + attn_out.dropout(attn_out.dense(self.attention.self(x, mask, probs))))
        hidden = self.act(self.intermediate.dense(x))  # (B, T, I)
        return ffn_out.LayerNorm(x + ffn_out.dropout(ffn_out.dense(hidden)))


class LayerOutputs(NamedTuple):
    hidden_states: list[torch.Tensor]
    """L + 1 tensors (B, T, H): the embeddings' output, then each layer's output."""
    attentions: list[torch.Tensor] | None
    """L tensors (B, nh, T, T): each layer's attention distribution over the keys, when asked for."""


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        # Pre-LN leaves the residual stream unnormalised; one LayerNorm closes it.
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.pre_layer_norm else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x if self.LayerNorm is None else self.LayerNorm(x)

    def every_layer(self, x: torch.Tensor, mask: torch.Tensor | None, attentions: bool = False) -> LayerOutputs:
        """What `forward` computes, with every layer's output kept (and, with `attentions`,
        its attention distributions)."""
        states, probs = [x], [] if attentions else None
        for layer in self.layer:
            x = layer(x, mask, probs)
            states.append(x)
        if self.LayerNorm is not None:
            states[-1] = self.LayerNorm(states[-1])
        return LayerOutputs(states, probs)


class BertPooler(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence[:, 0]))  # (B, H), from [CLS]


class BertModel(nn.Module):
    """Embeddings, encoder and pooler: what fine-tuning heads sit on."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, token_type_ids, attention_mask: (B, T); attention_mask 1/True for real
        tokens, 0/False for padding. Returns the last hidden states (B, T, H)."""
        return self.encoder(*self._embed(input_ids, token_type_ids, attention_mask))

    def _embed(self, input_ids, token_type_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The embeddings' output (B, T, H) and the key mask (B, 1, 1, T), True = real token."""
        t = input_ids.shape[1]
        if t > self.cfg.max_sequence_length:
            raise ValueError(
                f"sequence length {t} exceeds the {self.cfg.max_sequence_length} tokens max_position_embeddings "
                f"({self.cfg.max_position_embeddings}) covers"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        return self.embeddings(input_ids, token_type_ids), mask

    def every_layer(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        attentions: bool = False,
    ) -> LayerOutputs:
        """`forward` with every hidden state kept (hidden_states[-1] is its result) and,
        with `attentions`, every layer's attention distributions (for distillation)."""
        return self.encoder.every_layer(*self._embed(input_ids, token_type_ids, attention_mask), attentions)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        # The output projection is the input embedding matrix (V, H) plus an output-only
        # bias. Both are registered under decoder.* too, because HF's checkpoints list them.
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, device="meta")  # storage comes from the ties
        self.decoder.weight = word_embeddings.weight
        self.decoder.bias = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg, word_embeddings)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


@dataclass
class PretrainingOutput:
    """Losses and counts of one batch. Counts are tensors so reading them is the caller's
    choice of when to synchronise; accuracy = mlm_correct / mlm_count."""

    loss: torch.Tensor
    """mlm_loss + nsp_loss (scalar)."""
    mlm_loss: torch.Tensor
    """Mean cross-entropy over the labelled positions of the batch (0 when there are none)."""
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor
    nsp_loss: torch.Tensor | None = None
    """Mean cross-entropy over examples with a label other than -1; None without NSP labels."""
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None


class PretrainingLogits(NamedTuple):
    prediction_logits: torch.Tensor
    """(B, T, V) masked-LM scores at every position."""
    seq_relationship_logits: torch.Tensor
    """(B, 2) next-sentence scores: 0 = B follows A, 1 = B is random."""


def _masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore: int):
    """Mean loss over targets != ignore (0 if none, still connected to the graph), the
    number of correct argmax predictions, and the number of targets counted."""
    valid = targets != ignore
    count = valid.sum()
    loss = F.cross_entropy(logits, targets, ignore_index=ignore, reduction="sum") / count.clamp(min=1)
    correct = ((logits.argmax(-1) == targets) & valid).sum()
    return loss, correct, count


class BertForPreTraining(nn.Module):
    """BERT with masked-LM and next-sentence heads; parameter names as in transformers."""

    def __init__(self, cfg: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg)
        self.cls = BertPreTrainingHeads(cfg, self.bert.embeddings.word_embeddings)
        self.init_weights(generator)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation: weights ~ normal(0, initializer_range), biases 0, LayerNorm
        gain 1 and shift 0, the [PAD] embedding row 0 (as transformers does). The draws come
        from `generator`, so a seeded generator gives the same model everywhere."""
        std = self.cfg.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                if module is self.cls.predictions.decoder:
                    continue  # tied to the word embeddings and to predictions.bias
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.cls.predictions.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        masked_labels: torch.Tensor | None = None,
    ) -> PretrainingOutput:
        """Training losses. MLM targets come either as `labels` (B, T), -100 where no
        prediction is made, or as `masked_positions` (B, P) with `masked_labels` (B, P),
        -100 on padding entries (whose position may be any valid index). Only those
        positions go through the MLM head. `next_sentence_label` (B,): 0 = B follows A,
        1 = random B, -100 (NO_NSP_LABEL) = no NSP target; None skips the NSP head entirely."""
        if (labels is None) == (masked_positions is None):
            raise ValueError("pass exactly one of labels (B, T) or masked_positions (B, P) with masked_labels")
        sequence = self.bert(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        if labels is not None:
            selected = labels != IGNORE_INDEX  # (B, T)
            hidden, targets = sequence[selected], labels[selected]  # (M, H), (M,)
        else:
            if masked_labels is None or masked_labels.shape != masked_positions.shape:
                raise ValueError("masked_labels must be given with the same shape as masked_positions")
            index = masked_positions.long().unsqueeze(-1).expand(-1, -1, sequence.shape[-1])  # (B, P, H)
            hidden = sequence.gather(1, index).flatten(0, 1)  # (B*P, H)
            targets = masked_labels.flatten()
        mlm_logits = self.cls.predictions(hidden)  # (M, V)
        mlm_loss, mlm_correct, mlm_count = _masked_cross_entropy(mlm_logits, targets.long(), IGNORE_INDEX)
        out = PretrainingOutput(loss=mlm_loss, mlm_loss=mlm_loss, mlm_correct=mlm_correct, mlm_count=mlm_count)
        if next_sentence_label is not None:
            nsp_logits = self.cls.seq_relationship(self.bert.pooler(sequence))  # (B, 2)
            out.nsp_loss, out.nsp_correct, out.nsp_count = _masked_cross_entropy(
                nsp_logits, next_sentence_label.long().view(-1), NO_NSP_LABEL
            )
            out.loss = mlm_loss + out.nsp_loss
        return out

    def full_logits(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> PretrainingLogits:
        """MLM scores at every position (B, T, V) and NSP scores (B, 2), as
        transformers' BertForPreTraining returns them: for evaluation, export checks, probing."""
        sequence = self.bert(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        return PretrainingLogits(
            prediction_logits=self.cls.predictions(sequence),
            seq_relationship_logits=self.cls.seq_relationship(self.bert.pooler(sequence)),
        )

    # -- what every family's pretraining model offers (bertcore/model/families/) -----------------
    def encode(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """The last hidden states (B, T, H)."""
        return self.bert(input_ids, token_type_ids, attention_mask)

    def every_layer(self, input_ids, token_type_ids=None, attention_mask=None, attentions: bool = False):
        """Every hidden state (and with `attentions` every attention distribution): BertModel.every_layer."""
        return self.bert.every_layer(input_ids, token_type_ids, attention_mask, attentions)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., V) masked-LM scores of hidden states (..., H)."""
        return self.cls.predictions(hidden)

    def nsp_logits(self, sequence: torch.Tensor) -> torch.Tensor:
        """(B, 2) next-sentence scores of the last hidden states (B, T, H), through the pooler."""
        return self.cls.seq_relationship(self.bert.pooler(sequence))

    def num_parameters(self) -> int:
        """Distinct trainable numbers (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
