"""Running a stage under the contract (pipelines/stage.py), the same way for every stage:

1. look up the complete outputs of the stages it reads (`UpstreamMissing` names the first
   one that is not there and the command that makes it);
2. check its section against what those stages were configured with (`Stage.check`);
3. compute its fingerprint from its section, the seed, the upstream fingerprints and the
   content identity of its external files;
4. keep a complete output with that fingerprint, or reset the directory (keeping the
   finished units of a resumable stage) and call `run`;
5. write the manifest, last.

`Pipeline` does this over a whole run config and memoises what one invocation needs more
than once: the external identities (the corpus inputs are listed once) and the expected
fingerprints that `bertpipe status` follows down the declared inputs.
"""

from __future__ import annotations

import time
from typing import Any

import yaml

from bertcore.config import resolved_yaml
from bertcore.errors import BertpipeError, ConfigError
from pipelines.registry import REGISTRY, PipelineConfig
from pipelines.stage import (
    External,
    Manifest,
    Output,
    Stage,
    StageDir,
    StageRun,
    Upstream,
    UpstreamMissing,
)
from pipelines.storage import Storage


def upstream(stage: Stage, root: str, storage: Storage) -> dict[str, Upstream]:
    """The complete outputs `stage` reads, by stage name."""
    found = {}
    for name in stage.reads:
        directory = StageDir(storage, root, REGISTRY[name].directory)
        manifest = directory.manifest()
        if manifest is None:
            raise UpstreamMissing(
                f"the {name} stage has no output under {directory.uri}: run `bertpipe run --only {name}` (or the whole flow) first"
            )
        found[name] = Upstream(directory, manifest)
    return found


def check_against(stage: Stage, section: Any, inputs: dict[str, Upstream]) -> None:
    """`Stage.check` against the sections the upstream stages were run with."""
    if stage.check is None:
        return
    sections = {name: REGISTRY[name].section.model_validate(up.manifest.config) for name, up in inputs.items()}
    try:
        stage.check(section, sections)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run_stage(
    name: str,
    section: Any,
    *,
    root: str,
    storage: Storage,
    seed: int,
    force: bool = False,
    parallelism: int | None = None,
    external: External | None = None,
    resolved_config: str | None = None,
) -> tuple[Manifest, bool]:
    """Run one stage on its own section; returns (manifest, whether it was computed now).
    `external` is the stage's identified external files (identified here when not given);
    `resolved_config` is written next to the output (default: the section alone)."""
    stage = REGISTRY[name]
    inputs = upstream(stage, root, storage)
    check_against(stage, section, inputs)
    if external is None and stage.identify is not None:
        external = stage.identify(section, storage)
    fp = stage.fingerprint(section, seed, {n: up.fingerprint for n, up in inputs.items()}, external)
    directory = StageDir(storage, root, stage.directory)
    if (done := directory.reuse_or_reset(fp, force=force, keep_progress=stage.resumable)) is not None:
        return done, False
    started = time.perf_counter()
    value = None if external is None else external.value
    run = StageRun(section, seed, storage, directory, fp, inputs, external=value, parallelism=parallelism)
    output: Output = stage.run(run)
    manifest = Manifest(
        stage=stage.name,
        code_version=stage.code_version,
        fingerprint=fp,
        inputs={**stage.fingerprint_inputs(section, seed, {n: up.fingerprint for n, up in inputs.items()}, external), **output.inputs},
        config=section.model_dump(mode="json"),
        shards=output.shards,
        stats=output.stats,
        timings={**output.timings, "total_s": round(time.perf_counter() - started, 3)},
        skipped=output.skipped,
        report=output.report,
        tables=output.tables,
    )
    if resolved_config is None:
        resolved_config = yaml.safe_dump({name: manifest.config}, sort_keys=False, allow_unicode=True)
    directory.write_manifest(manifest, resolved_config)
    return manifest, True


