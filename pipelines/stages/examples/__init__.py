"""The examples stage's declaration; its work is pipelines/stages/examples/work.py."""

from __future__ import annotations

from bertcore.examples.config import ExamplesConfig
from pipelines.stage import Stage

CODE_VERSION = "2"  # 2: random next sentences from a keyed sample of shards, not the whole split

STAGE = Stage(
    "examples",
    ExamplesConfig,
    "pipelines.stages.examples.work:run",
    reads=("corpus", "vocab"),
    code_version=CODE_VERSION,
    scratch=("_tokens",),  # the corpus tokenized, which the build tasks read
    writes="masked pretraining sequences: PHASE/{train,validation}/part-NNNNN-lenBBB.arrow",
)
