"""What the corpus stage's driver holds after cleaning: plans and counts, never data per
document. Synthetic cleaned documents (tests/support/synthetic_works.py) at two sizes go through
dedup (exact and near), the split and the shard plan on a real local Ray, and the Python
memory the driver allocates (tracemalloc: its own objects and numpy arrays) must not grow
with the number of documents. benchmarks/dedup.py runs the same at a million documents and
measures the process's RSS."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from bertcore.config import StorageConfig
from bertcore.text.config import CorpusConfig
from bertcore.text.dedup import MinHashSpec
from pipelines.stage_dir import StageDir
from pipelines.stages.corpus.plan import write_corpus
from pipelines.stages.corpus.works import Works
from pipelines.storage import Storage
from synthetic_works import write_works

SPEC = MinHashSpec(num_perm=128, shingle_words=5, seed=1, threshold=0.8)
BYTES_PER_DOCUMENT = 16
"""What the driver may add per document: less than one int64 pair per document (the old
driver held about 5 KB per document with near dedup on)."""


def _through_dedup_and_plan(root: Path, n: int) -> tuple[int, object, object]:
    stage = StageDir(Storage(StorageConfig()), str(root), "corpus")
    paths, rows, planted = write_works(str(root / "corpus" / "_work"), n, files=8, spec=SPEC, processes=1)
    works = Works(tuple(paths), tuple(rows))
    corpus = CorpusConfig(inputs=[{"uri": "unused"}], near_dedup=True, shard_chars=400_000)
    tracemalloc.start()
    written = write_corpus(stage, works, corpus, SPEC, "fp", parallelism=2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, written, planted


def test_the_drivers_memory_does_not_grow_with_documents(tmp_path, ray_cluster):
    small_peak, small, _ = _through_dedup_and_plan(tmp_path / "small", 2_000)
    large_peak, large, planted = _through_dedup_and_plan(tmp_path / "large", 20_000)
    growth = (large_peak - small_peak) / (20_000 - 2_000)
    assert growth < BYTES_PER_DOCUMENT, f"the driver's peak Python memory grew by {growth:.1f} bytes per document"
    # and the work was done: every exact copy removed, most near copies, every other document kept
    assert len(large.removals.exact) == planted.exact
    assert 0.4 * planted.near <= len(large.removals.near) <= planted.near
    kept = sum(s.rows for s in large.shards)
    assert kept == 20_000 - planted.exact - len(large.removals.near)
    assert len({s.path for s in large.shards}) == len(large.shards) > len(small.shards)
