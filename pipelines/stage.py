"""The stage contract, in one place.

A stage is a small declared object (`Stage`): its name, its directory under the run root,
its config section, the stages whose outputs it reads, and a `run(StageRun) -> Output`
function. The runner (pipelines/runner.py) does everything else the same way for every
stage: looks up the upstream manifests, computes the fingerprint, keeps or resets the
directory, calls `run`, and writes the manifest.

Declaration and work live apart, so that reading a recipe stays instant. A stage's
declaration (`pipelines/stages/<name>/__init__.py`: its `Stage(...)`, and the light functions it
names: `identify`, `inherit`, `check`) imports only its config section and light modules;
the registry, `bertpipe status`, `config show` and `--help` import every declaration. Its
work (`pipelines/stages/<name>/work.py`: `run`, its Ray tasks, and whatever they need: Ray, torch,
pyarrow, DeepSpeed) is named in the declaration by its dotted name, `run="pipelines.
stages.<name>.work:run"`, and imported only when the stage runs (`Stage.work`). tests/repo/test_architecture.py
fails when loading a recipe imports torch, Ray, matplotlib or another heavy package.

What a stage directory holds and how it is checked is pipelines/stage_dir.py's:

- A stage's directory is complete when, and only when, `_manifest.json` exists there; it
  is written last, next to the resolved config (`_config.yaml`).
- fingerprint = hash(stage name + code version + its config section + the fingerprints of
  the stages it reads + the run seed (seeded stages) + the content identity of the files it
  reads from outside the run root).
- Work is done in units (a shard, a Ray task's batch of shards, an evaluation job). A
  finished unit leaves `_progress/<unit>.json` with the fingerprint it was computed for,
  the shards it wrote (rows, bytes, sha256) and a small JSON result, so a stage that
  crashed, re-run, keeps the units whose shards still match and computes only the rest.
- Scratch: what a stage keeps only for itself while it runs (the folders its `Stage.scratch`
  names, and the markers of the units that wrote there) is removed once its manifest is
  written (unless run.keep_scratch), and again by a rerun that finds the stage complete, so
  a crash between the two leaves nothing behind for good. The markers of the units that
  wrote output shards stay (a few hundred bytes each): they let a rerun after a lost
  manifest or a damaged shard redo only what is missing.
- Integrity: every shard records its sha256 and a stamp (mtime or ETag) taken when it was
  published. A check re-hashes a shard whose size or stamp changed since (or every shard,
  with `verify`); a shard whose bytes differ is `damaged`, and is removed and recomputed.
  A manifest that cannot be read is damaged too: its stage counts as not done.
- Containment: every path inside a stage directory is checked by its text and, on local
  disk, where its symbolic links lead (`StageDir.path`); a shard reached through a link is
  `damaged` and is never read or hashed; removing one removes the link itself, never what
  it points to (pipelines/storage.py, bertcore/paths.py).
- What a stage directory holds is written without passwords inside URIs (bertcore/redact.py).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bertcore.errors import BertpipeError
from pipelines.stage_dir import Manifest, ShardInfo, StageDir
from pipelines.storage import Storage

if TYPE_CHECKING:
    from bertcore.train.shard_cache import ShardRef

MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RESOLVED_CONFIG = "_config.yaml"


class UpstreamMissing(BertpipeError):
    """A stage this one reads has no complete output."""


def fingerprint(stage: str, code_version: str, section: dict, inputs: dict[str, Any]) -> str:
    payload = json.dumps(
        {"stage": stage, "code_version": code_version, "config": section, "inputs": inputs},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass
class Output:
    """What a stage's `run` returns; the runner turns it into the manifest."""

    shards: list[ShardInfo]
    stats: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """Inputs left out, each {"file": ..., "reason": ...}."""
    inputs: dict[str, Any] = field(default_factory=dict)
    """Lineage beyond the upstream fingerprints (e.g. the raw files read), recorded as is."""
    report: str | None = None
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)
    """A few key figures, label -> value (a number or a short string), e.g. {"documents":
    391}: printed at the stage's end and in the run summary, in this order."""


# -- declaring a stage --------------------------------------------------------------------------


@dataclass
class External:
    """Files a stage reads from outside the run root: `identity` goes into the fingerprint
    (content identity, never a path or a modification time alone), `value` (e.g. the
    expanded list of input files) is handed to `run`, so nothing is listed twice."""

    identity: dict[str, Any]
    value: Any = None
    summary: str = ""
    """What the files are, in a few words, for the stage's start line (e.g. "2 input files, 7.6 MB")."""


@dataclass
class Upstream:
    """The complete output of a stage this one reads."""

    dir: StageDir
    manifest: Manifest

    def path(self, relative: str) -> str:
        return self.dir.path(relative)

    def ref(self, shard: ShardInfo) -> ShardRef:
        """One of its shards as a reader streams it: the URI and what the manifest recorded
        (rows, bytes, sha256, stamp; bertcore/train/shard_cache.py)."""
        from bertcore.train.shard_cache import ShardRef

        return ShardRef(
            uri=self.path(shard.path), rows=shard.rows, bytes=shard.bytes, sha256=shard.sha256, stamp=shard.stamp
        )

    @property
    def fingerprint(self) -> str:
        return self.manifest.fingerprint


