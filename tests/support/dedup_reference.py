"""The corpus stage's near-duplicate rule before it was partitioned (bertpipe 0.1, stage
code version 3), kept as the reference the partitioned rule is compared with: documents are
walked in input order through one in-memory MinHashLSH index; a document is a duplicate
when an earlier *kept* document shares a band and its estimated Jaccard reaches the
threshold; a duplicate is not indexed, so a chain A~B~C with A and C dissimilar keeps A
and C (the partitioned rule groups all three and keeps A)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasketch import LeanMinHash, MinHashLSH


def serial_near_duplicates(
    ids_in_order: Sequence[int], signatures: Sequence[np.ndarray], threshold: float, num_perm: int
) -> set[int]:
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    kept: dict[int, LeanMinHash] = {}
    duplicates: set[int] = set()
    for doc_id, signature in zip(ids_in_order, signatures):
        sketch = LeanMinHash(seed=0, hashvalues=signature, scheme="affine32")
        if any(sketch.jaccard(kept[other]) >= threshold for other in lsh.query(sketch)):
            duplicates.add(doc_id)
            continue
        lsh.insert(doc_id, sketch)
        kept[doc_id] = sketch
    return duplicates
