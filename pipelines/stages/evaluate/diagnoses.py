"""The evaluate report's links to the diagnoses of its tasks. `bertpipe diagnose` writes a
task's diagnosis beside the stage's directory, `<run.root>/diagnose/<task>/` (a folder with
its own manifest, stage "diagnose"); the report links each one that exists:

- when the stage renders its report, to the diagnoses already there;
- when `bertpipe diagnose` finishes after the stage, by rewriting the report's diagnoses
  section and recording the report's new size and sha256 in the stage's manifest (its
  fingerprint and every other shard unchanged), under the run root's lease.

A report whose bytes no longer match its manifest is left alone (the stage recomputes it).
"""

from __future__ import annotations

import posixpath

from pipelines.stage_dir import MANIFEST, StageDir
from pipelines.storage import Storage, join

DIAGNOSE_DIR = "diagnose"
"""The folder of run.root that holds the diagnoses, one folder per task."""
REPORT = "diagnosis.md"


def default_out(root: str, task: str) -> str:
    """Where `bertpipe diagnose --task TASK` writes by default."""
    return join(root, DIAGNOSE_DIR, task)


def found(storage: Storage, root: str, tasks: list[str], directory: str = "eval") -> dict[str, str]:
    """{task: its diagnosis.md relative to the stage's directory} for each task that has one."""
    out = {}
    for task in tasks:
        manifest = join(default_out(root, task), MANIFEST)
        if storage.exists(manifest) and storage.exists(join(default_out(root, task), REPORT)):
            depth = "/".join(".." for _ in directory.split("/"))
            out[task] = posixpath.join(depth, DIAGNOSE_DIR, task, REPORT)
    return out


def link(storage: Storage, root: str, directory: str = "eval") -> bool:
    """Give a complete evaluate stage's report the links to every diagnosis of its tasks;
    False when there is no such report, it is damaged, or it already links them all."""
    from bertcore.eval.report import with_diagnoses

    stage = StageDir(storage, root, directory)
    manifest = stage.manifest()
    if manifest is None or manifest.report is None:
        return False
    record = next((s for s in manifest.shards if s.path == manifest.report), None)
    if record is None or stage.check(record) != "ok":
        return False
    tasks = [t.get("name") for t in (manifest.config or {}).get("tasks", []) if isinstance(t, dict)]
    text = storage.read_text(stage.path(record.path))
    updated = with_diagnoses(text, found(storage, root, [t for t in tasks if t], directory))
    if updated == text:
        return False

    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)

    written = stage.publish(record.path, write, rows=record.rows)
    manifest.shards = [written if s.path == record.path else s for s in manifest.shards]
    storage.write_json(stage.path(MANIFEST), manifest.to_json())
    return True
