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
from bertcore.text.dedup import (
    band_keys,
    bucket_pairs,
    content_hash,
    losers,
    lsh_bands,
    minhash_signature,
    near_duplicates,
    similar,
    similar_pairs,
)
from bertcore.text.sentences import split_sentences
from dedup_reference import serial_near_duplicates
from planted import planted

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


def near(keys, sigs, threshold: float) -> set[int]:
    return set(near_duplicates(np.asarray(keys), np.stack(sigs), threshold).tolist())


def test_duplicates_in_the_news_sample(news):
    # The sample itself repeats some stories: 7 verbatim, one more with small edits.
    seen: dict[bytes, int] = {}
    exact = set()
    for i, doc in enumerate(news):
        exact.add(i) if content_hash(doc) in seen else seen.setdefault(content_hash(doc), i)
    assert exact == {112, 119, 120, 156, 236, 271, 288}
    found = near(range(len(news)), [signature(doc) for doc in news], 0.8)
    assert exact < found and len(found - exact) >= 1


def test_near_duplicates_finds_edited_copies_and_keeps_the_first(news):
    sigs = [signature(doc) for doc in news]
    already = near(range(len(news)), sigs, 0.8)
    copies = [edit(news[i], seed=i, n_words=1) for i in (3, 50, 200)]
    keys = list(range(len(news) + len(copies)))
    assert near(keys, sigs + [signature(doc) for doc in copies], 0.8) == already | set(keys[len(news) :])
    # The copies first (smaller order keys): they are kept, the originals are duplicates.
    first = near([1000 + k for k in range(len(news))] + [0, 1, 2], sigs + [signature(doc) for doc in copies], 0.8)
    assert {1003, 1050, 1200} <= first and not {0, 1, 2} & first


def test_near_duplicates_is_deterministic(news):
    docs = news[:60] + [edit(doc, seed=i, n_words=4) for i, doc in enumerate(news[:60])]
    sigs = [signature(doc) for doc in docs]
    first = near(range(len(docs)), sigs, 0.7)
    assert first  # the edited copies are found
    assert all(near(range(len(docs)), [s.copy() for s in sigs], 0.7) == first for _ in range(3))


def test_threshold_separates_partial_overlap(news):
    doc = news[5]
    words = " ".join(doc).split()
    half = [" ".join(words[: len(words) // 2] + ["unrelated"] * 3 + " ".join(news[6]).split()[:40])]
    sigs = [signature(doc), signature(half)]
    assert near([0, 1], sigs, 0.8) == set()
    assert near([0, 1], sigs, 0.2) == {1}


def test_mismatched_inputs_are_rejected(news):
    with pytest.raises(ValueError, match="2 keys but 1 signatures"):
        near_duplicates(np.array([0, 1]), np.stack([signature(news[0])]), 0.8)


def test_banding_is_datasketchs():
    assert lsh_bands(0.8, 128) == (9, 13) and lsh_bands(0.5, 128) == (25, 5)


def test_band_keys_are_equal_exactly_when_bands_are():
    rng = np.random.default_rng(0)
    sigs = rng.integers(0, 2**32, size=(200, 128), dtype=np.uint64).astype(np.uint32)
    sigs[1] = sigs[0]
    sigs[2, :13] = sigs[0, :13]  # shares band 0 only
    keys = band_keys(sigs, 9, 13)
    assert (keys[1] == keys[0]).all()
    assert keys[2, 0] == keys[0, 0] and not (keys[2, 1:] == keys[0, 1:]).any()
    assert len(np.unique(keys[3:], axis=0)) == 197 and len(np.unique(keys[3:].ravel())) == 197 * 9  # bands salted


def test_a_bucket_of_n_gives_linear_pairs_that_reach_its_first_member():
    band = np.zeros(6, dtype=np.uint8)
    key = np.array([7, 7, 7, 7, 7, 9], dtype=np.uint64)  # one bucket of 5, one of 1
    order = np.array([3, 8, 10, 11, 20, 4])
    a, b = bucket_pairs(band, key, order)
    pairs = set(zip(a.tolist(), b.tolist()))
    assert pairs == {(3, 8), (3, 10), (3, 11), (3, 20), (8, 10), (10, 11), (11, 20)}  # 2n - 3
    assert all(x < y for x, y in pairs) and not {4} & {v for p in pairs for v in p}


def test_the_two_rules_on_a_chain():
    a = np.array([1, 2, 10, 30, 30])
    b = np.array([2, 5, 11, 31, 32])
    # first: 2 goes (similar to kept 1); 5 is similar only to 2, which went: kept
    assert losers(a, b, "first").tolist() == [2, 11, 31, 32]
    # connected: the group {1, 2, 5} keeps 1 only
    assert losers(a, b, "connected").tolist() == [2, 5, 11, 31, 32]
    empty = np.array([], dtype=np.int64)
    assert losers(empty, empty, "first").tolist() == losers(empty, empty, "connected").tolist() == []
    with pytest.raises(ValueError, match="unknown near-duplicate rule 'cluster'"):
        losers(a, b, "cluster")


def test_similar_is_datasketchs_estimate(news):
    from datasketch import LeanMinHash

    x, y = signature(news[0]), signature(edit(news[0], seed=3, n_words=6))
    estimate = LeanMinHash(seed=0, hashvalues=x, scheme="affine32").jaccard(
        LeanMinHash(seed=0, hashvalues=y, scheme="affine32")
    )
    assert similar(x[None], y[None], estimate).tolist() == [True]
    assert similar(x[None], y[None], np.nextafter(estimate, 1)).tolist() == [False]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planted_near_duplicates_agree_with_the_serial_index(seed):
    """On news stories with two edited copies each (Jaccard 0.45 to 1): the `first` rule
    agrees with the serial in-memory index of bertpipe 0.1 on at least 99% of removals, and
    every document the `connected` rule removes beyond it is joined to its group's first
    document only through a chain: none of its similar documents that come before it was
    kept by the serial index (it is similar to a removed one, or to a later one)."""
    docs = planted(seed, copies=2)
    sigs = np.stack([minhash_signature([text], NUM_PERM, SHINGLE, SEED) for _, text in docs])
    seen, keys = set(), []
    for i, (_, text) in enumerate(docs):  # exact duplicates first, as the stage does
        if content_hash([text]) not in seen:
            seen.add(content_hash([text]))
            keys.append(i)
    keys = np.array(keys)
    serial = serial_near_duplicates(keys.tolist(), list(sigs[keys]), 0.8, NUM_PERM)
    a, b = similar_pairs(keys, sigs[keys], 0.8)
    first = set(losers(a, b, "first").tolist())
    assert len(first & serial) / len(first | serial) >= 0.99
    connected = set(losers(a, b, "connected").tolist())
    assert serial - connected <= serial - first  # nothing new is missed
    for x in connected - serial:
        earlier = set(a[b == x].tolist())
        assert earlier <= serial, f"document {x} is similar to {earlier - serial}, which the serial index kept"
