"""The training data loader over examples shards: batches, padding, labels, rank sharding,
per-epoch shuffling and dynamic masking, exact mid-epoch resume, and windows of shards
(one file each here: the tests' three shards make three windows)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.ipc as ipc
import pytest
import torch

from bertcore.examples.config import ExamplesConfig
from bertcore.examples.layout import examples_for_shard, records_to_table
from bertcore.examples.masking import VocabTables, num_to_predict
from bertcore.examples.pairs import InMemoryDocs
from bertcore.train.loader import Batching, ExamplesLoader

torch.set_num_threads(1)

BINS = [32, 64, 128]


@pytest.fixture(scope="module")
def news(gensim_data):
    """(documents as token ids, VocabTables): 300 news articles, a 1000-entry WordPiece."""
    from tokenizers import BertWordPieceTokenizer

    lines = (gensim_data / "lee_background.cor").read_text(encoding="utf-8", errors="replace").splitlines()
    documents = [[s.strip() for s in line.split(". ") if s.strip()] for line in lines if line.strip()]
    sentences = [s for d in documents for s in d]
    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator(
        sentences, vocab_size=1000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
    )
    encoded = iter(tokenizer.encode_batch(sentences, add_special_tokens=False))
    docs = [[next(encoded).ids for _ in d] for d in documents]
    docs = [[s for s in d if s] for d in docs]
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    return [d for d in docs if d], VocabTables.from_tokens(tokens)


def write_shards(news, tmp_path, **cfg_kw):
    """Examples shards grouped by length bin, as the examples stage writes them."""
    docs, vocab = news
    cfg = ExamplesConfig(max_seq_length=128, length_bins=BINS, **cfg_kw)
    records = list(
        examples_for_shard(range(len(docs)), InMemoryDocs(docs), cfg, cfg.phases[0], 7, vocab, passes=[0, 1])
    )
    paths = []
    for k, bound in enumerate(BINS):
        part = [r for r in records if cfg.length_bin(r["length"]) == bound]
        table = records_to_table(part, vocab.vocab_size)
        path = tmp_path / f"part-{k:05d}.arrow"
        with ipc.new_file(str(path), table.schema) as writer:
            for start in range(0, len(part), 100):  # several record batches per file
                writer.write_table(table.slice(start, 100))
        paths.append(path)
    return cfg, records, paths


@pytest.fixture(scope="module")
def static_shards(news, tmp_path_factory):
    return write_shards(news, tmp_path_factory.mktemp("static"))


@pytest.fixture(scope="module")
def dynamic_shards(news, tmp_path_factory):
    return write_shards(news, tmp_path_factory.mktemp("dynamic"), masking="dynamic")


def test_without_token_types_every_type_is_zero_and_the_rest_is_the_same(news, static_shards):
    # RoBERTa has one token type: pairs keep their segment_b_start, the model sees type 0 only
    docs, vocab = news
    _, records, paths = static_shards
    typed = ExamplesLoader(paths, 16, seed=1, length_bins=BINS, pad_id=vocab.special.pad)
    untyped = ExamplesLoader(paths, 16, seed=1, length_bins=BINS, pad_id=vocab.special.pad, token_types=False)
    some_ones = False
    for a, b in zip(typed, untyped):
        some_ones |= bool(a["token_type_ids"].any())
        assert not b["token_type_ids"].any()
        assert all(torch.equal(a[k], b[k]) for k in a if k != "token_type_ids")
    assert some_ones


def rows(batch):
    """(input_ids without padding) per row, as tuples."""
    lengths = batch["attention_mask"].sum(1).tolist()
    return [tuple(batch["input_ids"][b, :n].tolist()) for b, n in enumerate(lengths)]


def mixes(cfg, batch) -> bool:
    return len({cfg.length_bin(int(n)) for n in batch["attention_mask"].sum(1)}) > 1


@pytest.mark.parametrize("window_shards", [None, 1])
def test_static_batches_are_padded_labelled_and_typed(news, static_shards, window_shards):
    docs, vocab = news
    cfg, records, paths = static_shards
    assert len(records) > 300
    by_ids = {tuple(r["input_ids"]): r for r in records}
    loader = ExamplesLoader(paths, 16, seed=1, length_bins=BINS, pad_id=vocab.special.pad, window_shards=window_shards)
    seen = mixed = 0
    for batch in loader:
        B, T = batch["input_ids"].shape
        assert all(batch[k].dtype == torch.long for k in batch)
        assert batch["labels"].shape == (B, T) and batch["next_sentence_label"].shape == (B,)
        lengths = batch["attention_mask"].sum(1)
        assert T % 8 == 0 and int(lengths.max()) <= T < int(lengths.max()) + 8
        mixed += mixes(cfg, batch)
        for b, key in enumerate(rows(batch)):
            record = by_ids[key]
            n, start = record["length"], record["segment_b_start"]
            assert batch["attention_mask"][b].tolist() == [1] * n + [0] * (T - n)
            assert batch["token_type_ids"][b].tolist() == [0] * start + [1] * (n - start) + [0] * (T - n)
            assert (batch["input_ids"][b, n:] == vocab.special.pad).all()
            labels = batch["labels"][b]
            positions = torch.nonzero(labels != -100).flatten().tolist()
            assert positions == record["masked_positions"]
            assert labels[positions].tolist() == record["masked_ids"]
            assert int(batch["next_sentence_label"][b]) == record["next_sentence_label"]
        seen += B
    assert seen == len(records)
    # one window of three bins: only what the bins leave over is batched together (at most 2
    # batches); windows of one file each (one bin each here) never mix
    assert mixed <= (len(BINS) - 1 if window_shards is None else 0)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_share_an_epoch_exactly_once(static_shards, world_size):
    _, records, paths = static_shards
    per_rank = []
    for rank in range(world_size):
        loader = ExamplesLoader(
            paths, 8, seed=3, rank=rank, world_size=world_size, length_bins=BINS, pad_id=0, even_batches=False
        )
        per_rank.append(Counter(key for batch in loader for key in rows(batch)))
    total = sum(per_rank, Counter())
    assert total == Counter(tuple(r["input_ids"]) for r in records)
    # even_batches: the same number of batches on every rank; each record at most once, all
    # but those of the epoch's last incomplete round of world_size batches.
    even = [
        ExamplesLoader(paths, 8, seed=3, rank=r, world_size=world_size, length_bins=BINS, pad_id=0)
        for r in range(world_size)
    ]
    assert len({len(loader) for loader in even}) == 1
    batches = [list(loader) for loader in even]
    assert [len(b) for b in batches] == [len(loader) for loader in even]
    seen = Counter(key for bs in batches for b in bs for key in rows(b))
    assert max(seen.values()) == 1
    assert len(total) - (world_size - 1) * 8 <= sum(seen.values()) <= len(total)


def test_epochs_are_shuffled_by_seed_and_epoch(static_shards):
    _, _, paths = static_shards

    def epochs(seed, n=2):
        loader = ExamplesLoader(paths, 8, seed=seed, length_bins=BINS, pad_id=0)
        return [[rows(b) for b in loader] for _ in range(n)]

    first = epochs(5)
    assert first == epochs(5)
    assert first[0] != first[1]
    assert sorted(map(sorted, first[0])) != sorted(map(sorted, first[1])), "new batch composition each epoch"
    assert epochs(6, 1)[0] != first[0]


@pytest.mark.parametrize("window_shards", [None, 1])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(news, dynamic_shards, window_shards):
    _, vocab = news
    cfg, _, paths = dynamic_shards
    mask = cfg.mask_config(cfg.phases[0], vocab)

    def make():
        return ExamplesLoader(
            paths,
            8,
            seed=11,
            rank=1,
            world_size=2,
            length_bins=BINS,
            masking="dynamic",
            mask_config=mask,
            window_shards=window_shards,
        )

    reference = make()
    epoch0, epoch1 = list(reference), list(reference)
    interrupted = make()
    taken = []
    for batch in interrupted:
        taken.append(batch)
        if len(taken) == 5:
            break
    state = interrupted.state_dict()
    assert state["epoch"] == 0 and state["batches_consumed"] == 5
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(taken) + len(rest) == len(epoch0) == len(reference)
    for got, want in zip(taken + rest, epoch0):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert all(all(torch.equal(g[k], w[k]) for k in w) for g, w in zip(list(resumed), epoch1))
    # A state taken after the last batch of an epoch resumes at the next epoch.
    done = make()
    list(done)
    assert done.state_dict()["epoch"] == 1 and done.state_dict()["batches_consumed"] == 0
    with pytest.raises(ValueError, match="batch_size"):
        ExamplesLoader(
            paths, 4, seed=11, world_size=1, length_bins=BINS, pad_id=0, window_shards=window_shards
        ).load_state_dict(state)


@pytest.mark.parametrize("window_shards", [None, 1])
def test_a_state_of_two_ranks_resumes_on_one_rank_at_the_same_global_batch(news, dynamic_shards, window_shards):
    """A run that lost a node goes on with fewer workers: two ranks that took 5 batches each
    consumed the epoch's first 10 global batches (round-robin), so one rank resumes at the
    11th, and the batches it yields are the ones a one-rank run yields from there on."""
    _, vocab = news
    cfg, _, paths = dynamic_shards
    mask = cfg.mask_config(cfg.phases[0], vocab)

    def make(rank: int, world: int):
        return ExamplesLoader(
            paths,
            8,
            seed=11,
            rank=rank,
            world_size=world,
            length_bins=BINS,
            masking="dynamic",
            mask_config=mask,
            window_shards=window_shards,
        )

    one_rank = list(make(0, 1))
    two = [make(0, 2), make(1, 2)]
    taken = [[b for _, b in zip(range(5), loader)] for loader in two]
    interleaved = [batch for pair in zip(*taken) for batch in pair]
    assert all(all(torch.equal(g[k], w[k]) for k in w) for g, w in zip(interleaved, one_rank[:10]))
    resumed = make(0, 1)
    resumed.load_state_dict(two[0].state_dict())
    rest = list(resumed)
    assert len(rest) == len(one_rank) - 10 and len(rest) > 10
    assert all(all(torch.equal(g[k], w[k]) for k in w) for g, w in zip(rest, one_rank[10:]))
    odd = {**two[0].state_dict(), "batches_consumed": 5}
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        make(0, 3).load_state_dict(odd)


def test_dynamic_masking_is_new_each_epoch_and_reproducible(news, dynamic_shards):
    _, vocab = news
    cfg, records, paths = dynamic_shards
    mask = cfg.mask_config(cfg.phases[0], vocab)
    assert all(r["masked_positions"] == [] for r in records)
    originals = {tuple(r["input_ids"]): r for r in records}

    def labels_by_record(loader):
        out = {}
        for batch in loader:
            for b in range(batch["input_ids"].shape[0]):
                n = int(batch["attention_mask"][b].sum())
                labels = batch["labels"][b, :n]
                original = torch.where(labels != -100, labels, batch["input_ids"][b, :n])
                key = tuple(original.tolist())
                assert key in originals, "labels restore the stored sequence"
                count = int((labels != -100).sum())
                assert count == num_to_predict(n, mask)
                out[key] = tuple(torch.nonzero(labels != -100).flatten().tolist())
        return out

    # Without shuffling the batches are the same each epoch, so only the mask can change.
    kw = dict(seed=2, length_bins=BINS, masking="dynamic", mask_config=mask, shuffle=False)
    loader = ExamplesLoader(paths, 16, **kw)
    e0, e1 = labels_by_record(loader), labels_by_record(loader)
    again = labels_by_record(ExamplesLoader(paths, 16, **kw))
    assert e0 == again
    changed = sum(e0[k] != e1[k] for k in e0)
    assert changed > 0.9 * len(e0)


def test_worker_processes_give_the_same_batches(news, dynamic_shards):
    _, vocab = news
    cfg, _, paths = dynamic_shards
    mask = cfg.mask_config(cfg.phases[0], vocab)
    kw = dict(seed=4, length_bins=BINS, masking="dynamic", mask_config=mask)
    inline = list(ExamplesLoader(paths, 32, **kw))
    workers = list(ExamplesLoader(paths, 32, num_workers=2, **kw))
    assert len(inline) == len(workers)
    assert all(all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(inline, workers))


def test_records_without_nsp_get_ignored_nsp_labels(news, tmp_path):
    _, vocab = news
    _, records, paths = write_shards(news, tmp_path, objective="roberta")
    assert {r["next_sentence_label"] for r in records} == {-1}
    mask = ExamplesConfig(objective="roberta").mask_config(ExamplesConfig(objective="roberta").phases[0], vocab)
    for batch in ExamplesLoader(paths, 16, seed=0, masking="dynamic", mask_config=mask):
        assert (batch["next_sentence_label"] == -100).all()
        assert (batch["token_type_ids"] == 0).all()


def test_files_without_bins_group_by_file_and_bad_files_are_named(static_shards, tmp_path):
    cfg, _, paths = static_shards
    loader = ExamplesLoader(paths, 8, seed=0, pad_id=0)  # no bins: only the files' leftovers share a batch
    assert sum(mixes(cfg, batch) for batch in loader) <= len(paths) - 1
    bad = tmp_path / "part-00009.arrow"
    bad.write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="part-00009.arrow"):
        ExamplesLoader([*paths, bad], 8, seed=0, pad_id=0)
    with pytest.raises(ValueError, match="last length bin"):
        next(iter(ExamplesLoader(paths, 8, seed=0, pad_id=0, length_bins=[32, 64])))


def test_static_loader_refuses_shards_written_for_dynamic_masking(dynamic_shards):
    _, _, paths = dynamic_shards
    with pytest.raises(ValueError, match="masking='dynamic'"):
        next(iter(ExamplesLoader(paths, 8, seed=0, pad_id=0)))


def test_ids_outside_the_vocabulary_are_refused_naming_the_shard(news, static_shards):
    _, vocab = news
    _, _, paths = static_shards
    assert sum(1 for _ in ExamplesLoader(paths, 8, seed=0, pad_id=0, vocab_size=vocab.vocab_size)) > 0
    smaller = vocab.vocab_size - 500  # the shards' ids reach past it: a shard of another vocabulary
    with pytest.raises(
        ValueError,
        match=rf"part-0000\d\.arrow: input_ids holds token id \d+, outside this run's vocabulary of {smaller} entries",
    ):
        next(iter(ExamplesLoader(paths, 8, seed=0, pad_id=0, vocab_size=smaller)))


class Packing(Batching):
    """Batches of up to `budget` tokens, greedy in a shuffled order: how many a window gives
    is known only once its lengths are read (as for packed batches)."""

    def __init__(self, budget: int):
        super().__init__(1, drop_last=True, shuffle=True)
        self.budget = budget

    def count(self, rows: int) -> None:
        return None

    def __call__(self, lengths, groups, rng):
        batches, current, used = [], [], 0
        for i in rng.permutation(len(lengths)):
            if used + lengths[i] > self.budget and current:
                batches.append(np.asarray(current))
                current, used = [], 0
            current.append(i)
            used += int(lengths[i])
        return batches  # the last, partial batch is left out


def test_batch_counts_learnt_window_by_window_resume_from_the_window_a_state_names(news, dynamic_shards):
    """A batching whose counts need the records (packing) still gives one global order for
    every world size, and a resumed loader opens no window before the one its state names."""
    _, vocab = news
    cfg, _, paths = dynamic_shards
    mask = cfg.mask_config(cfg.phases[0], vocab)

    def make(rank: int, world: int) -> ExamplesLoader:
        loader = ExamplesLoader(
            paths, 8, seed=3, rank=rank, world_size=world, window_shards=1, masking="dynamic", mask_config=mask
        )
        loader.batching = loader.windows.batching = Packing(512)
        return loader

    one_rank = [rows(b) for b in make(0, 1)]
    two = [make(0, 2), make(1, 2)]
    taken = [[rows(b) for _, b in zip(range(12), loader)] for loader in two]
    assert [b for pair in zip(*taken) for b in pair] == one_rank[:24]
    state = two[0].state_dict()
    assert state["anchor"][0] >= 1  # 24 batches reach past the first window
    resumed = make(0, 1)
    opened = []
    open_window = resumed.windows.open
    resumed.windows.open = lambda epoch, window: opened.append(window) or open_window(epoch, window)
    resumed.load_state_dict(state)
    assert [rows(b) for b in resumed] == one_rank[24:]
    assert min(opened) == state["anchor"][0]
