"""The corpus stage's input files: what `corpus.inputs` expands to, each file with its
content identity (pipelines/content_id.py). Light to import: the stage's declaration
lists the inputs with it (`bertpipe status`). How the files are cut into work units is
units.py; how a task opens its piece of one is pieces.py.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from bertcore.errors import InputDataError
from bertcore.redact import mask_text
from bertcore.text.config import CorpusConfig, InputSpec
from bertcore.text.multistream import index_name
from pipelines.content_id import HashCache, content_id
from pipelines.storage import Storage, is_hidden


@dataclass(frozen=True)
class InputFile:
    index: int
    position: int
    """Its input's position in corpus.inputs."""
    uri: str
    spec: InputSpec
    source: str
    name: str
    """Path relative to its input (a folder or glob), the file name for a single file."""
    size: int
    content: str
    """Content identity (pipelines/content_id.py)."""


@dataclass
class Listing:
    files: list[InputFile]
    skipped: list[dict] = field(default_factory=list)
    identity: dict = field(default_factory=dict)


# -- listing --------------------------------------------------------------------------------


def _folder(storage: Storage, pattern: str) -> tuple[str, bool]:
    """The folder names are relative to, and whether the pattern is a folder itself."""
    fs, path = storage.fs(pattern)
    if any(ch in path for ch in "*?["):
        fixed = path[: min(path.index(ch) for ch in "*?[" if ch in path)]
        return fixed.rsplit("/", 1)[0] if "/" in fixed else "", False
    if fs.isdir(path):
        return path.rstrip("/"), True
    return posixpath.dirname(path), False


def _unmatched(key: str, reason: str) -> InputDataError:
    return InputDataError(f"{key}: {reason} (check the path, bucket and credentials)")


def check_local_inputs(cfg: CorpusConfig, storage: Storage) -> None:
    """The corpus stage's preflight: with `on_error: raise`, a local input that matches no
    file ends the run at once, in the words `list_inputs` would use tens of seconds later.
    Remote inputs wait for the stage (listing a bucket may be slow, and its errors need the
    retries the stage has)."""
    if cfg.on_error != "raise":
        return
    for position, spec in enumerate(cfg.inputs):
        if storage.local_path(spec.uri) is None:
            continue
        try:
            found = storage.list_files(spec.uri, include_hidden=True)
        except OSError:
            continue  # list_inputs reports it with its cause
        if not found.files and not found.skipped:
            raise _unmatched(f"corpus.inputs[{position}]", f"no file matches {spec.uri}")


def list_inputs(cfg: CorpusConfig, storage: Storage, cache: HashCache | None = None) -> Listing:
    """Expand the inputs into files with their content identity. Files a folder input
    holds under names starting with `.` or `_`, multistream indexes beside their dumps,
    and what a local folder walk does not follow or open (a symbolic link out of the
    folder or to a folder, a broken link, a FIFO, a socket, a device) are listed under
    `skipped` with the reason; so are inputs that match nothing when `on_error: skip`."""
    listing = Listing(files=[])
    cache = cache or HashCache()  # one connection for every file
    for position, spec in enumerate(cfg.inputs):
        key = f"corpus.inputs[{position}]"
        try:
            found = storage.list_files(spec.uri, include_hidden=True)
            matches = found.files
            folder, is_folder = _folder(storage, spec.uri)
        except Exception as exc:  # noqa: BLE001 - OSError, or a remote filesystem's own (an HTTP 401, a botocore error)
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            matches, folder, is_folder, reason = [], "", False, f"cannot list {spec.uri}: {text}"
        else:
            reason = f"no file matches {spec.uri}"
            # links out of the folder or to folders, FIFOs, sockets, devices: never opened
            listing.skipped += [{"file": uri, "reason": why} for uri, why in found.skipped]
            if found.skipped and not matches:
                reason = f"no regular file matches {spec.uri} ({found.skipped[0][0]}: {found.skipped[0][1]})"
        kept = []
        indexes = {index for other in matches if other.endswith(".bz2") for index in index_name(other)}
        for uri in matches:
            path = storage.fs(uri)[1]
            if is_folder and not spec.include_hidden and is_hidden(path, folder):
                listing.skipped.append(
                    {
                        "file": uri,
                        "reason": f"its name starts with . or _ (set include_hidden: true on {key} to read it)",
                    }
                )
            elif uri in indexes:
                listing.skipped.append(
                    {
                        "file": uri,
                        "reason": "the multistream index of a dump in the same input (used to split the dump)",
                    }
                )
            else:
                kept.append(uri)
        if not kept:
            if cfg.on_error == "raise":
                raise _unmatched(key, reason)
            listing.skipped.append({"file": spec.uri, "reason": reason})
            listing.identity[f"inputs[{position}]"] = "missing"
            continue
        source = spec.name or posixpath.basename(mask_text(spec.uri).rstrip("/")) or mask_text(spec.uri)
        entries = {}
        for uri in kept:
            info = storage.info(uri)
            path = storage.fs(uri)[1]
            name = path[len(folder) :].lstrip("/") if folder and path.startswith(folder) else posixpath.basename(path)
            size = int(info.get("size") or 0)
            file = InputFile(
                len(listing.files), position, uri, spec, source, name, size, content_id(storage, uri, info, cache)
            )
            listing.files.append(file)
            entries[name] = {"size": size, "content": file.content}
        listing.identity[f"inputs[{position}]"] = {"source": source, "files": entries}
    return listing


def input_location_free(config: dict) -> dict:
    """The corpus section's JSON without where its inputs are (`uri`, `index`): the
    fingerprint takes their content identity instead, so moving the data changes nothing."""
    out = dict(config)
    out["inputs"] = [{k: v for k, v in spec.items() if k not in ("uri", "index")} for spec in config.get("inputs", [])]
    return out
