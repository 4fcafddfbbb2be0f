"""`bertpipe inspect` on the corpus, vocab and examples of the session's demo pipeline:
what it shows is what the shards hold (pretrain and evaluate are inspected after the
end-to-end run in test_cli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertcore.errors import BertpipeError
from bertcore.vocab.tokenizer import load_tokenizer, read_vocab
from flows.inspect import Options, inspect
from pipelines.shards import read_table
from pipelines.storage import Storage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo(demo_pipeline):
    cfg, manifests = demo_pipeline
    return Storage(cfg.storage), cfg.run.root, manifests


def test_corpus_shows_the_first_documents_of_a_split_as_stored(demo):
    storage, root, manifests = demo
    data, lines = inspect(storage, root, "corpus", Options(n=3, split="validation"))
    first_shard = manifests["corpus"].shards_under("validation/")[0].path
    table = read_table(storage, f"{root}/corpus/{first_shard}").slice(0, 3).to_pylist()
    assert [(d["doc_id"], d["title"], d["sentences"]) for d in data["documents"]] == [
        (r["doc_id"], r["title"], r["sentences"]) for r in table
    ]
    assert data["documents_in_split"] == manifests["corpus"].stats["splits"]["validation"]["documents"]
    assert lines[1].startswith(f"[1] {table[0]['title']}") and lines[2].strip().startswith(
        f"1  {table[0]['sentences'][0][:40]}"
    )


def test_vocab_summary_and_how_a_text_tokenizes(demo):
    storage, root, manifests = demo
    text = "The river flows through Ångström's quixotically named city."
    data, lines = inspect(storage, root, "vocab", Options(text=text))
    tokenizer = load_tokenizer(os.path.join(root, "vocab"))
    vocab = read_vocab(os.path.join(root, "vocab", "vocab.txt"))
    assert data["vocab_size"] == len(vocab) == manifests["vocab"].stats["vocab_size"]
    assert set(data["alphabet"]) == {p for p in vocab if len(p) == 1 and p not in data["special_tokens"]}
    assert all(
        len(a.removeprefix("##")) >= len(b.removeprefix("##"))
        for a, b in zip(data["longest_pieces"], data["longest_pieces"][1:])
    )
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert data["text"]["pieces"] == encoding.tokens and data["text"]["ids"] == encoding.ids
    assert [vocab[i] for i in data["text"]["ids"]] == data["text"]["pieces"]
    assert any(line.startswith(f"{text!r} -> {len(encoding.tokens)} pieces") for line in lines)


def test_examples_decode_to_the_tokens_and_masks_stored(demo):
    storage, root, manifests = demo
    data, lines = inspect(storage, root, "examples", Options(n=4, phase="seq128"))
    vocab = read_vocab(os.path.join(root, "vocab", "vocab.txt"))
    first_shard = next(s.path for s in manifests["examples"].shards_under("seq128/train/") if s.rows)
    stored = read_table(storage, f"{root}/examples/{first_shard}").to_pylist()
    assert len(data["examples"]) == 4
    for example in data["examples"]:
        record = stored[example["row"]] if example["shard"] == first_shard else None
        if record is None:
            continue
        assert example["tokens"] == [vocab[i] for i in record["input_ids"]]
        assert example["tokens"][0] == "[CLS]" and example["tokens"][-1] == "[SEP]"
        assert example["tokens"][example["segment_b_start"] - 1] == "[SEP]"  # segment A ends with its [SEP]
        assert [m["position"] for m in example["masked"]] == record["masked_positions"]
        assert [m["original"] for m in example["masked"]] == [vocab[i] for i in record["masked_ids"]]
        for m in example["masked"]:
            shown = vocab[record["input_ids"][m["position"]]]
            assert (m["kind"] == "mask") == (shown == "[MASK]")
            assert (m["kind"] == "kept") == (shown == m["original"] != "[MASK]")
        assert example["next_sentence_label"] == record["next_sentence_label"] in (0, 1)
    text = "\n".join(lines)
    assert "NSP label" in text and "[MASK:" in text and "    A: [CLS]" in text and "    B: " in text


def test_inspect_names_what_is_missing(tmp_path, demo):
    storage, root, _ = demo
    with pytest.raises(
        BertpipeError, match=r"the pretrain stage has no complete output under .*bertpipe run --only pretrain"
    ):
        inspect(storage, str(tmp_path), "pretrain", Options())
    with pytest.raises(BertpipeError, match="--phase seq999: the examples stage made phases seq128"):
        inspect(storage, root, "examples", Options(phase="seq999"))


def test_inspect_from_the_command_line_prints_json(demo):
    _, root, manifests = demo
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "inspect",
            "examples",
            "--root",
            root,
            "--n",
            "2",
            "--split",
            "validation",
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["split"] == "validation" and len(data["examples"]) == 2
    assert data["sequences_in_split"] == sum(
        s.rows for s in manifests["examples"].shards_under(f"{data['phase']}/validation/")
    )
