"""The examples stage's declaration; its work is pipelines/stages/examples/work.py."""

from __future__ import annotations

from bertcore.examples.config import ExamplesConfig
from pipelines.stage import Stage

CODE_VERSION = "1"

STAGE = Stage(
    "examples",
    ExamplesConfig,
    "pipelines.stages.examples.work:run",
    reads=("corpus", "vocab"),
    code_version=CODE_VERSION,
    writes="masked pretraining sequences: PHASE/{train,validation}/part-NNNNN-lenBBB.arrow",
)
