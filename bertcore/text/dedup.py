"""Duplicate detection: exact (content hash) and near (MinHash LSH, datasketch).

Both work on a document's sentences as the corpus stores them. Exact duplicates are equal
up to case and whitespace; near duplicates share most word shingles (estimated Jaccard
similarity at or above a threshold). The first document in a given order is kept, so the
result depends only on that order, never on which worker computed which signature.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import xxhash
from datasketch import LeanMinHash, MinHash, MinHashLSH

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


def near_duplicates(
    ids_in_order: Sequence[int], signatures: Sequence[np.ndarray], threshold: float, num_perm: int
) -> set[int]:
    """The ids of documents that nearly duplicate an earlier kept document.

    Walks the documents in the given order (signatures[i] belongs to ids_in_order[i]).
    MinHashLSH proposes earlier kept documents that may be similar; a candidate counts
    only if the signatures' estimated Jaccard similarity is at least `threshold`, so LSH
    band collisions of dissimilar documents never remove anything. A document that is a
    near duplicate is not indexed itself: a chain A~B~C with A and C dissimilar keeps A
    and C. Deterministic for a given order.
    """
    if len(ids_in_order) != len(signatures):
        raise ValueError(f"{len(ids_in_order)} ids but {len(signatures)} signatures")
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    kept: dict[int, LeanMinHash] = {}
    duplicates: set[int] = set()
    for doc_id, signature in zip(ids_in_order, signatures):
        if len(signature) != num_perm:
            raise ValueError(f"signature of document {doc_id} has {len(signature)} values, expected {num_perm}")
        # The seed only labels the sketch (jaccard() checks that seeds agree); all
        # signatures here come from one minhash_signature configuration.
        sketch = LeanMinHash(seed=0, hashvalues=signature, scheme=_SCHEME)
        if any(sketch.jaccard(kept[other]) >= threshold for other in lsh.query(sketch)):
            duplicates.add(doc_id)
            continue
        lsh.insert(doc_id, sketch)
        kept[doc_id] = sketch
    return duplicates
