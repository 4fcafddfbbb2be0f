"""What a route is: how it reads a request into Work, and how it refuses."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bertcore.inference.validate import Job, Limits, Offer


@dataclass(frozen=True)
class Work:
    """What a request asks: the job to run (None: nothing to run) and how its answer becomes
    the response body."""

    job: Job | None
    reply: Callable[[dict], Any]


@dataclass(frozen=True)
class Route:
    """One route: `parse(data, query, offer, limits)` reads the request's JSON value (None
    for GET) and its query parameters into Work, raising RequestError; `offered(offer)`:
    whether the served model can answer it at all (else 404, and /info does not list it);
    `error(status, reason, param, code)`: the body of a refusal in the family's own shape
    (`param` and `code` as the RequestError gives them, None for most)."""

    method: str
    path: str
    parse: Callable[[Any, Mapping[str, str], Offer, Limits], Work]
    offered: Callable[[Offer], bool] = lambda offer: True
    error: Callable[..., Any] = lambda status, reason, param=None, code=None: {"error": reason}
