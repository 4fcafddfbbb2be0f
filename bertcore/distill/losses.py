"""The distillation loss terms, on tensors. Each is 0 when the student's tensors equal the
teacher's, ignores padding, and is a mean (over masked positions, real tokens, or real
queries), so its size does not depend on the batch's shape.

- soft targets (Hinton et al. 2015; DistilBERT's L_ce): KL(p_teacher || p_student) of the
  masked-LM distributions softened by a temperature T, times T^2 so that its gradients keep
  their size as T changes;
- hidden states (DistilBERT's cosine loss L_cos; TinyBERT's MSE): per real token;
- attention maps (TinyBERT, MiniLM): per real query, over real keys, head by head when the
  head counts agree, else on each side's distribution averaged over its heads (a mean of
  distributions is a distribution, so KL still applies).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

EPS = 1e-12
"""Floor of a probability under a logarithm."""


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` (same shape, bool) holds; 0 (still in the graph) when nowhere."""
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1)


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * mean over the M masked positions of KL(softmax(t / T) || softmax(s / T));
    logits (M, V). 0 when M is 0."""
    if student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_student = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (M, V)
    log_teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)  # (M,)
    return kl.mean() * temperature**2


def hidden_state_loss(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, metric: Literal["cosine", "mse"]
) -> torch.Tensor:
    """Mean over real tokens (mask (B, T) True) of 1 - cos(s, t) or of the mean squared
    difference per element; hidden states (B, T, H), the student's already projected to
    the teacher's width."""
    if metric == "cosine":
        per_token = 1.0 - F.cosine_similarity(student.float(), teacher.float(), dim=-1, eps=1e-8)  # (B, T)
    else:
        per_token = (student.float() - teacher.float()).pow(2).mean(-1)  # (B, T)
    return _masked_mean(per_token, mask)


def attention_loss(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, metric: Literal["kl", "mse"]
) -> torch.Tensor:
    """Attention distributions (B, heads, T, T) of one layer pair (rows: queries, columns:
    keys). mask (B, T): real tokens. kl: mean over heads and real queries of
    KL(teacher row || student row); mse: mean squared difference over heads and real
    (query, key) pairs. With different head counts both sides are averaged over heads."""
    if student.shape[1] != teacher.shape[1]:
        student, teacher = student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)
    student, teacher = student.float(), teacher.float()
    keys = mask[:, None, None, :]  # (B, 1, 1, T)
    queries = mask[:, None, :].expand(-1, student.shape[1], -1)  # (B, heads, T)
    if metric == "kl":
        # padded keys carry no probability on either side; their terms are left out
        terms = torch.where(
            keys & (teacher > 0), teacher * (teacher.clamp(min=EPS).log() - student.clamp(min=EPS).log()), 0.0
        )
        return _masked_mean(terms.sum(-1), queries)  # per (B, heads, query)
    pairs = queries[..., None] & keys  # (B, heads, T, T)
    return _masked_mean((student - teacher).pow(2), pairs)
