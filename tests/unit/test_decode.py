"""Examples records as text (bertcore/examples/decode.py), checked on records made here."""

from __future__ import annotations

from bertcore.examples.decode import decode_example

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "city", "is", "on", "river", "bank", "##s", "old"]
ID = {token: i for i, token in enumerate(VOCAB)}


def ids(text: str) -> list[int]:
    return [ID[t] for t in text.split()]


def test_masked_replaced_and_kept_positions_are_told_apart():
    # original: [CLS] the city is on [SEP] the river bank ##s [SEP]
    record = {
        "input_ids": ids("[CLS] the [MASK] is on [SEP] the old bank ##s [SEP]"),
        "segment_b_start": 6,
        "masked_positions": [2, 7, 8],
        "masked_ids": ids("city river bank"),
        "next_sentence_label": 1,
    }
    example = decode_example(record, VOCAB)
    assert [(m.position, m.original, m.kind) for m in example.masked] == [
        (2, "city", "mask"),
        (7, "river", "random"),
        (8, "bank", "kept"),
    ]
    assert example.marked() == [
        "[CLS]",
        "the",
        "[MASK:city]",
        "is",
        "on",
        "[SEP]",
        "the",
        "[river>old]",
        "[=bank]",
        "##s",
        "[SEP]",
    ]
    assert example.segment_ids == [0] * 6 + [1] * 5
    lines = example.render()
    assert lines[0] == "    A: [CLS] the [MASK:city] is on [SEP]"
    assert lines[1] == "    B: the [river>old] [=bank] ##s [SEP]"
    assert lines[2] == "    3 predicted: 1 [MASK], 1 random, 1 kept"
    data = example.to_json()
    assert data["nsp"] == "B is a random next sentence" and data["masked"][1]["shown"] == "old"


def test_unmasked_records_and_long_segments_render_without_marks():
    # dynamic masking stores no masks; RoBERTa-style packing has no segment B and no NSP label
    record = {
        "input_ids": ids("[CLS] " + "the city is old " * 30 + "[SEP]"),
        "segment_b_start": 122,
        "masked_positions": [],
        "masked_ids": [],
        "next_sentence_label": -1,
    }
    example = decode_example(record, VOCAB)
    lines = example.render(width=80)
    assert not example.masked and len(lines) > 1
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("    A: [CLS] the city") and not any(line.lstrip().startswith("B:") for line in lines)
    assert example.to_json()["nsp"] == "no next-sentence objective"
