"""Where `bertpipe export` may write, decided before any work (no torch, no Ray).

An export writes only into

- a folder that does not exist yet (or is empty), or
- a folder whose own `_manifest.json` says an earlier export made it (`stage` is one of
  `EXPORT_STAGES`); the re-export then replaces only the files that manifest lists,

and never into a stage directory of any run root, nor into a run root itself: not this
run's, not another's (`--out R/../other-root/corpus`), not a folder below one. A run root or
stage directory is recognised by what a run leaves there: `_manifest.json` (not an
export's), `_lease.json`, `_config.yaml` without an export manifest, `_progress/`, or a
child named like a stage directory that holds a manifest or progress markers. Every
folder from the target up to the file system's root is looked at (locally after symbolic
links are followed), so a path that only reaches a stage directory through `..` or a link
is refused as well. An `--out` that names an existing file is refused.

Each refusal is one ConfigError line that names the path, why, and what to type instead.
"""

from __future__ import annotations

import os
import posixpath

from bertcore.errors import ConfigError
from bertcore.section import safe_name
from pipelines.lease import LEASE
from pipelines.registry import REGISTRY
from pipelines.stage_dir import MANIFEST, PROGRESS, RESOLVED_CONFIG, Manifest
from pipelines.storage import Storage, join

EXPORT_STAGES = ("export-onnx",)
"""The `stage` of the manifests exports write: a folder holding one is an export's own."""
COMMAND_STAGES = (*EXPORT_STAGES, "diagnose")
"""The `stage` of the manifests that commands write outside the stage directories (exports,
`bertpipe diagnose`): a folder holding one is no run root or stage directory. The same rules
decide where `bertpipe diagnose` may write (`check_target(owner=("diagnose",))`)."""


def resolve(out: str) -> str:
    """A local `--out` as an absolute path with symbolic links followed; a URI without its
    trailing slash."""
    if "://" in out and not out.startswith("file://"):
        return out.rstrip("/")
    return os.path.realpath(os.path.expanduser(out.removeprefix("file://")))


def _parent(uri: str) -> str | None:
    if "://" in uri:
        protocol, rest = uri.split("://", 1)
        up = posixpath.dirname(rest.rstrip("/"))
        return f"{protocol}://{up}" if up and up != rest.rstrip("/") else None
    up = os.path.dirname(uri)
    return up if up != uri else None


def _manifest_stage(storage: Storage, folder: str) -> str | None:
    """The `stage` its _manifest.json names ('' when the file is there but not readable as a
    manifest), None without one."""
    uri = join(folder, MANIFEST)
    if not storage.exists(uri):
        return None
    try:
        data = storage.read_json(uri)
    except (OSError, ValueError, UnicodeDecodeError):
        return ""
    stage = str(data.get("stage", "")) if isinstance(data, dict) else ""
    if stage in COMMAND_STAGES:  # a re-export reads what it lists: a forged or partial one is nobody's
        try:
            Manifest.from_json(data)
        except (ValueError, TypeError, KeyError, AttributeError):
            return ""
    return stage


def _run_marker(storage: Storage, folder: str) -> str | None:
    """What makes `folder` a run root or a stage directory (a file name, for the message),
    or None when it is neither. An export's own folder is neither."""
    stage = _manifest_stage(storage, folder)
    if stage in COMMAND_STAGES:
        return None
    if stage is not None:
        return (
            f"its {MANIFEST} (the {stage} stage's)" if stage else f"its {MANIFEST}, which no run or export wrote whole"
        )
    for name in (LEASE, RESOLVED_CONFIG, PROGRESS):
        if storage.exists(join(folder, name)):
            return f"its {name}"
    for directory in sorted(
        {stage.directory for stage in REGISTRY.values()}
    ):  # onnx/pretrain/ is an export's, not a stage's
        if _manifest_stage(storage, join(folder, directory)) not in (None, *COMMAND_STAGES):
            return f"{directory}/{MANIFEST}, a stage's output"
        if storage.exists(join(folder, directory, PROGRESS)):
            return f"{directory}/{PROGRESS}, a stage's work"
    return None


def _is_file(storage: Storage, uri: str) -> bool:
    local = storage.local_path(uri)
    if local is not None:
        return os.path.lexists(local) and not os.path.isdir(local)
    fs, path = storage.fs(uri)
    return fs.isfile(path)


def check_target(
    storage: Storage,
    root: str,
    out: str,
    *,
    twins: tuple[str, ...] = (),
    default: str | None = None,
    owner: tuple[str, ...] = EXPORT_STAGES,
    command: str = "export",
) -> str:
    """`out` resolved, if an export of the run root `root` may write there (see the module
    docstring); else one ConfigError line. Inside `root` itself the target must sit in a
    folder of plain names that is not a stage directory (the default `onnx/<stage>` is one).
    `twins`: suffixes of sibling folders the export writes too (the hf export's `-mlm`);
    `default`: the path to suggest instead; `owner`: the manifest stages of the folders this
    command may write into again; `command`: its name, in the messages."""
    target, base = resolve(out), resolve(root)
    instead = f"e.g. --out {default}" if default else "e.g. a new folder beside the run root"
    for folder in (target, *(target + suffix for suffix in twins)):
        _check_one(storage, base, out, folder, instead, owner, command)
    return target


def _check_one(
    storage: Storage, root: str, out: str, folder: str, instead: str, owner: tuple[str, ...], command: str
) -> None:
    named = f"--out {out}" + (f" ({folder})" if folder != out.rstrip("/") else "")
    if _is_file(storage, folder):
        raise ConfigError(f"{named} is an existing file; {command} writes a folder: name a new folder ({instead})")
    top = None
    if folder == root or folder.startswith(root.rstrip("/") + "/"):
        parts = folder[len(root.rstrip("/")) + 1 :].split("/") if folder != root else []
        stages = {stage.directory for stage in REGISTRY.values()}
        if not parts or parts[0] in stages:
            what = f"the {parts[0]} stage's directory" if parts else "the run root itself"
            raise ConfigError(
                f"{named} is {'inside ' if len(parts) > 1 else ''}{what} of run.root {root}; {command} never "
                f"writes there: name a new folder ({instead})"
            )
        try:
            for part in parts:
                safe_name(part)
        except ValueError as exc:
            raise ConfigError(f"{named}: {exc}; name a new folder ({instead})") from None
        top = root  # this run's root is known; what lies above it is not export's business
    walk: str | None = folder
    while walk is not None and walk != top:
        marker = _run_marker(storage, walk)
        if marker is not None:
            where = "is" if walk == folder else f"is inside {walk}, which is"
            raise ConfigError(
                f"{named} {where} a run root or stage directory ({marker}); {command} never writes there: name "
                f"a new folder ({instead})"
            )
        walk = _parent(walk)
    own = _manifest_stage(storage, folder) in owner
    if not own and storage.exists(folder) and storage.listdir(folder):
        raise ConfigError(
            f"{named} already holds files that no {command} made (no {command} {MANIFEST} there); {command} writes "
            f"only into a new folder or one an earlier {command} made: name a new folder ({instead})"
        )
