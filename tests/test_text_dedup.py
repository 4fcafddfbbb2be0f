"""Exact and near-duplicate detection."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertcore.rng import keyed_random
from bertcore.text.dedup import content_hash, minhash_signature, near_duplicates
from bertcore.text.sentences import split_sentences

DATA = Path(importlib.util.find_spec("gensim").submodule_search_locations[0]) / "test" / "test_data"
NUM_PERM, SHINGLE, SEED = 128, 5, 1234


@pytest.fixture(scope="module")
def news() -> list[list[str]]:
    lines = (DATA / "lee_background.cor").read_text(encoding="utf-8").splitlines()
    return [split_sentences(line, "en") for line in lines if line.strip()]


def signature(sentences: list[str]) -> np.ndarray:
    return minhash_signature(sentences, NUM_PERM, SHINGLE, SEED)


def edit(sentences: list[str], seed: int, n_words: int) -> list[str]:
    """A copy with n_words words replaced at random positions (keyed RNG)."""
    rng = keyed_random(seed, "edit")
    words = " ".join(sentences).split()
    for _ in range(n_words):
        words[rng.randrange(len(words))] = "CHANGED"
    return [" ".join(words)]


def test_content_hash_ignores_case_and_whitespace_only():
    a = content_hash(["The cat sat.", "It purred."])
    assert isinstance(a, bytes) and len(a) == 16
    assert content_hash(["the  CAT sat.   it purred."]) == a
    assert content_hash(["The cat sat.", "It purred!"]) != a
    assert content_hash(["The cat sat.", "It purred.", "Then it slept."]) != a


def test_signature_shape_and_determinism(news):
    sig = signature(news[0])
    assert sig.shape == (NUM_PERM,) and sig.dtype == np.uint32
    assert np.array_equal(sig, signature(list(news[0])))
    assert not np.array_equal(sig, minhash_signature(news[0], NUM_PERM, SHINGLE, SEED + 1))
    # Case and spacing do not matter, as for content_hash.
    assert np.array_equal(sig, signature([" ".join(news[0]).upper()]))


def test_signature_is_the_same_in_another_process():
    # Guards against anything depending on Python's per-process string hash seed.
    code = (
        "from bertcore.text.dedup import minhash_signature;"
        "print(minhash_signature(['The quick brown fox jumps over the lazy dog today.'], 64, 3, 7).tolist())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(hash_seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in (1, 2)
    }
    here = minhash_signature(["The quick brown fox jumps over the lazy dog today."], 64, 3, 7).tolist()
    assert outputs == {f"{here}\n"}


def test_signature_agreement_tracks_similarity(news):
    base = signature(news[0])
    near = signature(edit(news[0], seed=1, n_words=2))
    other = signature(news[1])
    assert np.mean(base == near) > 0.8
    assert np.mean(base == other) < 0.1


def test_duplicates_in_the_news_sample(news):
    # The sample itself repeats some stories: 7 verbatim, one more with small edits.
    seen: dict[bytes, int] = {}
    exact = set()
    for i, doc in enumerate(news):
        exact.add(i) if content_hash(doc) in seen else seen.setdefault(content_hash(doc), i)
    assert exact == {112, 119, 120, 156, 236, 271, 288}
    near = near_duplicates(list(range(len(news))), [signature(doc) for doc in news], 0.8, NUM_PERM)
    assert exact < near and len(near - exact) >= 1


def test_near_duplicates_finds_edited_copies_and_keeps_the_first(news):
    ids = list(range(len(news)))
    sigs = [signature(doc) for doc in news]
    already = near_duplicates(ids, sigs, 0.8, NUM_PERM)
    copies = {1000 + i: edit(news[i], seed=i, n_words=1) for i in (3, 50, 200)}
    ids += list(copies)
    sigs += [signature(doc) for doc in copies.values()]
    assert near_duplicates(ids, sigs, 0.8, NUM_PERM) == already | set(copies)
    # Reversed order: the copies come first and are kept, the originals are duplicates.
    reversed_result = near_duplicates(ids[::-1], sigs[::-1], 0.8, NUM_PERM)
    assert {3, 50, 200} <= reversed_result and not set(copies) & reversed_result


def test_near_duplicates_is_deterministic(news):
    docs = news[:60] + [edit(doc, seed=i, n_words=4) for i, doc in enumerate(news[:60])]
    ids = list(range(len(docs)))
    sigs = [signature(doc) for doc in docs]
    first = near_duplicates(ids, sigs, 0.7, NUM_PERM)
    assert first  # the edited copies are found
    assert all(near_duplicates(ids, [s.copy() for s in sigs], 0.7, NUM_PERM) == first for _ in range(3))


def test_threshold_separates_partial_overlap(news):
    doc = news[5]
    words = " ".join(doc).split()
    half = [" ".join(words[: len(words) // 2] + ["unrelated"] * 3 + " ".join(news[6]).split()[:40])]
    sigs = [signature(doc), signature(half)]
    assert near_duplicates([0, 1], sigs, 0.8, NUM_PERM) == set()
    assert near_duplicates([0, 1], sigs, 0.2, NUM_PERM) == {1}


def test_mismatched_inputs_are_rejected(news):
    with pytest.raises(ValueError, match="2 ids but 1 signatures"):
        near_duplicates([0, 1], [signature(news[0])], 0.8, NUM_PERM)
    with pytest.raises(ValueError, match="expected 128"):
        near_duplicates([0], [minhash_signature(news[0], 64, SHINGLE, SEED)], 0.8, NUM_PERM)
