"""API keys for `bertpipe serve`: `--api-key KEY` (repeatable) or `BERTPIPE_API_KEY` (one
key, or several separated by commas). With any key set, every route but the open ones
(/health) needs `Authorization: Bearer <key>`; otherwise 401, with `WWW-Authenticate:
Bearer`. Without a key, nothing is checked.

Only the keys' SHA-256 digests are kept (and handed to Ray Serve replicas), and a
presented key's digest is compared with every one of them by `hmac.compare_digest`,
without stopping at the first match, so the time taken says nothing about the keys.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bertcore.errors import ConfigError

ENV = "BERTPIPE_API_KEY"
MIN_LENGTH = 8


@dataclass(frozen=True)
class Keys:
    """The digests of the accepted keys (none: every request is let in)."""

    digests: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, keys: Iterable[str]) -> Keys:
        keys = [k.strip() for k in keys if k.strip()]
        short = [k for k in keys if len(k) < MIN_LENGTH]
        if short:
            raise ConfigError(
                f"an API key of {len(short[0])} characters is too easy to guess: use at least {MIN_LENGTH} "
                "(e.g. `openssl rand -hex 24`)"
            )
        return cls(tuple(hashlib.sha256(k.encode("utf-8")).digest() for k in keys))

    @classmethod
    def from_options(cls, options: Sequence[str] | None) -> Keys:
        """The keys of --api-key, else of BERTPIPE_API_KEY (comma-separated)."""
        if options:
            return cls.of(options)
        return cls.of(os.environ.get(ENV, "").split(","))

    def __bool__(self) -> bool:
        return bool(self.digests)

    def allows(self, authorization: bytes | None) -> bool:
        """Whether an Authorization header value is `Bearer <one of the keys>`."""
        scheme, _, token = (authorization or b"").partition(b" ")
        presented = hashlib.sha256(token.strip()).digest()
        found = False
        for digest in self.digests:
            found |= hmac.compare_digest(digest, presented)
        return found and scheme.lower() == b"bearer"


def guarded(app: Any, keys: Keys, *, open_paths: Sequence[str], error: Callable[[str, str], Any]) -> Any:
    """`app` behind the keys (an ASGI middleware): a request to any path but `open_paths`
    without a valid key is answered 401 with `error(path, reason)` as its JSON body."""
    if not keys:
        return app

    async def guard(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in open_paths:
            return await app(scope, receive, send)
        header = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if keys.allows(header):
            return await app(scope, receive, send)
        reason = (
            "this server needs an API key: send Authorization: Bearer <key>"
            if header is None
            else "the API key is not one this server accepts"
        )
        body = orjson.dumps(error(scope["path"], reason))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return guard
