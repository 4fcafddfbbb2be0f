"""Keyed random number generators.

Every random choice in bertpipe draws from a generator keyed by (seed, stage, shard or
document id, pass), so outputs do not depend on how many workers ran or in which order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import numpy as np


def keyed_seed(seed: int, *keys: object) -> int:
    """A 64-bit seed derived from the run seed and any number of keys (str/int/bytes)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(int(seed)).encode())
    for key in keys:
        h.update(b"\x1f")
        h.update(key if isinstance(key, bytes) else str(key).encode())
    return int.from_bytes(h.digest(), "little")


def keyed_random(seed: int, *keys: object) -> random.Random:
    """A `random.Random` for one (seed, keys...) combination."""
    return random.Random(keyed_seed(seed, *keys))


def keyed_numpy(seed: int, *keys: object) -> np.random.Generator:
    """A numpy Generator (PCG64) for one (seed, keys...) combination."""
    return np.random.default_rng(keyed_seed(seed, *keys))


def stable_fraction(*keys: object) -> float:
    """A uniform number in [0, 1) that depends only on the keys (no seed): used for splits
    that must stay put when the run seed changes, such as train/validation by document id."""
    return keyed_seed(0, *keys) / 2**64


def stable_fractions(prefix: tuple, last: Sequence[str]) -> np.ndarray:
    """`stable_fraction(*prefix, x)` for every string x of `last`, as one float64 array: the
    hash of the common prefix is computed once (a quarter of the per-call cost)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"0")
    for key in prefix:
        h.update(b"\x1f")
        h.update(key if isinstance(key, bytes) else str(key).encode())
    h.update(b"\x1f")
    out = np.empty(len(last), dtype=np.float64)
    for i, x in enumerate(last):
        one = h.copy()
        one.update(x.encode())
        out[i] = int.from_bytes(one.digest(), "little") / 2**64
    return out
