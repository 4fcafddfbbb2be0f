"""The shard cache a training worker reads through (bertcore/train/shard_cache.py), with the
streaming loader on top: one download per machine however many ranks read, bytes checked
where they are read, a bounded folder that follows the window and goes when the run ends.

The "store" here is a folder that the cache must copy from, as from an object store (its
`local_path` is None); tests/flows/test_s3_end_to_end.py does the same against a real S3
server (moto) through a whole pretraining run.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
from collections import Counter
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

from bertcore.examples.layout import records_to_table
from bertcore.train.loader import ExamplesLoader
from bertcore.train.shard_cache import CacheSpec, DamagedShard, ShardRef
from test_data import BINS, news, rows, write_shards  # noqa: F401 - news: a fixture of test_data


class FolderStore:
    """A folder read as a remote store: every open is logged (one line per open, appended,
    so several processes can share the log)."""

    def __init__(self, folder: Path, log: Path):
        self.folder, self.log = folder, log

    def local_path(self, uri: str) -> str | None:
        return None

    def open(self, uri: str, mode: str = "rb"):
        with open(self.log, "a") as handle:
            handle.write(uri + "\n")
        return open(self.folder / uri.removeprefix("store://"), mode)

    def opens(self) -> Counter:
        return Counter(self.log.read_text().split()) if self.log.exists() else Counter()


@pytest.fixture(scope="module")
def store(news, tmp_path_factory):  # noqa: F811 - a fixture from test_data
    """Eight shards of one length bin each (as the examples stage writes them) in a folder
    store, and their refs with the sizes and hashes a manifest records."""
    _, vocab = news
    tmp = tmp_path_factory.mktemp("store")
    cfg, records, _ = write_shards(news, tmp_path_factory.mktemp("source"))
    folder = tmp / "store"
    folder.mkdir()
    refs = []
    for k in range(8):
        part = [r for i, r in enumerate(records) if i % 8 == k]
        path = folder / f"part-{k:05d}.arrow"
        table = records_to_table(part, vocab.vocab_size)
        with ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=50)
        data = path.read_bytes()
        refs.append(ShardRef(f"store://{path.name}", len(part), len(data), hashlib.sha256(data).hexdigest()))
    return folder, refs, records


def read_epoch(folder: str, log: str, cache_dir: str, refs, rank: int, world: int, step=None) -> tuple[list, int]:
    """One rank's epoch through the machine's cache: its batches (as record keys) and the
    most bytes the cache folder held at any batch. `step`: a barrier the ranks meet at after
    each batch, as the collective training step makes them."""
    spec = CacheSpec(FolderStore(Path(folder), Path(log)), cache_dir, 1 << 30)
    loader = ExamplesLoader(
        refs,
        8,
        seed=5,
        rank=rank,
        world_size=world,
        local_rank=rank,
        length_bins=BINS,
        pad_id=0,
        window_shards=2,
        cache=spec.open(owner=f"rank-{rank}"),
    )
    batches, held = [], 0
    for batch in loader:
        batches.append(rows(batch))
        held = max(held, loader.cache.held_bytes())
        if step is not None:
            step.wait(timeout=60)
    loader.close()
    return batches, held


def _rank(results, *args) -> None:
    results.put((args[4], read_epoch(*args)))


def test_two_ranks_on_one_machine_download_each_shard_once(store, tmp_path, monkeypatch):
    folder, refs, _ = store
    log, cache_dir = tmp_path / "opens.log", tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    step, out = context.Barrier(2), context.Queue()
    # a spawned child starts from this process's sys.path; an earlier test in this worker may
    # have put a package folder on it (Prefect adds a flow entrypoint's folder, flows/, whose
    # inspect.py would shadow the standard library's in the child)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / "__init__.py").exists()])
    ranks = [
        context.Process(target=_rank, args=(out, str(folder), str(log), str(cache_dir), refs, r, 2, step))
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    results = dict(out.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0
    opens = FolderStore(folder, log).opens()
    # once each in the epoch; the next epoch's first window may have been fetched ahead once more
    ahead = {ref.uri for ref in ExamplesLoader(refs, 8, seed=5, window_shards=2, pad_id=0).windows.refs(1, 0)}
    assert sorted(opens) == sorted(r.uri for r in refs), opens
    assert all(n == 1 or (n == 2 and uri in ahead) for uri, n in opens.items()), opens
    # the two ranks' batches are the one-rank order, dealt round-robin
    one, _ = read_epoch(str(folder), str(tmp_path / "single.log"), str(tmp_path / "single"), refs, 0, 1)
    dealt = [b for pair in zip(results[0][0], results[1][0]) for b in pair]
    assert dealt == one[: len(dealt)] and len(one) - len(dealt) < 2
    # the folder held at most the windows the readers were on and the next ones, never all eight shards
    window = 2 * max(r.bytes for r in refs)
    assert max(held for _, held in results.values()) <= 3 * window < sum(r.bytes for r in refs)


def test_a_damaged_shard_is_named_where_it_is_read(store, tmp_path):
    folder, refs, _ = store
    copy = tmp_path / "store"
    copy.mkdir()
    for ref in refs:
        (copy / ref.uri.removeprefix("store://")).write_bytes((folder / ref.uri.removeprefix("store://")).read_bytes())
    victim = copy / "part-00003.arrow"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    spec = CacheSpec(FolderStore(copy, tmp_path / "opens.log"), str(tmp_path / "cache"), 1 << 30)
    loader = ExamplesLoader(refs, 8, seed=5, pad_id=0, window_shards=8, cache=spec.open(owner="rank-0"))
    with pytest.raises(DamagedShard, match=r"store://part-00003\.arrow: its sha256 differs") as caught:
        next(iter(loader))
    assert caught.value.uri == "store://part-00003.arrow"
    assert not os.path.exists(tmp_path / "cache" / "shards" / f"{refs[3].key}.arrow")  # never published


def test_a_local_shard_is_hashed_once_per_machine_and_checked(store, tmp_path):
    folder, refs, _ = store

    class Local:
        def local_path(self, uri: str) -> str:
            return str(folder / uri.removeprefix("store://"))

        def open(self, uri: str, mode: str = "rb"):
            raise AssertionError("a local shard is read in place")

    spec = CacheSpec(Local(), str(tmp_path / "cache"), 1 << 30)
    assert sum(1 for _ in ExamplesLoader(refs, 8, seed=5, pad_id=0, cache=spec.open(owner="rank-0"))) > 0
    assert sorted(os.listdir(tmp_path / "cache" / "verified")) == sorted(r.key for r in refs)
    assert not os.listdir(tmp_path / "cache" / "shards")  # nothing copied
    wrong = [ShardRef(refs[0].uri, refs[0].rows, refs[0].bytes + 1, refs[0].sha256), *refs[1:]]
    with pytest.raises(DamagedShard, match=r"part-00000\.arrow: \d[\d,]* bytes where the manifest records"):
        next(iter(ExamplesLoader(wrong, 8, seed=5, pad_id=0, cache=spec.open(owner="rank-1"))))


def test_the_loader_holds_one_window_and_the_cache_goes_with_the_run(store, tmp_path):
    folder, refs, records = store
    spec = CacheSpec(FolderStore(folder, tmp_path / "opens.log"), str(tmp_path / "cache"), 1 << 30)
    loader = ExamplesLoader(refs, 8, seed=5, pad_id=0, window_shards=1, cache=spec.open(owner="rank-0"))
    held = set()
    for _ in loader:
        held.add(sum(len(w.records) for w in loader.windows._open.values()))
    assert max(held) <= 2 * max(r.rows for r in refs) < len(records) / 3  # two windows of one shard at most
    loader.close()
    spec.open(owner="end").remove()
    assert not os.path.exists(tmp_path / "cache")
