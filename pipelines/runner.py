"""Running a stage under the contract (pipelines/stage.py), the same way for every stage:

1. look up the complete outputs of the stages it reads (`UpstreamMissing` names the first
   one that is not there and the command that makes it);
2. check its section against what those stages were configured with (`Stage.check`);
3. compute its fingerprint from its section, the seed, the upstream fingerprints and the
   content identity of its external files;
4. keep a complete, intact output with that fingerprint, or reset the directory (keeping
   the finished units of a resumable stage, dropping damaged shards);
5. for a stage that declares `verify_inputs` (pretraining), check every upstream shard it
   will read against its manifest by its stamp (size and mtime or ETag, one listing of the
   store; the bytes only with `--verify` or where a stamp changed): missing or damaged ones
   raise `DamagedShards` (`Pipeline.run` recomputes them and tries again). The readers hash
   the bytes they use as they read them (bertcore/train/shard_cache.py), so the driver
   never reads a shard's content before the workers start;
6. call `run`, and write the manifest, last;
7. remove the stage's scratch (`Stage.scratch`) unless run.keep_scratch: after the
   manifest, so a crash in between leaves a complete stage whose next run (skipped, the
   output being complete) removes it.

`Pipeline` does this over a whole run config and memoises what one invocation needs more
than once: the external identities (the corpus inputs are listed once) and the expected
fingerprints that `bertpipe status` follows down the declared inputs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import yaml

from bertcore.config import resolved_yaml
from bertcore.errors import BertpipeError, ConfigError
from pipelines import stage_log
from pipelines.content_id import rehashing
from pipelines.registry import REGISTRY, PipelineConfig, default_reads, reads_in
from pipelines.stage import External, Output, Stage, StageRun, Upstream, UpstreamMissing
from pipelines.stage_dir import MANIFEST, DamagedManifest, DamagedShards, Manifest, StageDir
from pipelines.storage import Storage, join

log = logging.getLogger(__name__)

MODEL_FOLDER_STAGES = {"pretrain": "pretrain.init_from", "distill": "distill.teacher"}
"""Stages that may read a model folder from outside the run root, with the key naming it."""


def upstream(stage: Stage, root: str, storage: Storage, reads: tuple[str, ...] | None = None) -> dict[str, Upstream]:
    """The complete outputs `stage` reads (`reads`, default: what it reads in a default
    recipe), by stage name."""
    found = {}
    for name in default_reads(stage) if reads is None else reads:
        directory = StageDir(storage, root, REGISTRY[name].directory)
        try:
            manifest = directory.manifest()
        except DamagedManifest as exc:
            raise DamagedManifest(f"{exc} (run `bertpipe run --only {name}`)") from None
        if manifest is None:
            raise UpstreamMissing(
                f"the {name} stage has no output under {directory.uri}: run `bertpipe run --only {name}` (or "
                "the whole flow) first"
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
    verify: bool = False,
    parallelism: int | None = None,
    external: External | None = None,
    resolved_config: str | None = None,
    reads: tuple[str, ...] | None = None,
    keep_scratch: bool = False,
) -> tuple[Manifest, bool]:
    """Run one stage on its own section; returns (manifest, whether it was computed now).
    `verify` re-hashes every shard checked (else only those whose size or stamp changed);
    `external` is the stage's identified external files (identified here when not given);
    `resolved_config` is written next to the output (default: the section alone); `reads`:
    the stages it reads in this recipe (default: those of a default recipe); `keep_scratch`
    (run.keep_scratch) leaves the stage's scratch folders in place."""
    stage = REGISTRY[name]
    inputs = upstream(stage, root, storage, reads)
    check_against(stage, section, inputs)
    if external is None and stage.identify is not None:
        external = stage.identify(section, storage)
    fp = stage.fingerprint(section, seed, {n: up.fingerprint for n, up in inputs.items()}, external)
    directory = StageDir(storage, root, stage.directory, verify=verify)
    if (done := directory.reuse_or_reset(fp, force=force, keep_progress=stage.resumable)) is not None:
        if not keep_scratch:  # what a crash after the manifest (or run.keep_scratch before) left
            directory.remove_scratch(stage.scratch)
        stage_log.finished(name, done, False, 0.0)
        return done, False
    if stage.verify_inputs:
        verify_inputs(inputs, rehash=verify)
    stage_log.started(name, fp, inputs, external, parallelism)
    started = time.perf_counter()
    value = None if external is None else external.value
    run = StageRun(section, seed, storage, directory, fp, inputs, external=value, parallelism=parallelism, force=force)
    output: Output = stage.work()(run)
    manifest = Manifest(
        stage=stage.name,
        code_version=stage.code_version,
        fingerprint=fp,
        inputs={
            **stage.fingerprint_inputs(section, seed, {n: up.fingerprint for n, up in inputs.items()}, external),
            **output.inputs,
        },
        config=section.model_dump(mode="json"),
        shards=output.shards,
        stats=output.stats,
        timings={**output.timings, "total_s": round(time.perf_counter() - started, 3)},
        skipped=output.skipped,
        report=output.report,
        tables=output.tables,
        headline=output.headline,
    )
    if resolved_config is None:
        resolved_config = yaml.safe_dump({name: manifest.config}, sort_keys=False, allow_unicode=True)
    directory.write_manifest(manifest, resolved_config)
    if not keep_scratch:
        directory.remove_scratch(stage.scratch)
    stage_log.finished(name, manifest, True, manifest.timings["total_s"])
    return manifest, True


