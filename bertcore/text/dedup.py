"""Duplicate detection: exact (content hash) and near (MinHash, banded LSH).

Both work on a document's sentences as the corpus stores them. Exact duplicates are equal
up to case and whitespace; near duplicates share most word shingles (estimated Jaccard
similarity at or above a threshold). Everything here is pure and works on one partition
of the corpus at a time, so the corpus stage can run it in many tasks:

- `content_hash` and `MinHashSpec.signature` are computed per document where its text is;
- `band_keys` cuts signatures into LSH bands (the b x r banding datasketch's MinHashLSH
  chooses for the threshold), one 64-bit key per band;
- `bucket_pairs` turns documents sorted by (band, key, order) into candidate pairs, linear
  in the bucket size;
- `similar` checks candidates against the estimated Jaccard of the full signatures, so a
  band collision under the threshold never removes anything;
- `losers` names the documents to remove from the similar pairs alone, by one of two rules
  (`RULES`): `first` walks the documents in order and removes one similar to an earlier
  kept document (what one in-memory LSH index walked in order does); `connected` keeps the
  first document of each connected group of similar documents (datatrove's and NeMo
  Curator's rule).

Which document is "first" is decided by an order key (the corpus stage's input order), so
the result never depends on which worker computed what.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash
from datasketch import MinHash, MinHashLSH

# datasketch >= 2.0: 32-bit affine permutations over a pre-mixed 32-bit input hash.
# Named explicitly because stored signatures are only comparable within one scheme.
_SCHEME = "affine32"


def _canonical_words(sentences: Sequence[str]) -> list[str]:
    return " ".join(sentences).casefold().split()


def content_hash(sentences: Sequence[str]) -> bytes:
    """16-byte hash (xxh3-128) of the document text with case folded and whitespace
    collapsed: documents equal up to case and whitespace hash equal."""
    return xxhash.xxh3_128_digest(" ".join(_canonical_words(sentences)).encode("utf-8"))


@functools.lru_cache(maxsize=8)
def _permutations(num_perm: int, seed: int) -> np.ndarray:
    # Drawing the permutations costs more than hashing a short document; share them.
    return MinHash(num_perm=num_perm, seed=seed, scheme=_SCHEME).permutations


def minhash_signature(sentences: Sequence[str], num_perm: int, shingle_words: int, seed: int) -> np.ndarray:
    """MinHash signature (num_perm,) uint32 of the document's word shingles.

    Shingles are runs of `shingle_words` consecutive case-folded words (a shorter
    document is one shingle); the input hash is xxh32. Equal inputs give equal
    signatures in any process; `seed` picks the permutations and must be the same for
    every document that is compared.
    """
    words = _canonical_words(sentences)
    k = shingle_words
    if len(words) <= k:
        shingles = {" ".join(words)} if words else set()
    else:
        shingles = {" ".join(words[i : i + k]) for i in range(len(words) - k + 1)}
    minhash = MinHash(
        num_perm=num_perm,
        seed=seed,
        hashfunc=xxhash.xxh32_intdigest,
        permutations=_permutations(num_perm, seed),
        scheme=_SCHEME,
    )
    if shingles:
        minhash.update_batch([s.encode("utf-8") for s in shingles])
    return np.array(minhash.hashvalues, dtype=np.uint32)


@functools.lru_cache(maxsize=16)
def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) for a Jaccard threshold: datasketch's choice (equal weight on
    false positives and false negatives), so banding matches its MinHashLSH; 0.8 of 128
    permutations gives 9 bands of 13."""
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r


@dataclass(frozen=True)
class MinHashSpec:
    """How near duplicates are found: the signature (permutations, shingle length, seed)
    and the similarity that makes two documents duplicates."""

    num_perm: int
    shingle_words: int
    seed: int
    threshold: float
    rule: str = "first"
    """Which similar documents go: `first` or `connected` (see `losers`)."""

    def signature(self, sentences: Sequence[str]) -> np.ndarray:
        return minhash_signature(sentences, self.num_perm, self.shingle_words, self.seed)

    @property
    def bands(self) -> tuple[int, int]:
        return lsh_bands(self.threshold, self.num_perm)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: one key per LSH band of each (n, num_perm) uint32 signature.
    Equal bands give equal keys; unequal bands collide with probability about 2^-64 per
    pair, and a collision only proposes a candidate that `similar` then rejects."""
    n = signatures.shape[0]
    wide = signatures.astype(np.uint64)
    keys = np.empty((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(bands):
            h = np.full(n, np.uint64(band + 1) * _MIX, dtype=np.uint64)
            for column in wide[:, band * rows : (band + 1) * rows].T:
                h = _mix64(h ^ column)
            keys[:, band] = h
    return keys


def bucket_pairs(band: np.ndarray, key: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs (a, b), a < b, from records sorted by (band, key, order): within each
    bucket (equal band and key) every member is paired with the bucket's first member and
    with its predecessor, 2n - 3 pairs for n members rather than n^2 / 2. The first member
    alone would miss a pair whose first member is a band collision; the predecessor alone
    would break a chain at one pair under the threshold. Pairs found in several bands
    come once."""
    if len(order) < 2:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (band[1:] != band[:-1]) | (key[1:] != key[:-1])
    first = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    members = np.flatnonzero(~starts)
    later = members[first[members] != members - 1]  # the predecessor is not the first
    a = np.concatenate([order[first[members]], order[later - 1]])
    b = np.concatenate([order[members], order[later]])
    return unique_pairs(a, b)


def unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs, sorted."""
    if len(a) == 0:
        return a.astype(np.int64), b.astype(np.int64)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    keep = np.ones(len(a), dtype=bool)
    keep[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[keep], b[keep]


def similar(signatures_a: np.ndarray, signatures_b: np.ndarray, threshold: float) -> np.ndarray:
    """Per row, whether the estimated Jaccard similarity (the share of equal MinHash values,
    as datasketch computes it) reaches the threshold."""
    if len(signatures_a) == 0:
        return np.zeros(0, dtype=bool)
    equal = np.count_nonzero(signatures_a == signatures_b, axis=1).astype(np.float64)
    return equal / np.float64(signatures_a.shape[1]) >= threshold


RULES = ("first", "connected")


def losers(a: np.ndarray, b: np.ndarray, rule: str = "first") -> np.ndarray:
    """The order keys to remove, sorted, given the similar pairs (a, b), a < b.

    `first`: walking in key order, a document is removed when it is similar to an earlier
    document that was kept. A chain A~B~C with A and C dissimilar keeps A and C.
    `connected`: every document of a connected group but its first. The chain keeps A only.
    Both look only at documents that are in some pair: the duplicates, not the corpus."""
    if rule not in RULES:
        raise ValueError(f"unknown near-duplicate rule {rule!r} (use {' or '.join(RULES)})")
    if len(a) == 0:
        return np.empty(0, dtype=np.int64)
    nodes = np.unique(np.concatenate([a, b]))
    ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    if rule == "connected":
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        graph = coo_matrix((np.ones(len(ia), dtype=np.int8), (ia, ib)), shape=(len(nodes), len(nodes)))
        _, labels = connected_components(graph, directed=False)
        firsts = np.full(labels.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(firsts, labels, nodes)
        return nodes[nodes != firsts[labels]]
    # first: decide nodes in order; each one's earlier neighbours are decided before it
    order = np.lexsort((ia, ib))
    earlier, later = ia[order].tolist(), ib[order].tolist()
    removed = bytearray(len(nodes))
    i = 0
    while i < len(later):
        node, kept_neighbour = later[i], False
        while i < len(later) and later[i] == node:
            kept_neighbour = kept_neighbour or not removed[earlier[i]]
            i += 1
        removed[node] = kept_neighbour
    return nodes[np.frombuffer(bytes(removed), dtype=np.uint8).astype(bool)]


def similar_pairs(keys: np.ndarray, signatures: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The similar pairs (a, b) of order keys among documents with (n, num_perm)
    `signatures`, in one process: the steps the corpus stage runs over partitions (band,
    bucket, check), composed."""
    keys = np.asarray(keys, dtype=np.int64)
    if signatures.shape[0] != len(keys):
        raise ValueError(f"{len(keys)} keys but {signatures.shape[0]} signatures")
    bands, rows = lsh_bands(threshold, signatures.shape[1])
    band = np.tile(np.arange(bands, dtype=np.uint8), len(keys))
    bucket = band_keys(signatures, bands, rows).ravel()
    key = np.repeat(keys, bands)
    order = np.lexsort((key, bucket, band))
    a, b = bucket_pairs(band[order], bucket[order], key[order])
    position = np.argsort(keys)
    ia, ib = position[np.searchsorted(keys[position], a)], position[np.searchsorted(keys[position], b)]
    ok = similar(signatures[ia], signatures[ib], threshold)
    return a[ok], b[ok]


def near_duplicates(keys: np.ndarray, signatures: np.ndarray, threshold: float, rule: str = "first") -> np.ndarray:
    """The keys to remove among documents with (n, num_perm) `signatures`, in one process."""
    return losers(*similar_pairs(keys, signatures, threshold), rule)