@dataclass
class StageRun:
    """Everything a stage's `run` receives: its own config section, the outputs it reads,
    its directory, and the fingerprint that the units it completes are recorded under."""

    section: Any
    seed: int
    storage: Storage
    dir: StageDir
    fingerprint: str
    inputs: dict[str, Upstream]
    external: Any = None
    """The `value` of the stage's External, when it declares `identify`."""
    parallelism: int | None = None
    """Most Ray tasks in flight (None: as many as the cluster runs)."""
    force: bool = False
    """`--force`: recompute from nothing (a training stage deletes its checkpoints)."""


@dataclass(frozen=True)
class Stage:
    name: str
    """Also the name of its config section."""
    section: type
    """The pydantic model of its config section."""
    run: Callable[[StageRun], Output] | str
    """What the stage does, `run(StageRun) -> Output`: the function itself, or its dotted name
    "pipelines.stages.<name>.work:run", imported only when the stage runs (how every built-in stage
    declares it: its module imports Ray, torch or pyarrow, which reading a recipe must not)."""
    reads: tuple[str, ...] = ()
    """Stages whose outputs it reads (those the recipe runs, see `off`); their fingerprints are part of its own."""
    off: Callable[[Mapping[str, Any]], str | None] | None = None
    """Whether a recipe leaves the stage out: ({stage: section} of the recipe) -> why, in a few words, or None when it
    runs (default: it always runs). The stages that read it then go without it; `bertpipe status` shows it as off."""
    writes: str = ""
    """What the directory holds, in a few words (for the docs' stage table)."""
    code_version: str = "1"
    directory: str = ""
    """Directory under run.root (default: the name)."""
    identify: Callable[[Any, Storage], External | None] | None = None
    """Content identity of the files it reads from outside the run root (None: none with these settings)."""
    inherit: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None
    """Defaults its section takes from other sections when the recipe loads: (own section, {stage: section} of every
    stage) -> {field: value}; raises ValueError naming the key."""
    check: Callable[[Any, dict[str, Any]], None] | None = None
    """Cross-section check run when the config loads: (own section, {read stage: section}); raises ValueError naming the
    key."""
    seeded: bool | Callable[[Any], bool] = True
    """Whether run.seed is part of its fingerprint (or a function of its section that says so)."""
    resumable: bool = True
    """Whether an unfinished attempt's unit markers are kept for the next one."""
    scratch: tuple[str, ...] = ()
    """Folders of its directory that hold work only an unfinished run of it reads (cleaned documents, dedup indexes,
    token shards): removed once its manifest is written, unless run.keep_scratch."""
    verify_inputs: bool = False
    """Check every upstream shard's stamp before running (a stage that spends hours on its inputs; its readers hash
    the bytes they read; `--verify` re-hashes them all first)."""
    preflight: Callable[[Any, Storage], None] | None = None
    """A check of its section that takes well under a second, run before Prefect and Ray
    start (`Pipeline.preflight`): (own section, storage) -> None; raises a BertpipeError
    naming the key. The stage's run checks the same again."""
    fingerprint_config: Callable[[dict], dict] | None = None
    """The part of its section's JSON that decides its output (default: all of it); the
    corpus leaves out where its inputs are, whose content `identify` stands for."""

    def __post_init__(self) -> None:
        if not self.directory:
            object.__setattr__(self, "directory", self.name)

    def work(self) -> Callable[[StageRun], Output]:
        """The `run` function; when it was declared by name, its module is imported now."""
        if callable(self.run):
            return self.run
        module, _, function = self.run.partition(":")
        return getattr(importlib.import_module(module), function)

    def work_file(self) -> str:
        """The source file of `run`, found without importing it (for the docs' stage table)."""
        if callable(self.run):
            return inspect.getsourcefile(self.run) or self.run.__module__
        spec = importlib.util.find_spec(self.run.partition(":")[0])
        return spec.origin if spec and spec.origin else self.run

    def config_identity(self, config: dict) -> dict:
        """What of a section's JSON (as dumped, or as a manifest recorded it) goes into the
        fingerprint: not the settings added later that sit at their default (Section.ADDED_LATER)."""
        if hasattr(self.section, "fingerprint_json"):
            config = self.section.fingerprint_json(config)
        return self.fingerprint_config(config) if self.fingerprint_config is not None else config

    def fingerprint_inputs(
        self, section: Any, seed: int, upstream: dict[str, str], external: External | None
    ) -> dict[str, Any]:
        """Everything but the section that goes into the fingerprint (recorded in the manifest)."""
        inputs: dict[str, Any] = dict(upstream)
        if self.seeded(section) if callable(self.seeded) else self.seeded:
            inputs["seed"] = seed
        if external is not None:
            inputs["external"] = external.identity
        return inputs

    def fingerprint(self, section: Any, seed: int, upstream: dict[str, str], external: External | None) -> str:
        config = self.config_identity(section.model_dump(mode="json"))
        return fingerprint(
            self.name, self.code_version, config, self.fingerprint_inputs(section, seed, upstream, external)
        )
