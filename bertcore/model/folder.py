"""A Hugging Face encoder folder (BERT, RoBERTa, ModernBERT) from outside the run, judged on
the driver before anything is built from it: `pretrain.init_from`, `distill.teacher` (and evaluate's teacher), and
`bertpipe export`'s model folder all go through `check_model_folder`. No torch, no
tensors loaded:

- config.json (at most MAX_CONFIG_BYTES) becomes a ModelConfig through its family
  (model_type; bertcore/model/families/), whose bounds refuse absurd sizes with the memory
  they would need (bertcore/model/config.py);
- the weights are safetensors only (`model.safetensors` or a sharded index): a
  `pytorch_model.bin` is refused with the command that converts it, since a pickle can
  run code;
- of each safetensors file only the header is read: 8 bytes of little-endian length, then
  that many bytes of JSON (at most MAX_HEADER_BYTES, within the file), every tensor's
  dtype, shape and data offsets checked against the file's size, so a truncated or
  header-bombed file is one line naming it;
- the config's sizes must match the tensors' shapes (the family's `expected_shapes`: the
  embeddings, the feed-forward width; and the number of layers);
- which heads the folder holds is read from the tensor names (`has_mlm_head`), never
  guessed from the file name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from math import prod

from pydantic import ValidationError

from bertcore.errors import InputDataError
from bertcore.model.config import ModelConfig
from bertcore.model.families import FAMILIES, Family
from bertcore.model.hf_files import CONFIG_FILE, PYTORCH_BIN, WEIGHT_FILES, WEIGHTS_FILE, weight_files

MAX_CONFIG_BYTES = 1 << 20
"""A config.json larger than this is not a model config (BERT-large's is under 1 kB)."""
MAX_HEADER_BYTES = 100 << 20
"""The largest safetensors header read (safetensors' own limit)."""
MAX_INDEX_BYTES = 64 << 20
"""The largest model.safetensors.index.json read."""
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def bin_refusal(folder: str, key: str) -> str:
    """The one line for a folder whose only weights are a pickle."""
    return (
        f"{key}: {os.path.join(folder, PYTORCH_BIN)} is a pickle; bertpipe reads safetensors only (a pickle "
        "can run code). "
        f"Convert it once where you trust the file: python -c \"import transformers as t; p='{folder}'; "
        "a=t.AutoConfig.from_pretrained(p).architectures[0]; getattr(t, "
        'a).from_pretrained(p).save_pretrained(p, safe_serialization=True)"'
    )


def _bounded_json(path: str, limit: int, what: str):
    try:
        size = os.path.getsize(path)
        if size > limit:
            raise InputDataError(
                f"{path}: {size:,} bytes, more than the {limit:,} a {what} may have; is it the right file?"
            )
        with open(path, "rb") as handle:
            return json.loads(handle.read(limit + 1).decode("utf-8"))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputDataError(f"{path}: cannot read the {what} ({' '.join(str(exc).split())[:160]})") from None


def read_config(folder: str, key: str = "pretrain.init_from") -> ModelConfig:
    """The ModelConfig of `folder`/config.json (its model_type names the family, bert when
    absent; keys bertcore does not use are ignored). Models bertcore cannot reproduce, and
    sizes above ModelConfig's bounds, are refused naming the file and the key."""
    path = os.path.join(folder, CONFIG_FILE)
    data = _bounded_json(path, MAX_CONFIG_BYTES, "model config")
    if not isinstance(data, dict):
        raise InputDataError(f"{path}: a JSON {type(data).__name__}, not a model config")
    model_type = data.get("model_type", "bert")
    if model_type not in FAMILIES:
        raise InputDataError(
            f"{path}: model_type {model_type!r} is not a BERT model (bertcore reads model_type "
            f"{', '.join(FAMILIES)}); {key} needs one of those encoders"
        )
    try:
        fields = FAMILIES[model_type].config_fields(data, key)
    except (ValueError, TypeError) as exc:
        raise InputDataError(f"{path}: {exc}") from None
    try:
        return ModelConfig.model_validate({k: v for k, v in fields.items() if k in ModelConfig.model_fields})
    except ValidationError as exc:
        problems = "; ".join(
            (f"{'.'.join(map(str, e['loc']))}: " if e["loc"] else "") + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()[:3]
        )
        raise InputDataError(f"{path}: {problems}") from None


def read_header(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's header, without reading any
    tensor; InputDataError naming the file when it is not a whole, sane safetensors file."""

    def bad(why: str) -> InputDataError:
        return InputDataError(
            f"{path}: not a readable safetensors file ({why}); save the model again with save_pretrained, or "
            "use another copy"
        )

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            length = int.from_bytes(head, "little")
            if length > MAX_HEADER_BYTES:
                raise bad(f"its header claims {length:,} bytes, more than the {MAX_HEADER_BYTES:,} allowed")
            if 8 + length > size:
                raise bad(
                    f"truncated: the header claims {length:,} bytes and the file holds {size - 8:,} after the length"
                )
            raw = handle.read(length)
    except OSError as exc:
        raise InputDataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise bad("its header is not JSON") from None
    if not isinstance(data, dict):
        raise bad("its header is not a JSON object")
    room = size - 8 - length
    tensors = {}
    for name, info in data.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            ok = (
                dtype in DTYPE_BYTES
                and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(start, int)
                and isinstance(end, int)
            )
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise bad(f"tensor {name!r:.80} has no valid dtype, shape and data_offsets")
        if not 0 <= start <= end <= room:
            raise bad(f"truncated: tensor {name!r:.80} lies at bytes {start:,}-{end:,} of a data section of {room:,}")
        if end - start != prod(shape) * DTYPE_BYTES[dtype]:
            raise bad(f"tensor {name!r:.80} of shape {list(shape)} {dtype} does not fit its {end - start:,} bytes")
        tensors[name] = (dtype, shape)
    return tensors


def weights_path(folder: str, key: str) -> tuple[str, str]:
    """(file name, path) of the folder's weights: model.safetensors or a safetensors index;
    no weights, or only a pytorch_model.bin (`bin_refusal`), is an InputDataError naming `key`."""
    found = weight_files(os.listdir(folder))
    if not found:
        raise InputDataError(f"{folder}: no weights ({', '.join(WEIGHT_FILES)}); {key} needs a saved model folder")
    if found[0] == PYTORCH_BIN:
        raise InputDataError(bin_refusal(folder, key))
    return found[0], os.path.join(folder, found[0])


def weight_shapes(
    folder: str, family: Family, key: str = "pretrain.init_from"
) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(the weights file, {canonical tensor name of `family`: shape}) of a model folder,
    from the safetensors headers alone; a folder with only a pytorch_model.bin is refused
    (`bin_refusal`)."""
    name, path = weights_path(folder, key)
    if name == WEIGHTS_FILE:
        headers = read_header(path)
    else:
        index = _bounded_json(path, MAX_INDEX_BYTES, "safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and "/" not in v and v not in ("", ".", "..") for v in weight_map.values()
        ):
            raise InputDataError(f"{path}: no weight_map of file names; not a safetensors index")
        headers = {}
        for shard in sorted(set(weight_map.values())):
            headers.update(read_header(os.path.join(folder, shard)))
    prefixed = family.is_prefixed(headers)
    return path, {family.canonical_name(name, prefixed): shape for name, (_, shape) in headers.items()}


@dataclass
class ModelFolder:
    """A checked model folder: its config, the weights file, the tensors' shapes by name."""

    config: ModelConfig
    weights: str
    shapes: dict[str, tuple[int, ...]]

    @property
    def has_mlm_head(self) -> bool:
        """Whether the weights hold a masked-LM prediction head (BertForMaskedLM,
        BertForPreTraining, ModernBertForMaskedLM), by the tensor names."""
        return self.config.family.mlm_head_entry in self.shapes


def check_model_folder(folder: str, key: str = "pretrain.init_from") -> ModelFolder:
    """`folder`'s config.json and weights, checked against each other (see the module
    docstring); one InputDataError line naming the file otherwise."""
    config = read_config(folder, key)
    family = config.family
    weights, shapes = weight_shapes(folder, family, key)
    where = os.path.join(folder, CONFIG_FILE)
    for name, (shape, fields) in family.expected_shapes(config).items():
        if name not in shapes:
            raise InputDataError(f"{weights}: no {name}; {key} needs the weights of a {family.name} encoder")
        if tuple(shapes[name]) != shape:
            raise InputDataError(
                f"{weights}: {name} has shape {list(shapes[name])} but {where} gives ({fields}) = "
                f"{list(shape)}; the config and the weights are of different models"
            )
    layers = {int(m.group(1)) for n in shapes if (m := family.layer_pattern.match(n))}
    if layers != set(range(config.num_hidden_layers)):
        raise InputDataError(
            f"{weights}: holds encoder layers {_ranges(layers)} but {where} gives num_hidden_layers "
            f"{config.num_hidden_layers}; the config and the weights are of different models"
        )
    return ModelFolder(config, weights, shapes)


def _ranges(values: set[int]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    return f"0-{ordered[-1]}" if ordered == list(range(ordered[-1] + 1)) else ", ".join(map(str, ordered[:8]))
