"""Distillation as an objective of the one training loop (bertcore.train.objectives.Objective).

Per micro-batch: the frozen teacher (outside the DeepSpeed engine, never in the optimizer)
runs under no_grad and hands over what the loss terms need (the hidden states of the layers
the layer map names, their attention distributions, its MLM logits at the masked
positions); then the engine's module, `DistillStudent`, runs the student and returns the
weighted sum of the terms (bertcore/distill/losses.py). `DistillStudent` is the student
(its family's pretraining model, bertcore/model/families/, whose submodules it holds under
their own names, so its checkpoint names are transformers') plus the learned projections
from its width to the teacher's when they differ: they are trained and checkpointed with
it, and left out of the export. Teacher and student are of one family (the student's shape
is the teacher's config with the student's sizes): a BERT or a modern encoder teaches a
student like itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bertcore.distill import losses
from bertcore.distill.config import DistillLoss
from bertcore.distill.student import from_teacher_state
from bertcore.model.bert import _masked_cross_entropy
from bertcore.model.config import IGNORE_INDEX, ModelConfig, encoder_flops_per_token
from bertcore.model.pretrained import load_into
from bertcore.train.objectives import MicroBatchResult, batch_counts, model_inputs, ratio

PROJECTIONS = "hidden_projections."
"""Prefix of the projections' entries in the student's checkpoint (not exported)."""


@dataclass
class TeacherSignals:
    """What the teacher hands the student for one batch (no gradient)."""

    hidden: list[torch.Tensor]
    """(B, T, H_teacher) per student layer: the output of the teacher layer paired with it."""
    attentions: list[torch.Tensor] | None = None
    """(B, heads, T, T) per student layer, when the attention loss is on."""
    logits: torch.Tensor | None = None
    """(M, V) MLM scores at the masked positions, when the soft-target loss is on."""


@dataclass
class DistillOutput:
    loss: torch.Tensor
    """The weighted sum of the terms whose weight is above 0."""
    terms: dict[str, torch.Tensor]
    """Each computed term (soft_targets, hidden, attention, mlm), unweighted."""
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor


class DistillStudent(nn.Module):
    """The student with, when `teacher_hidden` differs from its width, one learned linear
    projection per student layer onto the teacher's width (`hidden_projections`). The
    family's model's submodules are this module's, under their names (bert.*, cls.*;
    model.*, head.*, decoder.*)."""

    def __init__(
        self, cfg: ModelConfig, teacher_hidden: int, weights: DistillLoss, generator: torch.Generator | None = None
    ):
        super().__init__()
        student = cfg.family.build(cfg, generator)
        for name, child in student.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "student", student)  # its methods, on the same submodules (not registered twice)
        self.cfg = cfg
        self.weights = weights
        if teacher_hidden != cfg.hidden_size:
            self.hidden_projections = nn.ModuleList(
                nn.Linear(cfg.hidden_size, teacher_hidden) for _ in range(cfg.num_hidden_layers)
            )
            with torch.no_grad():
                for projection in self.hidden_projections:
                    nn.init.normal_(projection.weight, 0.0, cfg.hidden_size**-0.5, generator=generator)
                    nn.init.zeros_(projection.bias)
        else:
            self.hidden_projections = None

    def forward(  # type: ignore[override]
        self, input_ids, token_type_ids, attention_mask, labels, teacher: TeacherSignals
    ) -> DistillOutput:
        w = self.weights
        layers = self.student.every_layer(input_ids, token_type_ids, attention_mask, attentions=w.attention > 0)
        real = attention_mask.bool()  # (B, T)
        selected = labels != IGNORE_INDEX  # (B, T)
        logits = self.student.mlm_logits(layers.hidden_states[-1][selected])  # (M, V)
        terms: dict[str, torch.Tensor] = {}
        terms["mlm"], correct, count = _masked_cross_entropy(logits, labels[selected].long(), IGNORE_INDEX)
        if w.soft_targets > 0 and teacher.logits is not None:
            terms["soft_targets"] = losses.soft_target_loss(logits, teacher.logits, w.temperature)
        if w.hidden > 0:
            per_layer = []
            for i, target in enumerate(teacher.hidden):
                state = layers.hidden_states[i + 1]  # (B, T, H)
                if self.hidden_projections is not None:
                    state = self.hidden_projections[i](state)
                per_layer.append(losses.hidden_state_loss(state, target, real, w.hidden_metric))
            terms["hidden"] = torch.stack(per_layer).mean()
        if w.attention > 0 and teacher.attentions is not None:
            terms["attention"] = torch.stack(
                [
                    losses.attention_loss(mine, theirs, real, w.attention_metric)
                    for mine, theirs in zip(layers.attentions, teacher.attentions)
                ]
            ).mean()
        weight = {"mlm": w.mlm, "soft_targets": w.soft_targets, "hidden": w.hidden, "attention": w.attention}
        loss = sum(weight[name] * value for name, value in terms.items() if weight[name] > 0)
        return DistillOutput(loss=loss, terms=terms, mlm_correct=correct, mlm_count=count)


def teacher_signals(
    teacher: nn.Module, inputs: dict[str, torch.Tensor], pairs: list[int], *, attentions: bool, logits: bool
) -> TeacherSignals:
    """The teacher's side of one batch: the outputs (and attention distributions) of the
    layers `pairs` names (1-based), and its MLM logits at the labelled positions."""
    with torch.no_grad():
        out = teacher.every_layer(
            inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"], attentions=attentions
        )
        scores = None
        if logits:
            scores = teacher.mlm_logits(out.hidden_states[-1][inputs["labels"] != IGNORE_INDEX])  # (M, V)
        return TeacherSignals(
            hidden=[out.hidden_states[j] for j in pairs],
            attentions=[out.attentions[j - 1] for j in pairs] if attentions else None,
            logits=scores,
        )


@dataclass
class Distillation:
    """The distillation objective: `teacher_state` (bertcore.model.bert names) in a frozen
    teacher of `teacher_cfg`, a student of `student_cfg` started per `init`, the
    layer map `pairs` and the loss settings. `soft_targets` is False when the teacher has
    no MLM head (that term is then skipped whatever its weight)."""

    student_cfg: ModelConfig
    teacher_cfg: ModelConfig
    teacher_state: dict[str, torch.Tensor]
    pairs: list[int]
    weights: DistillLoss
    init: str = "from_teacher"
    soft_targets: bool = True
    sums: tuple[str, ...] = ("soft_targets", "hidden", "attention", "mlm", "mlm_ok", "mlm_n")
    metrics: tuple[str, ...] = ("soft_target_loss", "hidden_loss", "attention_loss", "mlm_loss", "mlm_accuracy")
    init_report: dict | None = field(default=None, init=False)
    teacher: nn.Module | None = field(default=None, init=False)

    def build(self, generator: torch.Generator, device: torch.device) -> nn.Module:
        teacher = self.teacher_cfg.family.build(self.teacher_cfg)
        load_into(teacher, self.teacher_state, where="distill.teacher")
        self.teacher = teacher.eval().requires_grad_(False).to(device)
        weights = self.weights if self.soft_targets else self.weights.model_copy(update={"soft_targets": 0.0})
        student = DistillStudent(self.student_cfg, self.teacher_cfg.hidden_size, weights, generator)
        if self.init == "from_teacher":
            start = from_teacher_state(self.teacher_state, self.pairs, self.student_cfg.family)
            plan = load_into(student, start, where="distill.student.init")
            self.init_report = {"from_teacher": {"layers": self.pairs, "fresh": plan.fresh}}
        return student

    def forward(self, module: nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> MicroBatchResult:
        inputs = model_inputs(batch, device, "input_ids", "token_type_ids", "attention_mask", "labels")
        w = self.weights
        signals = teacher_signals(
            self.teacher,
            inputs,
            self.pairs,
            attentions=w.attention > 0,
            logits=self.soft_targets and w.soft_targets > 0,
        )
        out: DistillOutput = module(**inputs, teacher=signals)
        counts = batch_counts(batch)
        tokens = counts.tokens
        mlm_n = int(out.mlm_count)
        sums = {
            name: out.terms[name].item() if name in out.terms else 0.0
            for name in ("soft_targets", "hidden", "attention", "mlm")
        }
        sums.update(mlm_ok=int(out.mlm_correct), mlm_n=mlm_n)
        length, masked = counts.attended, mlm_n / max(1, tokens)
        # the student trains (forward and backward), the teacher only runs forward: a third of its training cost
        flops = (
            encoder_flops_per_token(self.student_cfg, length, masked)
            + encoder_flops_per_token(self.teacher_cfg, length, masked) / 3
        ) * tokens
        return MicroBatchResult(out.loss, sums, flops)

    def summarise(self, totals: dict[str, float], micro_batches: float) -> dict[str, Any]:
        w = self.weights

        def term(name: str, on: bool) -> float | None:
            return totals[name] / micro_batches if on else None

        return {
            "soft_target_loss": term("soft_targets", self.soft_targets and w.soft_targets > 0),
            "hidden_loss": term("hidden", w.hidden > 0),
            "attention_loss": term("attention", w.attention > 0),
            "mlm_loss": term("mlm", True),
            "mlm_accuracy": ratio(totals["mlm_ok"], totals["mlm_n"]),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "model_config": self.student_cfg.model_dump(mode="json"),
            "teacher_config": self.teacher_cfg.model_dump(mode="json"),
            "layer_map": self.pairs,
        }


def exportable_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A consolidated DistillStudent state dict without the projections: the student alone."""
    return {k: v for k, v in state.items() if not k.startswith(PROJECTIONS)}
