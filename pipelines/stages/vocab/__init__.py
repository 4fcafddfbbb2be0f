"""The vocab stage's declaration; its work is pipelines/stages/vocab/work.py."""

from __future__ import annotations

from typing import Any

from bertcore.errors import ConfigError
from bertcore.vocab.config import VocabConfig
from pipelines.external import vocabulary_files
from pipelines.stage import External, Stage
from pipelines.storage import Storage


def identify(cfg: VocabConfig, storage: Storage) -> External | None:
    """The content identity of an adopted vocabulary's files (None when training)."""
    if cfg.source != "pretrained":
        return None
    if cfg.pretrained is None:
        raise ConfigError(
            "vocab.source is pretrained but vocab.pretrained is not set; name a vocab.txt, a tokenizer.json "
            "or a model folder (or set distill.teacher or pretrain.init_from)"
        )
    files = vocabulary_files(storage, cfg.pretrained, "vocab.pretrained", byte_level=cfg.byte_level)
    return External(identity={"pretrained": files.identity}, value=files)


def inherit(cfg: VocabConfig, sections: dict[str, Any]) -> dict[str, Any]:
    """vocab.source: pretrained without vocab.pretrained adopts the vocabulary of the model
    the run starts from: distill.teacher when the recipe distils one, else pretrain.init_from."""
    if cfg.source != "pretrained" or cfg.pretrained is not None:
        return {}
    distill = sections["distill"]
    source = distill.teacher if distill.enabled and distill.teacher is not None else sections["pretrain"].init_from
    if source is None:
        raise ValueError(
            "vocab.source is pretrained but neither vocab.pretrained, distill.teacher nor pretrain.init_from "
            "names the vocabulary to adopt"
        )
    return {"pretrained": source}


STAGE = Stage(
    "vocab",
    VocabConfig,
    "pipelines.stages.vocab.work:run",
    reads=("corpus",),
    resumable=False,
    identify=identify,
    inherit=inherit,
    writes="WordPiece vocabulary: vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json "
    "(byte-level BPE: vocab.json and merges.txt instead of vocab.txt)",
)
