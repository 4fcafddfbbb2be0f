"""Synthetic cleaned documents, written straight into a corpus stage's `_work/` files, for
the tests and benchmarks of what comes after cleaning (dedup, the split, the shard plan) at
sizes the cleaning would take long to reach.

Each document is five sentences of twelve words drawn from a 20,000-word vocabulary (keyed
RNG); a share of them are exact copies (up to case) of an earlier document, and a share
near copies (one word changed: about 0.84 Jaccard similarity of 5-word shingles). Their
content hashes and MinHash signatures are the real ones, as a cleaning task computes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

WORDS = 20_000
SENTENCES, WORDS_PER_SENTENCE = 5, 12


@dataclass(frozen=True)
class Planted:
    documents: int
    exact: int
    near: int


def _texts(n: int, seed: int, exact_share: float, near_share: float) -> tuple[list[list[str]], int, int]:
    rng = np.random.default_rng(seed)
    words = rng.integers(0, WORDS, size=(n, SENTENCES * WORDS_PER_SENTENCE))
    kind = rng.random(n)
    source = (rng.random(n) * np.arange(n)).astype(np.int64)  # an earlier document
    exact = (kind < exact_share) & (np.arange(n) > 0)
    near = (kind >= exact_share) & (kind < exact_share + near_share) & (np.arange(n) > 0)
    changed = rng.integers(0, words.shape[1], size=n)
    fresh = WORDS + rng.integers(0, 10**6, size=n)
    for i in np.flatnonzero(exact | near):  # in order, so a copy of a copy copies its final words
        words[i] = words[source[i]]
        if near[i]:
            words[i, changed[i]] = fresh[i]
    docs = []
    for i in range(n):
        tokens = [f"w{t}" for t in words[i]]
        sentences = [
            " ".join(tokens[s * WORDS_PER_SENTENCE : (s + 1) * WORDS_PER_SENTENCE]) + "." for s in range(SENTENCES)
        ]
        docs.append([s.upper() for s in sentences] if exact[i] else sentences)
    return docs, int(exact.sum()), int(near.sum())


def _signatures(args) -> list[bytes]:

    docs, spec = args
    return [spec.signature(d).astype("<u4").tobytes() for d in docs]


def write_works(
    work_dir: str,
    n: int,
    files: int,
    spec,
    seed: int = 0,
    exact_share: float = 0.01,
    near_share: float = 0.01,
    processes: int | None = None,
    validation_fraction: float = 0.01,
) -> tuple[list[str], list[int], Planted]:
    """`n` documents in `files` work files under `work_dir` (as `_work/unit-NNNNN.arrow`
    names them); with `spec` (a MinHashSpec) their signatures too. Returns the relative
    paths, their row counts and what was planted."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from bertcore.rng import stable_fractions
    from bertcore.text.dedup import content_hash
    from pipelines.stages.corpus.works import WORK_SCHEMA

    docs, exact, near = _texts(n, seed, exact_share, near_share)
    if spec is None:
        signatures = [None] * n
    elif processes == 1:  # in this process: no pool to start (the tests' sizes)
        signatures = _signatures((docs, spec))
    else:
        # a process pool that fails when a worker dies (multiprocessing.Pool would wait for
        # the lost chunk forever, as it once did in a pytest-xdist worker)
        chunks = [(docs[i : i + 10_000], spec) for i in range(0, n, 10_000)]
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes or os.cpu_count(), mp_context=spawn) as pool:
            signatures = [s for part in pool.map(_signatures, chunks) for s in part]
    os.makedirs(work_dir, exist_ok=True)
    bounds = np.linspace(0, n, files + 1).astype(int)
    paths, rows = [], []
    for f in range(files):
        lo, hi = int(bounds[f]), int(bounds[f + 1])
        sentences = docs[lo:hi]
        table = pa.table(
            {
                "doc_id": [f"{i:024x}" for i in range(lo, hi)],
                "source": ["synthetic"] * (hi - lo),
                "title": [f"doc {i}" for i in range(lo, hi)],
                "sentences": sentences,
                **{name: [""] * (hi - lo) for name in ("url", "crawl_date", "content_type", "language")},
                "language_score": np.zeros(hi - lo, dtype=np.float32),
                "file": np.zeros(hi - lo, dtype=np.int64),
                "major": np.arange(lo, hi, dtype=np.int64),
                "minor": np.zeros(hi - lo, dtype=np.int64),
                "seq": np.zeros(hi - lo, dtype=np.int64),
                "chars": np.array([sum(len(s) for s in d) for d in sentences], dtype=np.int64),
                "n_sentences": np.full(hi - lo, SENTENCES, dtype=np.int64),
                "content_hash": [content_hash(d) for d in sentences],
                "signature": signatures[lo:hi],
                "validation": stable_fractions(("split",), [f"{i:024x}" for i in range(lo, hi)]) < validation_fraction,
            },
            schema=WORK_SCHEMA,
        )
        relative = f"_work/unit-{f:05d}.arrow"
        with (
            pa.OSFile(os.path.join(work_dir, os.path.basename(relative)), "wb") as sink,
            ipc.new_file(sink, WORK_SCHEMA) as writer,
        ):
            writer.write_table(table, max_chunksize=4096)
        paths.append(relative)
        rows.append(hi - lo)
    return paths, rows, Planted(n, exact, near)
