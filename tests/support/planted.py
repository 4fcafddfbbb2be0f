"""Planted near duplicates: real news stories (gensim's lee_background.cor) and edited
copies of them at several similarity levels, in a keyed order, for the dedup tests and
benchmarks/dedup.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bertcore.rng import keyed_random

NEWS = (
    Path(importlib.util.find_spec("gensim").submodule_search_locations[0]) / "test" / "test_data" / "lee_background.cor"
)
EDIT_SHARES = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08)
"""Shares of words replaced in a copy: 0 (an exact copy up to case), then Jaccard of 5-word
shingles from about 0.95 down to about 0.45, around the 0.8 threshold."""


def news() -> list[str]:
    return [line.strip() for line in NEWS.read_text(encoding="utf-8").splitlines() if line.strip()]


def edited(text: str, share: float, seed: int, key: object) -> str:
    """A copy with `share` of its words replaced by words no story has (keyed RNG)."""
    rng = keyed_random(seed, "planted-edit", key)
    words = text.split()
    for i in rng.sample(range(len(words)), round(share * len(words))):
        words[i] = f"zq{rng.randrange(10**6)}"
    return " ".join(words) if share else text.upper()


def planted(seed: int = 0, copies: int = 2, originals: list[str] | None = None) -> list[tuple[str, str]]:
    """(title, text) of every story and `copies` edited copies of each (edit shares drawn
    from EDIT_SHARES), in a keyed order where most copies follow their story and some
    come before it."""
    stories = news() if originals is None else originals
    rng = keyed_random(seed, "planted")
    docs = [(f"story-{i}", text, float(i)) for i, text in enumerate(stories)]
    for i, text in enumerate(stories):
        for c in range(copies):
            share = rng.choice(EDIT_SHARES)
            position = i + rng.uniform(-3, 40)  # mostly after the story, sometimes before
            docs.append((f"story-{i}-copy-{c}-{share}", edited(text, share, seed, (i, c)), position))
    docs.sort(key=lambda d: d[2])
    return [(title, text) for title, text, _ in docs]
