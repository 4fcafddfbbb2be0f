"""The registry: the stages in flow order, and the run recipe they make up.

This is the one place that knows the order. Adding a stage means writing its folder,
`pipelines/stages/<name>/`: the declaration in its `__init__.py` (`STAGE = Stage(...)`,
pipelines/stage.py) and its work in `work.py` (`run`), and adding the declaration to
`STAGES`; its config
section joins the recipe model (`PipelineConfig`) from here. Only the declarations are
imported here, so loading a recipe imports no Ray, torch or pyarrow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field, create_model, model_validator

from bertcore.config import RayConfig, RunConfig, StorageConfig, read_recipe, validate
from bertcore.errors import ConfigError
from bertcore.inference.config import ServeConfig
from bertcore.section import Section
from pipelines.stage import Stage
from pipelines.stages import corpus, distill, evaluate, examples, pretrain, vocab

STAGES: tuple[Stage, ...] = (
    corpus.STAGE,
    vocab.STAGE,
    examples.STAGE,
    pretrain.STAGE,
    distill.STAGE,
    evaluate.STAGE,
)
REGISTRY: dict[str, Stage] = {stage.name: stage for stage in STAGES}
STAGE_NAMES: tuple[str, ...] = tuple(REGISTRY)

for _position, _stage in enumerate(STAGES):
    _unknown = [name for name in _stage.reads if name not in STAGE_NAMES[:_position]]
    assert not _unknown, f"stage {_stage.name} reads {_unknown}, which do not come before it"


def off_stages(sections: Mapping[str, Any]) -> dict[str, str]:
    """The stages a recipe ({stage: section}) leaves out, with why (Stage.off)."""
    reasons = {stage.name: stage.off(sections) if stage.off is not None else None for stage in STAGES}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def reads_in(stage: Stage, off: Mapping[str, str]) -> tuple[str, ...]:
    """The stages `stage` reads in a recipe that leaves out `off`."""
    return tuple(name for name in stage.reads if name not in off)


def default_reads(stage: Stage) -> tuple[str, ...]:
    """What `stage` reads in a recipe with every section at its defaults (for a stage run
    on its own section, without the rest of a recipe)."""
    return reads_in(stage, off_stages({s.name: s.section.model_construct() for s in STAGES}))


class _Recipe(Section):
    """A whole run: where it lives, how Ray is reached, object-store settings, how
    `bertpipe serve` serves its models, and one section per stage."""

    run: RunConfig = Field(default_factory=RunConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)

    @model_validator(mode="after")
    def _stages_agree(self) -> Any:
        sections = {stage.name: getattr(self, stage.name) for stage in STAGES}
        # e.g. vocab.pretrained defaults to pretrain.init_from
        for stage in STAGES:
            if stage.inherit is not None:
                for key, value in stage.inherit(sections[stage.name], sections).items():
                    setattr(sections[stage.name], key, value)
        # e.g. pretrain.phases must name examples phases, at least as long as theirs
        off = off_stages(sections)
        for stage in STAGES:
            if stage.check is not None and stage.name not in off:
                stage.check(sections[stage.name], {name: sections[name] for name in reads_in(stage, off)})
        return self

    @property
    def off(self) -> dict[str, str]:
        """The stages this recipe leaves out, with why."""
        return off_stages({stage.name: getattr(self, stage.name) for stage in STAGES})


def _section_field(section: type) -> tuple[type, Any]:
    if all(not field.is_required() for field in section.model_fields.values()):
        return section, Field(default_factory=section, description=section.__doc__)
    return section, Field(description=section.__doc__)


PipelineConfig = create_model(
    "PipelineConfig",
    __base__=_Recipe,
    __module__=__name__,
    **{stage.name: _section_field(stage.section) for stage in STAGES},
)
PipelineConfig.__doc__ = _Recipe.__doc__


def parse_config(data: dict) -> Any:
    """Validate a recipe mapping; errors name the dotted key."""
    return validate(PipelineConfig, data)


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Read a recipe (with `extends`), apply `--set` overrides and validate."""
    return parse_config(read_recipe(path, overrides))


def select(only: list[str] | None, from_stage: str | None, off: Mapping[str, str] | None = None) -> list[str]:
    """The stages to run, in flow order, without those the recipe leaves out (`off`,
    stage -> why); naming one of those in `only` is an error that says why."""
    off = off or {}
    for name in (only or []) + ([from_stage] if from_stage else []):
        if name not in REGISTRY:
            raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(STAGE_NAMES)}")
    if only and from_stage:
        raise ConfigError("use either --only or --from, not both")
    for name in only or []:
        if name in off:
            raise ConfigError(f"the {name} stage is off in this recipe: {off[name]}")
    if only:
        chosen = [s for s in STAGE_NAMES if s in only]
    elif from_stage:
        chosen = list(STAGE_NAMES[STAGE_NAMES.index(from_stage) :])
    else:
        chosen = list(STAGE_NAMES)
    return [name for name in chosen if name not in off]
