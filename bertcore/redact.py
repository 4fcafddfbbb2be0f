"""Credentials inside URIs never reach disk: the user information of a URI
(`scheme://user:password@host`, `scheme://token@host`) is masked as `user:****@` or
`****@` wherever a value is written out.

One function does it for every writer: the JSON form of every config section (so
`_config.yaml`, manifests, fingerprints and Prefect parameters hold the masked form, while
the running process keeps the real value), log records, failure messages and artifacts.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "****"

_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)"  # http://, s3://, postgresql+psycopg://
    r"(?P<user>[^\s:/@]*)"  # a user name, or a token used as one
    r"(?::(?P<password>[^\s\"'<>]*))?"  # up to the last '@' of the word: a password may hold '@' or '/'
    r"@"
)


def _replace(match: re.Match) -> str:
    if match.group("password") is not None:
        return f"{match.group('scheme')}{match.group('user')}:{MASK}@"
    return f"{match.group('scheme')}{MASK}@"


def mask_text(text: str) -> str:
    """`text` with the user information of every URI in it masked."""
    return _USERINFO.sub(_replace, text) if "@" in text else text


def masked(value: Any) -> Any:
    """`value` (a string, or lists, tuples and dicts of them, keys included) with URI user
    information masked."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {mask_text(k) if isinstance(k, str) else k: masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(masked(v) for v in value)
    return value


def has_userinfo(text: str) -> bool:
    """Whether `text` holds a URI with user information (what `mask_text` would change)."""
    return mask_text(text) != text


def userinfo_keys(value: Any, key: str = "") -> list[str]:
    """The dotted keys of `value` (a config's Python-mode dump) whose string holds a URI
    with user information."""
    if isinstance(value, str):
        return [key or "(value)"] if has_userinfo(value) else []
    if isinstance(value, dict):
        return [k for name, v in value.items() for k in userinfo_keys(v, f"{key}.{name}" if key else str(name))]
    if isinstance(value, (list, tuple)):
        return [k for i, v in enumerate(value) for k in userinfo_keys(v, f"{key}[{i}]")]
    return []


def _masked_arg(value: Any) -> Any:
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, (int, float, type(None))):
        return value
    text = str(value)  # an exception, a path, a dict: shown by its text, masked if needed
    return mask_text(text) if has_userinfo(text) else value


def _masked_args(args: Any) -> Any:
    if isinstance(args, dict):
        return {k: _masked_arg(v) for k, v in args.items()}
    if isinstance(args, tuple):
        return tuple(_masked_arg(v) for v in args)
    return args


def mask_log_records() -> None:
    """Mask URI user information in every log record made from now on in this process, at
    its creation, so every handler (the console, a file, Prefect's API log) gets the masked
    message: its format string, its string arguments, and its traceback text. Idempotent."""
    import logging
    import traceback

    factory = logging.getLogRecordFactory()
    if getattr(factory, "_bertpipe_masking", False):
        return

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        record.msg = _masked_arg(record.msg)
        record.args = _masked_args(record.args)
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = mask_text("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record

    make._bertpipe_masking = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make)