def verify_inputs(inputs: dict[str, Upstream], rehash: bool = False) -> None:
    """Check every shard of the upstream outputs by its stamp (or its bytes, `rehash`);
    DamagedShards names those that are missing or differ."""
    for name, up in inputs.items():
        problems = (up.dir.verifying() if rehash else up.dir).problems(up.manifest)
        if problems:
            listed = ", ".join(f"{up.path(p)} ({state})" for p, state in sorted(problems.items())[:5])
            more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
            raise DamagedShards(
                f"the {name} stage's output does not match its manifest: {listed}{more}; "
                f"`bertpipe run --only {name}` recomputes them",
                stage=name,
                paths=sorted(problems),
            )


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
            reasons += [f"input {key}: {a!r} -> {b!r}" for key, a, b in _differences(old or {}, value)] or (
                [] if old == value else ["its input files"]
            )
        elif old != value:
            reasons.append(
                f"run.seed: {old} -> {value}" if name == "seed" else f"upstream {name} changed ({old} -> {value})"
            )
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
    """The stages of one run config, for one invocation (a flow run, a `bertpipe status`).
    `verify` re-hashes every shard a check looks at and every local input (`--verify`)."""

    def __init__(self, cfg: PipelineConfig, storage: Storage | None = None, *, verify: bool = False):
        self.cfg = cfg
        self.storage = storage or Storage(cfg.storage)
        self.verify = verify
        self._external: dict[str, External | None] = {}
        self._expected: dict[str, str] = {}
        self.off = cfg.off
        """The stages this recipe leaves out, with why."""

    def section(self, name: str) -> Any:
        return getattr(self.cfg, name)

    def dir(self, name: str) -> StageDir:
        return StageDir(self.storage, self.cfg.run.root, REGISTRY[name].directory, verify=self.verify)

    def external(self, name: str) -> External | None:
        """The stage's external files with their content identity (with `verify`, local
        inputs are hashed again rather than taken from the hash cache)."""
        if name not in self._external:
            stage = REGISTRY[name]
            with rehashing() if self.verify else contextlib.nullcontext():
                self._external[name] = (
                    None if stage.identify is None else stage.identify(self.section(name), self.storage)
                )
        return self._external[name]

    def expected_fingerprint(self, name: str) -> str:
        """What the stage's fingerprint would be if every stage before it ran on this config."""
        if name not in self._expected:
            stage = REGISTRY[name]
            upstream_fps = {read: self.expected_fingerprint(read) for read in self.reads(name)}
            self._expected[name] = stage.fingerprint(
                self.section(name), self.cfg.run.seed, upstream_fps, self.external(name)
            )
        return self._expected[name]

    def reads(self, name: str) -> tuple[str, ...]:
        """The stages `name` reads in this recipe."""
        return reads_in(REGISTRY[name], self.off)

    def run(self, name: str, *, force: bool = False, parallelism: int | None = None) -> tuple[Manifest, bool]:
        """Run stage `name` (parallelism: most Ray tasks in flight, default ray.parallelism).
        Damaged upstream shards found before the stage reads them are recomputed first."""
        if name in self.off:
            raise ConfigError(f"the {name} stage is off in this recipe: {self.off[name]}")
        for attempt in (1, 2):
            try:
                return run_stage(
                    name,
                    self.section(name),
                    root=self.cfg.run.root,
                    storage=self.storage,
                    seed=self.cfg.run.seed,
                    force=force,
                    verify=self.verify,
                    parallelism=parallelism or self.cfg.ray.parallelism,
                    external=self.external(name),
                    resolved_config=resolved_yaml(self.cfg),
                    reads=self.reads(name),
                    keep_scratch=self.cfg.run.keep_scratch,
                )
            except DamagedShards as exc:
                if attempt == 2 or not exc.stage:
                    raise
                log.warning("%s: %s; recomputing them", name, exc)
                damaged = self.dir(exc.stage)
                for path in exc.paths:
                    damaged.remove(path)
                self.run(exc.stage, parallelism=parallelism)
        raise AssertionError("unreachable")

    def preflight(self, stages: list[str]) -> None:
        """Refuse a run of `stages` now, in well under a second, for what would otherwise end it
        only after Prefect and Ray have started (tens of seconds) or after the stages before
        it ran: another writer holding the root, what a stage's own `preflight` refuses (a
        local corpus input that matches no file), an external model folder that is missing,
        incomplete or inconsistent (`_check_model_folder`), or a stage reading one that is
        neither among `stages` nor complete on disk. The flow checks them again when it runs."""
        from pipelines.lease import RootLease

        RootLease(self.storage, self.cfg.run.root, "preflight").refuse_if_held()
        for name in stages:
            if REGISTRY[name].preflight is not None:
                REGISTRY[name].preflight(self.section(name), self.storage)
            if name in MODEL_FOLDER_STAGES:
                self._check_model_folder(name)
            for read in self.reads(name):
                directory = self.dir(read).uri
                if read not in stages and not self.storage.exists(join(directory, MANIFEST)):
                    raise UpstreamMissing(
                        f"{name}: the {read} stage has no output under {directory}: run `bertpipe run --only "
                        f"{read}` (or the whole flow) first"
                    )

    def _check_model_folder(self, name: str) -> None:
        """The stage's external model folder (pretrain.init_from, distill.teacher): present
        with config.json and safetensors weights (`identify`), and when local its config
        checked against the weights' header (bertcore/model/folder.py), so a bad folder is
        refused before the stages before it are recomputed."""
        external = self.external(name)
        folder = getattr(external, "value", None)
        local = self.storage.local_path(folder.uri) if folder is not None else None
        if local is not None:
            from bertcore.model.folder import check_model_folder

            check_model_folder(local, MODEL_FOLDER_STAGES[name])

    def why_stale(self, name: str, manifest: Manifest) -> list[str]:
        stage = REGISTRY[name]
        upstream_fps = {read: self.expected_fingerprint(read) for read in self.reads(name)}
        inputs = stage.fingerprint_inputs(self.section(name), self.cfg.run.seed, upstream_fps, self.external(name))
        return explain_stale(stage, self.section(name), manifest, inputs)

    def stale_reads(self, name: str, stages: list[str]) -> list[str]:
        """One line per stage `name` reads that this run leaves as it is (not in `stages`)
        although its output is stale, saying what changed and the command that recomputes
        both: `run --only evaluate` after the teacher's weights changed keeps evaluate's
        output, which is still the old teacher's against the old student. Empty when a read
        cannot be judged (its inputs are gone, an unreachable store): `status` says why."""
        lines = []
        for read in self.reads(name):
            try:
                manifest = self.dir(read).manifest()
                if read in stages or manifest is None or manifest.fingerprint == self.expected_fingerprint(read):
                    continue
                changed = "; ".join(self.why_stale(read, manifest)[:2])
            except (BertpipeError, OSError):
                continue
            lines.append(
                f"{name}: reads the {read} stage's output, which is stale ({changed}); "
                f"`bertpipe run --only {read},{name}` recomputes both"
            )
        return lines

    def running(self) -> dict[str, Any] | None:
        """Who is writing the root now, from its lease (`_lease.json`): {holder, host, pid,
        since (UTC)} while a live holder has it (not expired, its process not known dead),
        else None."""
        from pipelines.lease import RootLease

        record, _ = RootLease(self.storage, self.cfg.run.root, "bertpipe status")._read()
        if record is None or not record.token or record.expires_at < time.time() or record.holder_gone():
            return None
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.acquired_at))
        return {"holder": record.holder, "host": record.host, "pid": record.pid, "since": since}

    def status(self) -> list[dict[str, Any]]:
        """Per stage: complete / stale / incomplete / damaged / missing (or unknown when the
        expected fingerprint cannot be computed, e.g. inputs that no longer exist), or off
        when the recipe leaves it out (the note says why). While a live writer holds the
        root's lease, the first stage without a complete output whose directory has work in
        it is `running`, its row's `running` saying who ({holder, host, pid, since})."""
        rows = self._states()
        writer = self.running()
        if writer is not None:
            for row in rows:  # a stage that starts removes its manifest first, then writes its work
                if (
                    row["state"] != "off"
                    and not self.storage.exists(join(row["uri"], MANIFEST))
                    and self.storage.listdir(row["uri"])
                ):
                    row.update(state="running", running=writer)
                    break
        return rows

    def _states(self) -> list[dict[str, Any]]:
        rows = []
        for name in REGISTRY:
            directory = self.dir(name)
            if name in self.off:
                rows.append(
                    {
                        "stage": name,
                        "state": "off",
                        "fingerprint": None,
                        "expected_fingerprint": None,
                        "rows": None,
                        "bytes": None,
                        "seconds": None,
                        "uri": directory.uri,
                        "note": self.off[name],
                        "changed": [],
                    }
                )
                continue
            damaged = False
            try:
                manifest, note = directory.manifest(), ""
            except DamagedManifest as exc:
                manifest, note, damaged = None, str(exc), True
            try:
                expected = self.expected_fingerprint(name)
            except BertpipeError as exc:
                expected, note = None, note or str(exc)
            if expected is not None:
                state = directory.state(expected)
            else:
                state = "damaged" if damaged else "missing" if manifest is None else "unknown"
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

    def verify_outputs(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Re-hash every shard of the named stages (default: all): per stage its state and
        the shards that are missing or damaged."""
        rows = []
        for name in names or [n for n in REGISTRY if n not in self.off]:
            directory = self.dir(name).verifying()
            try:
                manifest = directory.manifest()
            except DamagedManifest as exc:
                rows.append(
                    {
                        "stage": name,
                        "state": "damaged",
                        "problems": {MANIFEST: "damaged"},
                        "note": str(exc),
                        "uri": directory.uri,
                    }
                )
                continue
            if manifest is None:
                rows.append({"stage": name, "state": "missing", "problems": {}, "note": "", "uri": directory.uri})
                continue
            problems = directory.problems(manifest)
            state = "damaged" if "damaged" in problems.values() else "incomplete" if problems else "complete"
            rows.append(
                {
                    "stage": name,
                    "state": state,
                    "problems": problems,
                    "note": "",
                    "shards": len(manifest.shards),
                    "uri": directory.uri,
                }
            )
        return rows
