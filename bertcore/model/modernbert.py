"""The modern encoder (bertcore/model/families/modernbert.py says what it is and why) with
its masked-LM head, single-device PyTorch. Submodule names are transformers'
ModernBertForMaskedLM's, so `state_dict()` has its keys and shapes (the tied
`decoder.weight` included, as the BERT model lists its tied entries).

Padding is removed once, before the embeddings (ModernBERT's unpadding): every layer runs
on the N real tokens of the batch, (N, H), and a `Packing` says where each sequence starts
(`cu_seqlens`, as flash-attn's variable-length kernels take it). A batch arrives either
packed, input_ids (1, N) or (N,) with `cu_seqlens` and per-sequence `position_ids` (the
loader's packed collator, bertcore/train/packing.py), or padded, input_ids (B, T) with an
attention_mask (the length-binned loader, fine-tuning, serving); the padded form is
unpadded here and its outputs padded again. Attention never crosses a sequence:

- on a GPU with flash-attn installed and 16-bit activations, flash_attn_varlen_func on the
  packed tokens (a local layer with window_size = local_attention / 2 each side);
- otherwise SDPA on the sequences laid side by side, (S, heads, L, head dim) with L the
  longest sequence: global layers mask the padded keys; local layers attend in chunks of
  local_attention / 2 tokens to their own chunk and its two neighbours, so a token costs
  1.5 x local_attention keys, not L (a dense banded mask for short sequences).

Rotary positions: theta `global_rope_theta` on global layers, `local_rope_theta` on local
ones (set_global_rope_theta changes the first between training phases, as the paper's
context extension does); computed in fp32, halves rotated as transformers does.

In training the MLM head (dense, GELU, norm, tied decoder) runs on the labelled positions
only, as in bertcore/model/bert.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bertcore.model.bert import (
    _ACTIVATIONS,
    IGNORE_INDEX,
    LayerOutputs,
    PretrainingLogits,
    PretrainingOutput,
    _masked_cross_entropy,
)
from bertcore.model.config import ModelConfig
from bertcore.model.families.modernbert import layer_is_global
from bertcore.model.unpadded import (
    Group,
    Packing,
    _banded,
    _flash_varlen,
    apply_rotary,
    local_attention_chunked,
    rotary,
)


def _dropout(p: float) -> nn.Module:
    """Dropout, or nothing at p = 0 (the family's default; a zero dropout still costs a pass in training)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)
        self.drop = _dropout(cfg.hidden_dropout_prob)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(ids)))  # (N, H)


class ModernBertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, is_global: bool):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        self.is_global = is_global
        self.half = cfg.local_attention // 2
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.dropout_p = cfg.attention_probs_dropout_prob
        self.out_drop = _dropout(cfg.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, packing: Packing, rope, probs: list | None = None) -> torch.Tensor:
        """x (N, H) -> (N, H). `rope`: (cos, sin) of the token layout when `packing.flash`,
        else of the side-by-side layout (the groups' slots)."""
        n, h = x.shape
        qkv = self.Wqkv(x).view(n, 3, self.num_heads, self.head_dim)
        dropout_p = self.dropout_p if self.training else 0.0
        cos, sin = rope
        if packing.flash:
            local = not self.is_global and packing.max_seqlen > self.half + 1
            qk = apply_rotary(qkv[:, :2], cos, sin)  # (N, 2, nh, hd)
            window = (self.half, self.half) if local else (-1, -1)
            out = _flash_varlen()(
                qk[:, 0],
                qk[:, 1],
                qkv[:, 2],
                packing.cu_seqlens,
                packing.cu_seqlens,
                packing.max_seqlen,
                packing.max_seqlen,
                dropout_p=dropout_p,
                window_size=window,
            )  # (N, nh, hd)
            return self.out_drop(self.Wo(out.reshape(n, h)))
        # the sequences side by side, group after group, (slots, 3, nh, hd); rotated there (rope is that layout's)
        side = qkv if packing.contiguous else qkv.index_select(0, packing.source)
        qk, v = apply_rotary(side[:, :2], cos, sin), side[:, 2]
        outs, offset = [], 0
        for group in packing.groups:
            rows, length, count = group.rows, group.length, group.rows * group.length
            q, k = qk[offset : offset + count].view(rows, length, 2, self.num_heads, self.head_dim).unbind(2)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # each (rows, nh, length, hd)
            values = v[offset : offset + count].view(rows, length, self.num_heads, self.head_dim).transpose(1, 2)
            out = self._attend(q, k, values, group, dropout_p, probs)  # (rows, nh, length, hd)
            outs.append(out.transpose(1, 2).reshape(count, h))
            offset += count
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        if not packing.contiguous:
            out = out.index_select(0, packing.slot)  # (N, H)
        return self.out_drop(self.Wo(out))

    def _attend(self, q, k, v, group: Group, dropout_p: float, probs: list | None) -> torch.Tensor:
        """Attention within each row of a group: q, k, v (rows, nh, length, hd)."""
        local = not self.is_global and group.length > self.half + 1
        if local and probs is None and group.length > 4 * self.half:
            return local_attention_chunked(q, k, v, group.valid, self.half, dropout_p)
        mask = None if group.full else group.valid[:, None, None, :]  # (rows, 1, 1, L) keys
        if local:  # (rows, 1, L, L): keys within the window; an empty query slot sees its window
            band = _banded(group.length, self.half, q.device)
            mask = band & (group.valid[:, None, None, :] | ~group.valid[:, None, :, None])
        if probs is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # the distribution kept, for distillation
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        attention = scores.softmax(-1)
        probs.append(attention)
        return (F.dropout(attention, dropout_p) if dropout_p else attention) @ v


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(act(x Wi_a) * x Wi_b)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.drop = _dropout(cfg.hidden_dropout_prob)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(value) * gate))


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        self.is_global = layer_is_global(index, cfg.global_attn_every_n_layers)
        # the embeddings end with a norm, so the first layer's attention input is normed already
        self.attn_norm = (
            nn.Identity() if index == 0 else nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)
        )
        self.attn = ModernBertAttention(cfg, self.is_global)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, x: torch.Tensor, packing: Packing, rope, probs: list | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), packing, rope, probs)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """Embeddings, layers and the final norm, on packed tokens (N, H)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)
        self.global_rope_theta = cfg.global_rope_theta

    def _ropes(self, packing: Packing) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) per layer kind (global: True), of the layout the attention runs in."""
        head_dim = self.cfg.hidden_size // self.cfg.num_attention_heads
        positions = packing.position_ids
        if not packing.flash:  # the side-by-side slots: an empty one takes position 0
            positions = positions if packing.contiguous else positions.index_select(0, packing.source)
        return {
            True: rotary(positions, head_dim, self.global_rope_theta),
            False: rotary(positions, head_dim, self.cfg.local_rope_theta),
        }

    def forward(self, ids: torch.Tensor, packing: Packing, every_layer: bool = False, attentions: bool = False):
        """ids (N,) -> the last hidden states (N, H); with `every_layer`, LayerOutputs of
        (N, H) states (embeddings' output first; the last one normed)."""
        longest = self.cfg.max_sequence_length
        if packing.max_seqlen > longest:
            raise ValueError(
                f"sequence length {packing.max_seqlen} exceeds the {longest} tokens max_position_embeddings covers"
            )
        x = self.embeddings(ids)
        packing.flash = x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and not attentions
        packing.flash = packing.flash and _flash_varlen() is not None
        ropes = self._ropes(packing)
        states, probs = [x], [] if attentions else None
        for layer in self.layers:
            x = layer(x, packing, ropes[layer.is_global], probs)
            if every_layer:
                states.append(x)
        x = self.final_norm(x)
        if not every_layer:
            return x
        states[-1] = x
        return LayerOutputs(states, probs)


class ModernBertPredictionHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.act = _ACTIVATIONS[cfg.hidden_act]
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForMaskedLM(nn.Module):
    """The modern encoder with its masked-LM head; names as transformers' ModernBertForMaskedLM."""

    def __init__(self, cfg: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.cfg = cfg
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=True)
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight
        self.init_weights(generator)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """ModernBERT's initialisation: normals truncated at 2 standard deviations, std
        initializer_range for the embeddings, Wqkv and Wi, std / sqrt(2 x layers) for the
        matrices that write into the residual stream (both Wo) and the head's dense; norms 1,
        the decoder bias 0, the [PAD] row 0. Drawn from `generator`."""
        std = self.cfg.initializer_range
        out = std / math.sqrt(2.0 * self.cfg.num_hidden_layers)

        def normal(weight: torch.Tensor, sigma: float) -> None:
            nn.init.trunc_normal_(weight, 0.0, sigma, -2 * sigma, 2 * sigma, generator=generator)

        embeddings = self.model.embeddings.tok_embeddings
        normal(embeddings.weight, std)
        embeddings.weight[embeddings.padding_idx].zero_()
        for layer in self.model.layers:
            normal(layer.attn.Wqkv.weight, std)
            normal(layer.attn.Wo.weight, out)
            normal(layer.mlp.Wi.weight, std)
            normal(layer.mlp.Wo.weight, out)
        normal(self.head.dense.weight, out)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
        nn.init.zeros_(self.decoder.bias)

    def set_global_rope_theta(self, theta: float) -> None:
        """The rotary base of the global layers from now on (a context-extension phase's)."""
        self.model.global_rope_theta = float(theta)

    # -- inputs ---------------------------------------------------------------------------------
    def _unpad(self, input_ids, attention_mask, cu_seqlens, position_ids, max_seqlen, grouped: bool = True):
        """(ids (N,), packing, flat index of each token in a padded batch or None)."""
        if cu_seqlens is not None:  # packed; any padding after the last sequence is left out
            cu = cu_seqlens.reshape(-1)
            n = int(cu[-1])
            seqlen = None if max_seqlen is None else int(max_seqlen)
            pos = None if position_ids is None else position_ids.reshape(-1)[:n]
            return input_ids.reshape(-1)[:n], Packing.of(cu, seqlen, pos, grouped), None
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        packing, flat = Packing.of_mask(attention_mask, grouped)
        return input_ids.reshape(-1).index_select(0, flat), packing, flat

    @staticmethod
    def _pad(x: torch.Tensor, flat: torch.Tensor | None, shape) -> torch.Tensor:
        """(N, ...) token rows back to the input's layout: the padded (B, T, ...) batch, or
        the packed (1, N', ...) / (N', ...) one (zeros on padding)."""
        if flat is None:
            total = shape[-1]
            if total > x.shape[0]:  # padding after the last packed sequence
                x = torch.cat([x, x.new_zeros((total - x.shape[0], *x.shape[1:]))])
            return x.unsqueeze(0) if len(shape) == 2 else x
        out = x.new_zeros((shape[0] * shape[1], *x.shape[1:]))
        return out.index_copy(0, flat, x).view(*shape, *x.shape[1:])

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, **packed) -> torch.Tensor:
        """Last hidden states: (B, T, H) for a padded batch (zeros on padding), (1, N, H) or
        (N, H) for a packed one. token_type_ids are accepted and unused (no segments)."""
        ids, packing, flat = self._unpad(
            input_ids, attention_mask, packed.get("cu_seqlens"), packed.get("position_ids"), packed.get("max_seqlen")
        )
        return self._pad(self.model(ids, packing), flat, input_ids.shape)

    def every_layer(
        self, input_ids, token_type_ids=None, attention_mask=None, attentions: bool = False
    ) -> LayerOutputs:
        """Every hidden state of a padded batch, (B, T, H) each, and with `attentions` every
        layer's attention distribution (B, nh, T, T) (zeros on padding)."""
        ids, packing, flat = self._unpad(input_ids, attention_mask, None, None, None, grouped=not attentions)
        out = self.model(ids, packing, every_layer=True, attentions=attentions)
        probs = out.attentions
        if probs is not None:  # (B, nh, T', T') -> (B, nh, T, T): zeros beyond the longest sequence
            extra = input_ids.shape[1] - packing.max_seqlen
            probs = [F.pad(p, (0, extra, 0, extra)) for p in probs]
        return LayerOutputs([self._pad(s, flat, input_ids.shape) for s in out.hidden_states], probs)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., V) masked-LM scores of hidden states (..., H)."""
        return self.decoder(self.head(hidden))

    def nsp_logits(self, sequence: torch.Tensor) -> None:
        """No next-sentence head."""
        return None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        max_seqlen: torch.Tensor | int | None = None,
        token_type_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
    ) -> PretrainingOutput:
        """MLM loss over `labels` (the shape of input_ids, -100 where nothing is predicted);
        packed (cu_seqlens given) or padded (attention_mask). token_type_ids and
        next_sentence_label are accepted and ignored: the family trains MLM only."""
        if labels is None:
            raise ValueError("labels are required: the modernbert family trains masked LM only")
        ids, packing, flat = self._unpad(input_ids, attention_mask, cu_seqlens, position_ids, max_seqlen)
        hidden = self.model(ids, packing)  # (N, H)
        targets = labels.reshape(-1)[: ids.shape[0]] if flat is None else labels.reshape(-1).index_select(0, flat)
        selected = targets != IGNORE_INDEX
        logits = self.mlm_logits(hidden[selected])  # (M, V)
        loss, correct, count = _masked_cross_entropy(logits, targets[selected].long(), IGNORE_INDEX)
        return PretrainingOutput(loss=loss, mlm_loss=loss, mlm_correct=correct, mlm_count=count)

    def full_logits(self, input_ids, token_type_ids=None, attention_mask=None, **packed) -> PretrainingLogits:
        """MLM scores at every position, as transformers' ModernBertForMaskedLM returns them
        (no next-sentence scores: seq_relationship_logits is None)."""
        return PretrainingLogits(self.mlm_logits(self.encode(input_ids, None, attention_mask, **packed)), None)

    def num_parameters(self) -> int:
        """Distinct trainable numbers (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
