"""Token-budget batching: the rows a batch of requests gathered (one per text, or per window
of a long text), cut into model calls of at most `budget` padded tokens each.

A call pads its rows to its longest, so it costs rows x longest tokens. Rows are sorted by
length, longest first (ties in arrival order), and filled greedily: a call takes the next
row while (rows + 1) x its longest row stays within the budget and it holds fewer than
`max_rows`. Sorting keeps rows of similar length together, so little is padding; a row
longer than the budget runs alone. The plan depends only on the lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def plan(lengths: Sequence[int], budget: int, max_rows: int | None = None) -> list[list[int]]:
    """Indexes into `lengths`, one list per model call (see the module docstring)."""
    if budget < 1:
        raise ValueError(f"the token budget must be at least 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    calls: list[list[int]] = []
    for i in order:
        current = calls[-1] if calls else None
        if (
            current is not None
            and (len(current) + 1) * lengths[current[0]] <= budget
            and (max_rows is None or len(current) < max_rows)
        ):
            current.append(i)
        else:
            calls.append([i])
    return calls


def padded_tokens(lengths: Sequence[int], calls: Sequence[Sequence[int]]) -> int:
    """Tokens the calls compute, padding included."""
    return sum(len(call) * max(lengths[i] for i in call) for call in calls)


def pad(
    rows: Sequence[Sequence[int]], pad_id: int, types: Sequence[Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """The model's three inputs (int64, (B, T), T the longest row) for token id rows, padded
    at the end with `pad_id`; `types`: token type ids per row (default all 0)."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    token_types = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
        if types is not None:
            token_types[r, : len(row)] = types[r]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}
