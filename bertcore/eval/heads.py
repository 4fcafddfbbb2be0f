"""Fine-tuned task models the evaluate stage keeps, so that `bertpipe export --task NAME`
can put a task head on the exported encoder.

One safetensors file per task and model: the whole `TaskModel` (the encoder as
fine-tuning left it, and the head). Fine-tuning moves every encoder weight unless
`freeze_encoder` is set, so a head alone on the original encoder would not give the
fine-tuned predictions. The file's metadata (strings, as safetensors keeps them) says how
to rebuild it: the task type, labels, what the head reads (layers, combine, pooling), how
long inputs were read, whether it reads text pairs, the seed, what it was trained on, and
the sha256 of the encoder weights fine-tuning started from, which export compares with the
model it exports. No pickles: weights and JSON only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from bertcore.errors import InputDataError

FORMAT = "bertpipe-task-model/1"
HEADS_DIR = "heads"
"""Folder of the evaluate stage's directory that holds them: heads/<model>/<task>.safetensors."""


def head_path(model: str, task: str) -> str:
    """Where the evaluate stage keeps the fine-tuned `task` model of encoder `model`
    (pretrained, ...), relative to its directory."""
    return f"{HEADS_DIR}/{model}/{task}.safetensors"


@dataclass
class TaskHead:
    """What a saved task model is (kept in the file's metadata)."""

    task: str
    type: str
    """The task's kind (bertcore/eval/kinds/): what its logits are and how they decode."""
    labels: list[str]
    num_outputs: int
    layers: list[int] | str
    combine: str
    pooling: str
    seed: int
    trained_on: str
    """Which examples fine-tuned it, e.g. "the whole training file (200 examples)"."""
    encoder_sha256: str
    """sha256 of the model.safetensors fine-tuning started from."""
    max_seq_length: int
    long_inputs: dict | None = None
    """How fine-tuning read inputs longer than max_seq_length: None, truncated; or in
    windows, {"window_stride", "window_pool", "max_windows"} (bertcore/eval/windows.py).
    The saved model scores one window; to score a long input as fine-tuning did, pool its
    windows' head inputs the same way (with mean pooling, averaging the windows' logits
    gives the same result, the head being linear)."""
    pairs: bool = False
    """Fine-tuned on text pairs (the task's `text_b`: MRPC-, STS-, NLI-style): it reads
    `[CLS] a [SEP] b [SEP]` with token types 0 then 1, and a single text means nothing to it."""


def save_task_model(path: str, model, head: TaskHead) -> None:
    """Write `model` (a TaskModel) and `head` to the safetensors file `path`."""
    import safetensors.torch

    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    metadata = {"format": FORMAT, "head": json.dumps(asdict(head))}
    safetensors.torch.save_file(tensors, path, metadata=metadata)
    sort_header(path)


def sort_header(path: str) -> None:
    """Rewrite a safetensors file's JSON header with its keys sorted: safetensors writes the
    metadata from a hash map, so two identical runs gave files (and manifest sha256s) that
    differed in the order of two keys. The data and its offsets stay as they are."""
    with open(path, "r+b") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        if len(text) > size:  # never: the same keys, no spaces; kept from growing for safety
            return
        handle.seek(8)
        handle.write(text + b" " * (size - len(text)))  # the same length: the data does not move


def read_head(path: str) -> TaskHead:
    """The metadata of a saved task model, without reading its weights."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (OSError, SafetensorError) as exc:
        raise InputDataError(f"{path}: cannot read the saved task model ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise InputDataError(
            f"{path}: not a task model saved by bertpipe's evaluate stage (format {metadata.get('format')!r})"
        )
    return TaskHead(**json.loads(metadata["head"]))


def load_task_model(path: str, encoder_dir: str):
    """(TaskModel in eval mode, TaskHead) from a saved file; `encoder_dir` gives the
    encoder's architecture (config.json), the file gives every weight."""
    import safetensors.torch

    from bertcore.eval import kinds
    from bertcore.eval.encoder import Features, TaskModel, load_encoder

    head = read_head(path)
    try:
        kind = kinds.get(head.type)
    except ValueError as exc:
        raise InputDataError(f"{path}: a saved task model this bertpipe cannot rebuild ({exc})") from None
    encoder = load_encoder(encoder_dir, random_init=True)  # architecture only: every weight is replaced below
    layers = head.layers if isinstance(head.layers, str) else tuple(head.layers)
    features = Features(layers=layers, combine=head.combine, pooling=head.pooling)
    window_pool = (head.long_inputs or {}).get("window_pool", "mean")
    model = TaskModel(encoder, kind, head.num_outputs, features=features, window_pool=window_pool)
    state = safetensors.torch.load_file(path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        reason = " ".join(str(exc).split())[:300]
        raise InputDataError(
            f"{path}: the saved task model does not fit the encoder in {encoder_dir} ({reason})"
        ) from None
    return model.eval(), head
