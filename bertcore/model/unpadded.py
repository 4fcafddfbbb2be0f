"""The layout of an unpadded batch for the modern encoder (bertcore/model/modernbert.py):
where each sequence of N packed tokens lies (`Packing`, from cu_seqlens or a padded batch's
attention mask) and its side-by-side layout for SDPA in groups of similar length, rotary
positions, and local attention in chunks; flash-attn's variable-length kernel when it is
installed. Pure tensor functions, no parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def _flash_varlen():
    """flash-attn's variable-length kernel, or None when flash-attn is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


GROUP_FILL = 0.75
"""On the SDPA path sequences are laid side by side in groups of similar length: a sequence
joins a group whose longest is at most 1 / GROUP_FILL times its own (a mixed-length batch
then pads little inside attention, and each group is one attention call)."""


@dataclass
class Group:
    """Sequences laid side by side for attention: `rows` of `length` slots."""

    rows: int
    length: int
    valid: torch.Tensor  # (rows, length) bool: the slot holds a token
    full: bool  # no empty slot


@dataclass
class Packing:
    """Where the sequences of N packed tokens lie, and their side-by-side layout for the
    SDPA path: groups of similar length, one after the other. Built once per forward."""

    cu_seqlens: torch.Tensor  # (S+1,) int32: sequence s is tokens cu[s]:cu[s+1]
    max_seqlen: int  # L, the longest sequence
    position_ids: torch.Tensor  # (N,) long, 0 at each sequence's first token
    slot: torch.Tensor  # (N,) long: the token's index in the side-by-side layout
    source: torch.Tensor  # (slots,) long: the token each slot reads (0 for an empty slot)
    groups: list[Group]
    contiguous: bool  # the side-by-side layout is the token layout itself
    flash: bool = False  # attention by flash-attn's varlen kernel on the token layout (set by the model)

    @classmethod
    def of(
        cls, cu_seqlens: torch.Tensor, max_seqlen: int | None = None, position_ids=None, grouped: bool = True
    ) -> Packing:
        """grouped=False: one group, the sequences in their order (every sequence's attention
        map the same size, as attention distillation reads them)."""
        cu = cu_seqlens.to(torch.int64)
        device = cu.device
        lengths = (cu[1:] - cu[:-1]).tolist()
        s, n = len(lengths), int(cu[-1])
        longest = max(lengths) if max_seqlen is None else int(max_seqlen)
        order = sorted(range(s), key=lambda k: -lengths[k]) if grouped else list(range(s))
        members: list[list[int]] = []  # the sequences of each group, longest first
        sizes: list[int] = []  # each group's length
        for k in order:
            if members and (not grouped or lengths[k] >= GROUP_FILL * sizes[-1]):
                members[-1].append(k)
            else:
                members.append([k])
                sizes.append(lengths[k] if grouped else longest)
        start, base = [0] * s, 0  # each sequence's first slot
        for m, size in zip(members, sizes):
            for row, k in enumerate(m):
                start[k] = base + row * size
            base += len(m) * size
        sequence = torch.repeat_interleave(torch.arange(s, device=device), cu[1:] - cu[:-1])  # (N,)
        within = torch.arange(n, device=device) - cu[:-1][sequence]  # (N,) position in its sequence
        slot = torch.tensor(start, dtype=torch.int64, device=device)[sequence] + within
        total = base
        source = torch.zeros(total, dtype=torch.int64, device=device)
        source[slot] = torch.arange(n, device=device)
        valid = torch.zeros(total, dtype=torch.bool, device=device)
        valid[slot] = True
        offset, groups = 0, []
        for m, size in zip(members, sizes):
            part = valid[offset : offset + len(m) * size].view(len(m), size)
            groups.append(Group(len(m), size, part, all(lengths[k] == size for k in m)))
            offset += len(m) * size
        return cls(
            cu_seqlens=cu_seqlens.to(torch.int32),
            max_seqlen=longest,
            position_ids=within if position_ids is None else position_ids.reshape(-1).to(torch.int64),
            slot=slot,
            source=source,
            groups=groups,
            contiguous=len(groups) == 1 and groups[0].full and order == list(range(s)),
        )

    @classmethod
    def of_mask(cls, attention_mask: torch.Tensor, grouped: bool = True) -> tuple[Packing, torch.Tensor]:
        """The packing of a padded batch's real tokens (attention_mask (B, T), 1 = real)
        and their indexes in the flattened (B*T) batch; positions are the columns, as
        transformers numbers them."""
        real = attention_mask.bool()
        lengths = real.sum(1)
        cu = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)
        flat = torch.nonzero(real.reshape(-1), as_tuple=False).squeeze(1)  # (N,)
        columns = flat % real.shape[1]
        return cls.of(cu, int(lengths.max()), columns, grouped), flat


