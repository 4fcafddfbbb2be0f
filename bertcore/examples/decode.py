"""Examples records as text, the way Google's create_pretraining_data prints its first
examples: the tokens the model sees, the segment boundary, the masked positions with what
was there before, and the next-sentence label.

A record is one row of an examples shard (its layout is in bertcore/examples/layout.py and
docs/stages/examples.md): `input_ids` (masks already applied), `segment_b_start`,
`masked_positions` and `masked_ids` (the original ids there), `next_sentence_label`. A
masked position shows what the model reads and what it must predict:

    [MASK:city]     the original `city`, replaced by [MASK] (80% of predictions)
    [city>bank]     `city` replaced by the random token `bank` (10%)
    [=city]         `city` kept as it was, and predicted (10%)
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

NSP_LABELS = {0: "B follows A", 1: "B is a random next sentence", -1: "no next-sentence objective"}
LEGEND = "marks: [MASK:orig] masked · [orig>new] replaced by a random token · [=orig] kept and predicted"


@dataclass
class Masked:
    position: int
    original: str
    shown: str
    kind: Literal["mask", "random", "kept"]


@dataclass
class DecodedExample:
    tokens: list[str]
    """What the model reads, [CLS] A [SEP] B [SEP], masks applied."""
    segment_b_start: int
    """Index of the first token of segment B (the token type ids switch to 1 there)."""
    next_sentence_label: int
    masked: list[Masked] = field(default_factory=list)

    @property
    def segment_ids(self) -> list[int]:
        return [0 if i < self.segment_b_start else 1 for i in range(len(self.tokens))]

    def marked(self) -> list[str]:
        """The tokens with each masked position marked (see the module docstring)."""
        out = list(self.tokens)
        for m in self.masked:
            out[m.position] = {
                "mask": f"[MASK:{m.original}]",
                "random": f"[{m.original}>{m.shown}]",
                "kept": f"[={m.original}]",
            }[m.kind]
        return out

    def counts(self) -> Counter:
        return Counter(m.kind for m in self.masked)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"segment_ids": self.segment_ids, "nsp": NSP_LABELS.get(self.next_sentence_label, "?")}

    def render(self, width: int = 100, indent: str = "    ") -> list[str]:
        """Segment A and segment B on lines of their own (wrapped at `width`), then the
        masking figures."""
        marked = self.marked()
        lines = []
        for name, part in (("A", marked[: self.segment_b_start]), ("B", marked[self.segment_b_start :])):
            if part:
                lines.extend(
                    textwrap.wrap(
                        " ".join(part), width, initial_indent=f"{indent}{name}: ", subsequent_indent=indent + "   "
                    )
                )
        if self.masked:
            kinds = self.counts()
            lines.append(
                f"{indent}{len(self.masked)} predicted: {kinds['mask']} [MASK], {kinds['random']} random, "
                f"{kinds['kept']} kept"
            )
        return lines


def decode_example(record: dict, vocab: Sequence[str], mask_token: str | None = None) -> DecodedExample:
    """The record's tokens and masked positions as vocabulary pieces; `mask_token` defaults
    to [MASK], or RoBERTa's <mask> in a vocabulary without [MASK]."""
    if mask_token is None:
        mask_token = "[MASK]" if "[MASK]" in vocab else "<mask>"
    ids = [int(i) for i in record["input_ids"]]
    tokens = [vocab[i] for i in ids]
    masked = []
    for position, original_id in zip(record.get("masked_positions") or [], record.get("masked_ids") or []):
        position, original_id = int(position), int(original_id)
        shown = tokens[position]
        kind = "mask" if shown == mask_token else "kept" if ids[position] == original_id else "random"
        masked.append(Masked(position, vocab[original_id], shown, kind))
    return DecodedExample(tokens, int(record["segment_b_start"]), int(record["next_sentence_label"]), masked)
