"""The sentence-transformers files of an embedding model's folder, without torch: what a
teacher such as all-MiniLM-L6-v2 publishes beside its encoder weights, read from it, and
written beside its student's so that `SentenceTransformer(folder)` loads the student as
the teacher is loaded.

    modules.json                 the module chain: Transformer (the encoder in the folder
                                 itself), Pooling, and Normalize when the teacher has it
    sentence_bert_config.json    the Transformer module's settings (max_seq_length, do_lower_case)
    1_Pooling/config.json        how token vectors become one sentence vector (mean, [CLS], ...)

A teacher folder without these files (a plain BertModel) gets mean pooling, the
sentence-transformers default. Modules other than Transformer, Pooling and Normalize (a
Dense projection, say) hold weights that distillation does not train, so the student is
exported without them and the layout says so in `left_out`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from bertcore.errors import InputDataError

MODULES_FILE = "modules.json"
SENTENCE_CONFIG_FILE = "sentence_bert_config.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
MODULE_CONFIG = "config.json"
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
MAX_BYTES = 1 << 16
"""A sentence-transformers settings file larger than this is not one (MiniLM's are under 1 kB)."""
POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")


def mean_pooling(hidden_size: int) -> dict[str, Any]:
    """1_Pooling/config.json of mean pooling over real tokens (special tokens included)."""
    return {"word_embedding_dimension": hidden_size, **{f"pooling_mode_{m}": m == "mean_tokens" for m in POOLING_MODES}}


@dataclass
class SentenceLayout:
    """How a folder's encoder is used as a sentence-transformers model."""

    pooling: dict[str, Any]
    """The Pooling module's config.json, as the teacher has it (its dimension set to the student's width on export)."""
    normalize: bool = False
    """Whether vectors are scaled to length 1 after pooling (all-MiniLM-L6-v2 does)."""
    max_seq_length: int | None = None
    """The Transformer module's truncation length; None: the model's positions."""
    do_lower_case: bool = False
    source: str = "default"
    """"teacher" when read from the teacher's files, "default" (mean pooling) when it has none."""
    left_out: list[str] = field(default_factory=list)
    """The teacher's modules the student is exported without (types)."""

    @property
    def pooling_name(self) -> str:
        """cls, mean, max or mean_sqrt_len: the mode set in the pooling config (ST's newer
        `pooling_mode` string or the older booleans); "mixed" when several are on."""
        if isinstance(self.pooling.get("pooling_mode"), str):
            return self.pooling["pooling_mode"]
        on = [m for m in POOLING_MODES if self.pooling.get(f"pooling_mode_{m}")]
        return (
            {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max", "mean_sqrt_len_tokens": "mean_sqrt_len"}[
                on[0]
            ]
            if len(on) == 1
            else "mixed"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pooling": self.pooling_name,
            "normalize": self.normalize,
            "max_seq_length": self.max_seq_length,
            "source": self.source,
            "left_out": self.left_out,
        }


def _read_json(path: str) -> Any:
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise InputDataError(f"{path}: more than {MAX_BYTES:,} bytes; not a sentence-transformers settings file")
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise InputDataError(
            f"{path}: cannot read it ({' '.join(str(exc).split())[:160]}); fix or remove the teacher's "
            "sentence-transformers files"
        ) from None


def _modules(folder: str) -> list[dict] | None:
    """The folder's modules.json entries, or None when it has none."""
    path = os.path.join(folder, MODULES_FILE)
    if not os.path.isfile(path):
        return None
    return parse_modules(_read_json(path), path)


def parse_modules(modules: Any, path: str) -> list[dict]:
    """modules.json's entries, checked: each has a type, and a path inside the folder."""
    if not isinstance(modules, list) or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules
    ):
        raise InputDataError(
            f"{path}: not a list of modules with a type each; not a sentence-transformers modules.json"
        )
    for module in modules:
        where = str(module.get("path") or "")
        if os.path.isabs(where) or ".." in where.replace("\\", "/").split("/"):
            raise InputDataError(f"{path}: module path {where!r} leaves the folder")
    return modules


def _pooling_config(module: dict) -> str:
    """Where a Pooling module's config.json lies, relative to the model folder."""
    return f"{str(module.get('path') or '').strip('/')}/{MODULE_CONFIG}".lstrip("/")


def listed_files(modules: list[dict]) -> list[str]:
    """The files `read_layout` may read, given a folder's modules.json entries: modules.json,
    sentence_bert_config.json (optional) and each Pooling module's config.json."""
    return [MODULES_FILE, SENTENCE_CONFIG_FILE] + [_pooling_config(m) for m in modules if m["type"] == POOLING]


def read_layout(folder: str) -> SentenceLayout:
    """How the model in `folder` (local) is used as a sentence model: from its
    sentence-transformers files, or mean pooling when it has none."""
    modules = _modules(folder)
    if modules is None:
        return SentenceLayout(pooling=mean_pooling(0))
    pooling, normalize, left_out = None, False, []
    for module in modules:
        kind = module["type"]
        if kind == POOLING:
            pooling = _read_json(os.path.join(folder, _pooling_config(module)))
        elif kind == NORMALIZE:
            normalize = True
        elif kind != TRANSFORMER:
            left_out.append(kind)
    if not isinstance(pooling, dict):
        raise InputDataError(
            f"{os.path.join(folder, MODULES_FILE)}: no Pooling module with a config.json; a "
            "sentence-transformers folder needs one"
        )
    settings = {}
    if os.path.isfile(os.path.join(folder, SENTENCE_CONFIG_FILE)):
        settings = _read_json(os.path.join(folder, SENTENCE_CONFIG_FILE))
        if not isinstance(settings, dict):
            raise InputDataError(f"{os.path.join(folder, SENTENCE_CONFIG_FILE)}: not a JSON object")
    length = settings.get("max_seq_length")
    return SentenceLayout(
        pooling=pooling,
        normalize=normalize,
        max_seq_length=length if isinstance(length, int) and length > 0 else None,
        do_lower_case=bool(settings.get("do_lower_case", False)),
        source="teacher",
        left_out=left_out,
    )


def write_layout(out_dir: str, layout: SentenceLayout, hidden_size: int, max_positions: int) -> list[str]:
    """Write the sentence-transformers files for an encoder of `hidden_size` saved in
    `out_dir`; returns their paths relative to it."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": POOLING},
    ]
    if layout.normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": NORMALIZE})
    pooling = dict(layout.pooling)
    pooling["embedding_dimension" if "embedding_dimension" in pooling else "word_embedding_dimension"] = hidden_size
    settings = {
        "max_seq_length": min(layout.max_seq_length or max_positions, max_positions),
        "do_lower_case": layout.do_lower_case,
    }
    files = {MODULES_FILE: modules, SENTENCE_CONFIG_FILE: settings, f"{POOLING_DIR}/{MODULE_CONFIG}": pooling}
    for name, body in files.items():
        path = os.path.join(out_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(body, handle, indent=2)
            handle.write("\n")
    return list(files)
