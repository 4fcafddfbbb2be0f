"""What ended a run, in one line, and whether trying again can help.

Prefect retries a stage only for transient causes: a Ray node or worker lost, a network
error talking to the object store. Disk full, a read-only file system, missing
permissions, a bucket that does not exist or a damaged manifest fail the same way every
time, so they end the run at once with one line naming the stage, the file or URI and
the cause; the full traceback goes to the Prefect log and to a local log file.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
import traceback

import ray.exceptions

from bertcore.redact import mask_text

TRANSIENT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EPIPE,
}
PERMANENT_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "not found",
}
RAY_TRANSIENT = (
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.OwnerDiedError,
    ray.exceptions.RaySystemError,
    ray.exceptions.ActorDiedError,
    ray.exceptions.ActorUnavailableError,
    ray.exceptions.GetTimeoutError,
)
CREDENTIALS_ERROR_NAMES = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
"""botocore's errors for credentials it could not find or read: permanent (no retry), one line."""
NETWORK_ERROR_NAMES = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ClientConnectorError",
    "ClientConnectionError",
    "ServerDisconnectedError",
    "ClientOSError",
}


def root_cause(exc: BaseException) -> BaseException:
    """The error inside Ray's and Python's wrappers (RayTaskError.cause, Ray Train's wrapper
    of a worker's exception, __cause__)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
        inner = inner or getattr(exc, "_base_exc", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def is_transient(exc: BaseException) -> bool:
    """Whether trying the stage again can succeed: lost Ray workers or nodes, network errors."""
    for candidate in (exc, root_cause(exc)):
        if isinstance(candidate, RAY_TRANSIENT) or type(candidate).__name__ in NETWORK_ERROR_NAMES:
            return True
        if isinstance(candidate, (ConnectionError, TimeoutError)):
            return True
        if isinstance(candidate, OSError) and candidate.errno in TRANSIENT_ERRNOS:
            return True
    return False


def describe(stage: str, exc: BaseException, root: str) -> str:
    """One line: the stage, what happened, where, and what to do (passwords inside URIs masked)."""
    return mask_text(_describe(stage, exc, root))


def _describe(stage: str, exc: BaseException, root: str) -> str:
    cause = root_cause(exc)
    text = " ".join(str(cause).split()) or type(cause).__name__
    where = getattr(cause, "filename", None)
    if isinstance(cause, OSError) and cause.errno in PERMANENT_ERRNOS:
        what = PERMANENT_ERRNOS[cause.errno]
        target = f" at {where}" if where else ""
        hint = {
            errno.ENOSPC: f"free space for run.root {root} (or point run.root elsewhere) and run again",
            errno.EDQUOT: f"free space for run.root {root} (or point run.root elsewhere) and run again",
            errno.EROFS: f"run.root {root} must be writable",
            errno.EACCES: f"run.root {root} and the inputs must be readable and writable by this user",
            errno.EPERM: f"run.root {root} and the inputs must be readable and writable by this user",
            errno.ENOENT: "check the path, bucket and credentials",
        }[cause.errno]
        return f"{stage}: {what}{target} ({text}); {hint}"
    if type(cause).__name__ in CREDENTIALS_ERROR_NAMES:
        return (
            f"{stage}: no object-store credentials ({text}); give this process credentials for the s3:// URIs of the "
            f"recipe (run.root {root}, and any s3:// input, distill.teacher or init_from): AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role, or storage.key/storage.secret"
        )
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return f"{stage}: the bucket does not exist ({text}); create it, or fix run.root ({root}) or corpus.inputs"
    failures = getattr(cause, "worker_failures", None)
    if failures:  # Ray Train: one clause per failed rank, each its own error's first line
        parts = []
        for rank in sorted(failures):
            error = root_cause(failures[rank])
            first = next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)
            parts.append(f"rank {rank}: {type(error).__name__}: {clip(first, 160)}")
        return f"{stage}: the training workers failed ({'; '.join(parts)})"
    return f"{stage}: {type(cause).__name__}: {clip(text, 300)}"


def clip(text: str, width: int) -> str:
    """`text` cut at a word boundary to at most `width` characters, with '…' when cut."""
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0]
    return (cut or text[: width - 1]) + "…"


LOGS = "_logs"
"""Folder of a stage directory (or of run.root, for a failure outside any stage) that holds
the full tracebacks of its failures."""


def write_traceback(stage: str, exc: BaseException, root: str | None = None, storage=None) -> str:
    """Save the full traceback (passwords inside URIs masked) under run.root, in
    `<root>/<stage>/_logs/` (`<root>/_logs/` for the run itself), and return where; when the
    root cannot take it (a full disk, a read-only root, an unreachable store), in this
    machine's temporary folder."""
    text = mask_text("".join(traceback.format_exception(exc)))
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{stage}-traceback.log"
    if root is not None and storage is not None:
        from pipelines.storage import join

        uri = join(root, *([] if stage == "run" else [_directory(stage)]), LOGS, name)
        try:
            storage.write_bytes(uri, text.encode("utf-8"))
            return mask_text(uri)
        except Exception:  # noqa: BLE001 - the root is what failed: keep the traceback on this machine
            pass
    handle, path = tempfile.mkstemp(prefix=f"bertpipe-{stage}-", suffix="-traceback.log")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    return path


def _directory(stage: str) -> str:
    from pipelines.registry import REGISTRY

    return REGISTRY[stage].directory if stage in REGISTRY else stage