def rotary(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin (N, 1, 1, head_dim / 2) of the positions (N,) at rotary base `theta`, in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = (positions[:, None].float() * inv_freq)[:, None, None, :]  # (N, 1, 1, hd/2)
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, ..., hd) rotated as transformers does (each half-dim pair (x1, x2) of the two
    halves turned by the position's angle: x1 cos - x2 sin, x2 cos + x1 sin), in fp32, back
    in x's dtype."""
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def _banded(length: int, half: int, device) -> torch.Tensor:
    """(L, L) bool: |query - key| <= half."""
    index = torch.arange(length, device=device)
    return (index[:, None] - index[None, :]).abs() <= half


def local_attention_chunked(q, k, v, valid: torch.Tensor, half: int, dropout_p: float) -> torch.Tensor:
    """Attention of each query to the keys within `half` positions of it, in chunks of
    `half` queries that see their own chunk and the two beside it (3 x half keys).
    q, k, v: (S, nh, L, hd); valid: (S, L) bool, the slots that hold a token. Returns
    (S, nh, L, hd). What a dense banded mask gives, at O(L x half) cost."""
    s, nh, length, hd = q.shape
    c = half
    chunks = math.ceil(length / c)
    padded = chunks * c

    def pad_seq(x, before, after):  # (S, nh, L, hd) -> (S, nh, before + L + after, hd)
        return F.pad(x, (0, 0, before, after))

    q = pad_seq(q, 0, padded - length).view(s, nh, chunks, c, hd)
    window = 3 * c
    # keys and values with a chunk of zeros on each side, cut into overlapping windows
    k = pad_seq(k, c, padded - length + c).unfold(2, window, c).transpose(-1, -2)  # (S, nh, chunks, 3c, hd)
    v = pad_seq(v, c, padded - length + c).unfold(2, window, c).transpose(-1, -2)
    keys_valid = F.pad(valid, (c, padded - length + c)).unfold(1, window, c)  # (S, chunks, 3c)
    queries_valid = F.pad(valid, (0, padded - length)).view(s, chunks, c)
    i = torch.arange(c, device=q.device)[:, None]
    j = torch.arange(window, device=q.device)[None, :]
    band = (j - c - i).abs() <= half  # (c, 3c): key j of the window is within `half` of query i
    # an empty query slot attends to its whole window: finite, and its output is dropped
    mask = band & (keys_valid[:, :, None, :] | ~queries_valid[:, :, :, None])  # (S, chunks, c, 3c)

    def fold(x, rows):  # (S, nh, chunks, rows, hd) -> (S*chunks, nh, rows, hd)
        return x.permute(0, 2, 1, 3, 4).reshape(s * chunks, nh, rows, hd)

    out = F.scaled_dot_product_attention(
        fold(q, c),
        fold(k, window),
        fold(v, window),
        attn_mask=mask.reshape(s * chunks, 1, c, window),
        dropout_p=dropout_p,
    )  # (S*chunks, nh, c, hd)
    out = out.view(s, chunks, nh, c, hd).permute(0, 2, 1, 3, 4).reshape(s, nh, padded, hd)
    return out[:, :, :length]
