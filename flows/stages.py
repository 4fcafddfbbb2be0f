"""The stages in flow order and what the flow needs of each: run it, or say what its
fingerprint would be now (for `bertpipe status` and skip decisions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bertcore.config import STAGES, PipelineConfig
from pipelines import corpus, evaluate, examples, pretrain, vocab
from pipelines.stage import Manifest
from pipelines.storage import Storage


@dataclass(frozen=True)
class StageSpec:
    name: str
    run: Callable[..., tuple[Manifest, bool]]
    expected_fingerprint: Callable[[PipelineConfig, Storage], str]
    directory: str
    """The stage's directory under run.root (evaluate writes `eval/`)."""


REGISTRY: dict[str, StageSpec] = {
    "corpus": StageSpec("corpus", corpus.run, corpus.expected_fingerprint, "corpus"),
    "vocab": StageSpec("vocab", vocab.run, vocab.expected_fingerprint, "vocab"),
    "examples": StageSpec("examples", examples.run, examples.expected_fingerprint, "examples"),
    "pretrain": StageSpec("pretrain", pretrain.run, pretrain.expected_fingerprint, "pretrain"),
    "evaluate": StageSpec("evaluate", evaluate.run, evaluate.expected_fingerprint, evaluate.DIRECTORY),
}
assert tuple(REGISTRY) == STAGES


def select(only: list[str] | None, from_stage: str | None) -> list[str]:
    """The stages to run, in flow order."""
    from bertcore.errors import ConfigError

    for name in (only or []) + ([from_stage] if from_stage else []):
        if name not in REGISTRY:
            raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}")
    if only and from_stage:
        raise ConfigError("use either --only or --from, not both")
    if only:
        return [s for s in STAGES if s in only]
    if from_stage:
        return list(STAGES[STAGES.index(from_stage):])
    return list(STAGES)
