"""A BERT encoder (with a fine-tuned task head, optionally) as an ONNX graph, its int8
twin, and ONNX Runtime sessions to run them.

The graph:

    inputs   input_ids, attention_mask, token_type_ids     int64 (batch, sequence)
    outputs  last_hidden_state                             float (batch, sequence, H)
             pooler_output   when the weights hold a trained pooler     (batch, H)
             logits          when a task head is attached   (batch, C) for classification
                             and regression, (batch, sequence, C) for tagging, (batch,
                             sequence, 2) start/end scores for QA

Batch and sequence are dynamic axes: one file serves any batch size and any length up to
the model's max_position_embeddings.

Exporter: torch.onnx's TorchScript exporter (`dynamo=False`, opset 17), with the encoder's
attention in transformers' "eager" form, then ONNX Runtime's transformer optimizer
(`onnxruntime.transformers.optimizer`, model type "bert"), which fuses each layer's
attention into one `Attention` node, the embeddings and their LayerNorm into
`EmbedLayerNormalization`, the residual adds and LayerNorms into `SkipLayerNormalization`
and the bias and GELU into `BiasGelu` (ONNX Runtime's own operators: the file runs in
ONNX Runtime, not in other ONNX runtimes). The optimizer recognises the patterns of the
TorchScript exporter's graph; in the torch.export-based exporter's graph (`dynamo=True`)
it found the LayerNorms and GELUs but no attention, and with transformers' "sdpa"
attention neither exporter's graph gives it one. `fuse` returns what it fused; the
export records it, and checks.py checks the fused graph against PyTorch. The weights are
kept inside the .onnx file (one file, under ONNX's 2 GB limit up to BERT-large).

int8: ONNX Runtime's dynamic quantization (`quantize_dynamic`): the weights of every
MatMul become int8 with one scale per output channel, activations are quantized per
batch at run time. On 256 news sentences through all-MiniLM-L6-v2 (mean-pooled
embeddings against fp32): one scale per channel gave a mean cosine of 0.993 and the same
nearest neighbour for 92% of the sentences; one scale per tensor 0.960 and 75%. The
embedding tables (Gather) stay fp32: quantizing them too gave 90% instead of 92%, and a
table lookup gains no speed from int8.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from bertcore.errors import BertpipeError
from bertcore.model.families import FAMILIES

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
INSTALL = "pip install 'bertpipe[onnx]' (onnx and onnxruntime)"
OPSET = 17
FUSED_OPS = (
    "Attention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "Gelu",
    "FastGelu",
)
"""The fused operators `fuse` counts (ONNX Runtime's names)."""


class MissingOnnx(BertpipeError):
    """onnx or onnxruntime is not installed."""


def require(*modules: str) -> None:
    """Import `modules` (default: both), or raise MissingOnnx naming the install."""
    import importlib

    for name in modules or ("onnx", "onnxruntime"):
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingOnnx(f"ONNX export needs the {name} package, which is not installed: {INSTALL}") from None


class InferenceModel(nn.Module):
    """What the ONNX graph computes: the encoder's last hidden states, its pooled output
    (`pooler`: only when the weights hold a trained pooler) and, given a fine-tuned
    TaskModel, the task head's logits. `encoder` is a transformers BertModel; with
    `task`, its own (fine-tuned) encoder is used instead."""

    def __init__(self, encoder: nn.Module | None = None, *, pooler: bool, task: nn.Module | None = None):
        super().__init__()
        if (encoder is None) == (task is None):
            raise ValueError("pass an encoder or a task model, not both")
        self.encoder = task.encoder if task is not None else encoder
        self.task = task
        self.pooler = pooler

    @property
    def output_names(self) -> list[str]:
        return (
            ["last_hidden_state"]
            + (["pooler_output"] if self.pooler else [])
            + (["logits"] if self.task is not None else [])
        )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        if self.task is None:
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            last, pooled, logits = out.last_hidden_state, getattr(out, "pooler_output", None), None
        else:
            from bertcore.eval.encoder import hidden_states

            states, pooled = hidden_states(self.encoder, input_ids, attention_mask, token_type_ids)
            last = states[-1]  # (B, T, H)
            logits = self.task.head(self.task.head_input(states, pooled, attention_mask))  # eval: no dropout
        if getattr(self.encoder.config, "type_vocab_size", None) is None:
            # an encoder without token types (ModernBERT) ignores them; the graph keeps the input, so every
            # export takes the same three inputs
            last = last + 0 * token_type_ids[..., None].to(last.dtype)
        outputs = [last] + ([pooled] if self.pooler else []) + ([logits] if logits is not None else [])
        return tuple(outputs)


def export(model: InferenceModel, path: str, example: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Write `model` (in eval mode, its attention in the eager form while it is traced) as a fused
    ONNX file with dynamic batch and sequence axes; returns `fuse`'s counts. `example`: one
    batch of the three inputs, traced once; its batch size and length must differ from
    each other and from 1, so no shape in the trace stands for both axes."""
    import contextlib
    import io
    import warnings

    require("onnx", "onnxruntime")
    batch, length = example["input_ids"].shape
    if batch == length or 1 in (batch, length):
        raise ValueError(
            f"the example batch is {batch} x {length}: use a batch size and a length that differ, neither 1"
        )
    model = model.eval()
    switch = getattr(model.encoder, "set_attn_implementation", None)
    previous = getattr(model.encoder.config, "_attn_implementation", None)
    if switch is not None:
        switch("eager")  # the pattern the optimizer fuses (see the module docstring); switched back below
    axes = {0: "batch", 1: "sequence"}
    dynamic = dict.fromkeys((*INPUTS, *model.output_names), axes)
    if "pooler_output" in dynamic:
        dynamic["pooler_output"] = {0: "batch"}
    if "logits" in dynamic and model.task is not None and model.task.kind.pooled:  # (B, C): no sequence axis
        dynamic["logits"] = {0: "batch"}
    # The exporter warns that it is the legacy one and about traced Python values; what
    # matters is checked on held-out text afterwards (checks.py).
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                tuple(example[name] for name in INPUTS),
                path,
                input_names=list(INPUTS),
                output_names=model.output_names,
                dynamic_axes=dynamic,
                opset_version=OPSET,
                dynamo=False,
            )
    finally:
        if switch is not None and previous is not None:
            switch(previous)
    config = model.encoder.config
    family = FAMILIES.get(getattr(config, "model_type", "bert"))
    if family is not None and family.onnx_fusion is None:  # no fusions for this family's graph: left as traced
        return {}
    return fuse(path, num_heads=config.num_attention_heads, hidden_size=config.hidden_size)


def fuse(path: str, *, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Rewrite the ONNX file `path` with ONNX Runtime's BERT fusions (see the module
    docstring); returns {fused operator: count} of FUSED_OPS, zeros left out."""
    import logging

    require("onnx", "onnxruntime")
    from onnxruntime.transformers.optimizer import optimize_model

    quiet = logging.getLogger("onnxruntime.transformers")  # one INFO line per fusion pass
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        optimized = optimize_model(path, model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=1)
    finally:
        quiet.setLevel(level)
    optimized.save_model_to_file(path)
    counts = {}
    for node in optimized.model.graph.node:
        if node.op_type in FUSED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def quantize_int8(source: str, path: str) -> None:
    """The int8 twin of the fp32 ONNX file `source` (see the module docstring)."""
    import logging

    require("onnx", "onnxruntime")
    from onnx import onnx_pb as onnx_proto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()  # quantize_dynamic logs a pre-processing tip on the root logger
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            source,
            path,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Attention"],
            # ONNX's shape inference gives no type to the outputs of ONNX Runtime's fused
            # operators; every tensor of this graph that is quantized is float
            extra_options={"DefaultTensorType": onnx_proto.TensorProto.FLOAT},
        )
    finally:
        quiet.setLevel(level)


def session(path: str, threads: int | None = None, *, spin: bool = True):
    """An ONNX Runtime CPU session of `path`; `threads`: intra-op threads (None: ORT's
    default, every core), with one inter-op thread. spin=False: the threads sleep as soon
    as a run ends, instead of spinning a while for the next one (which would take CPU
    from whatever runs next in the process, e.g. another model in a benchmark)."""
    require("onnxruntime")
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