def explain_stale(stage: Stage, section: Any, manifest: Manifest, inputs: dict[str, Any]) -> list[str]:
    """Why a stage's output no longer matches: the code version, the settings of its section
    that differ from what its manifest recorded, the upstream stages whose fingerprint
    moved, the seed, the external files that changed (`inputs`: what would go into the
    fingerprint now, as `Stage.fingerprint_inputs` gives it)."""
    reasons = []
    if manifest.code_version != stage.code_version:
        reasons.append(f"code version {manifest.code_version} -> {stage.code_version}")
    now, then = stage.config_identity(section.model_dump(mode="json")), stage.config_identity(manifest.config)
    reasons += [f"{stage.name}.{key}: {old!r} -> {new!r}" for key, old, new in _differences(then, now)]
    for name, value in inputs.items():
        old = manifest.inputs.get(name)
        if name == "external":
            reasons += [f"input {key}: {a!r} -> {b!r}" for key, a, b in _differences(old or {}, value)] or ([] if old == value else ["its input files"])
        elif old != value:
            reasons.append(f"run.seed: {old} -> {value}" if name == "seed" else f"upstream {name} changed ({old} -> {value})")
    return reasons or ["recorded before the fingerprint's inputs were kept in manifests"]


def _differences(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old, new) for every leaf that differs between two JSON values."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(old) + [k for k in new if k not in old]
        return [d for k in keys for d in _differences(old.get(k), new.get(k), f"{key}.{k}" if key else str(k))]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _differences(a, b, f"{key}[{i}]")]
    return [] if old == new else [(key, old, new)]


class Pipeline:
    """The stages of one run config, for one invocation (a flow run, a `bertpipe status`)."""

    def __init__(self, cfg: PipelineConfig, storage: Storage | None = None):
        self.cfg = cfg
        self.storage = storage or Storage(cfg.storage)
        self._external: dict[str, External | None] = {}
        self._expected: dict[str, str] = {}

    def section(self, name: str) -> Any:
        return getattr(self.cfg, name)

    def dir(self, name: str) -> StageDir:
        return StageDir(self.storage, self.cfg.run.root, REGISTRY[name].directory)

    def external(self, name: str) -> External | None:
        if name not in self._external:
            stage = REGISTRY[name]
            self._external[name] = None if stage.identify is None else stage.identify(self.section(name), self.storage)
        return self._external[name]

    def expected_fingerprint(self, name: str) -> str:
        """What the stage's fingerprint would be if every stage before it ran on this config."""
        if name not in self._expected:
            stage = REGISTRY[name]
            upstream_fps = {read: self.expected_fingerprint(read) for read in stage.reads}
            self._expected[name] = stage.fingerprint(self.section(name), self.cfg.run.seed, upstream_fps, self.external(name))
        return self._expected[name]

    def run(self, name: str, *, force: bool = False, parallelism: int | None = None) -> tuple[Manifest, bool]:
        """Run stage `name` (parallelism: most Ray tasks in flight, default ray.parallelism)."""
        return run_stage(
            name,
            self.section(name),
            root=self.cfg.run.root,
            storage=self.storage,
            seed=self.cfg.run.seed,
            force=force,
            parallelism=parallelism or self.cfg.ray.parallelism,
            external=self.external(name),
            resolved_config=resolved_yaml(self.cfg),
        )

    def why_stale(self, name: str, manifest: Manifest) -> list[str]:
        stage = REGISTRY[name]
        upstream_fps = {read: self.expected_fingerprint(read) for read in stage.reads}
        inputs = stage.fingerprint_inputs(self.section(name), self.cfg.run.seed, upstream_fps, self.external(name))
        return explain_stale(stage, self.section(name), manifest, inputs)

    def status(self) -> list[dict[str, Any]]:
        """Per stage: complete / stale / incomplete / missing (or unknown when the expected
        fingerprint cannot be computed, e.g. inputs that no longer exist), with its figures."""
        rows = []
        for name, stage in REGISTRY.items():
            directory = self.dir(name)
            manifest = directory.manifest()
            try:
                expected, note = self.expected_fingerprint(name), ""
            except BertpipeError as exc:
                expected, note = None, str(exc)
            state = directory.state(expected) if expected is not None else ("missing" if manifest is None else "unknown")
            changed = self.why_stale(name, manifest) if state == "stale" else []
            rows.append(
                {
                    "stage": name,
                    "state": state,
                    "fingerprint": manifest.fingerprint if manifest else None,
                    "expected_fingerprint": expected,
                    "rows": manifest.rows if manifest else None,
                    "bytes": manifest.bytes if manifest else None,
                    "seconds": manifest.timings.get("total_s") if manifest else None,
                    "uri": directory.uri,
                    "note": note,
                    "changed": changed,
                }
            )
        return rows
