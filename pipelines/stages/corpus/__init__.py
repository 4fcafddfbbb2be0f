"""The corpus stage's declaration; its work is pipelines/stages/corpus/work.py."""

from __future__ import annotations

from bertcore.text.config import CorpusConfig
from pipelines.progress import size
from pipelines.stage import External, Stage
from pipelines.stages.corpus.inputs import (
    check_local_inputs,
    input_location_free,
    list_inputs,
)
from pipelines.storage import Storage


def identify(cfg: CorpusConfig, storage: Storage) -> External:
    """The input files and what identifies their content (names relative to their input,
    sizes, content hashes or ETags; never where they are); the files are listed once."""
    listing = list_inputs(cfg, storage)
    summary = f"{len(listing.files)} input files ({size(sum(f.size for f in listing.files))})"
    return External(identity=listing.identity, value=listing, summary=summary)


# The split hashes document ids; only MinHash near-deduplication draws from the seed.
STAGE = Stage(
    "corpus",
    CorpusConfig,
    "pipelines.stages.corpus.work:run",
    code_version="5",
    identify=identify,
    seeded=lambda cfg: cfg.near_dedup,
    fingerprint_config=input_location_free,
    preflight=check_local_inputs,
    scratch=("_work", "_dedup"),  # cleaned documents with their hashes and signatures; dedup indexes and plans
    writes="cleaned, sentence-split documents: {train,validation}/part-NNNNN.arrow",
)
