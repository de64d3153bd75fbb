"""Padding-free packing for causal LMs (`training.packing: true`): encoded examples packed into rows of
at most `max_length` tokens, with position ids restarting at 0 for each example.

    examples   [a a a a] [b b] [c c c] [d d d d d d]           (max_length 8)
    rows       [d d d d d d b b]  [a a a a c c c]
    positions  [0 1 2 3 4 5 0 1]  [0 1 2 3 0 1 2]
    labels     [- . . . . . - .]  [- . . . - . .]               (-: the first token of each example, ignored)

No example attends to another: rows carry `position_ids` and no attention mask, and transformers builds a
block-diagonal causal mask from where the positions restart (`masking_utils.find_packed_sequence_indices`
for sdpa and eager; flash-attention's varlen kernels from the same positions). Each example's first label
is ignored: in a row it would be predicted from the previous example's last token (unpacked, position 0
is never predicted either). The loss stays normalised per label token across the accumulated batch,
counted the same way as unpacked, so packing changes how examples share a step, not what each token
contributes.

Packing is best-fit decreasing (longest example first, into the fullest row it fits): deterministic for
the same examples, and rows come out nearly full. The Trainer shuffles the rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from entrypoint.data.encoding import IGNORE_INDEX

__all__ = ["PackedCollator", "PackedRows", "pack", "pack_plan", "packed", "row_boundaries", "step_rows", "to_device"]


def step_rows(spec, features: Sequence[dict], lengths: Sequence[int] | None = None) -> Sequence[dict]:
    """What training steps draw from: the encoded examples, or with `training.packing` their packed rows,
    planned from the examples' token `lengths` (read from the features when not given) and built when a
    step asks for them."""
    if not spec.training.packing:
        return features
    if lengths is None:
        lengths = [len(f["input_ids"]) for f in features]
    return PackedRows(features, pack_plan(lengths, spec.model.max_length))


class PackedRows(Sequence):
    """Packed rows built on access from `plan` (pack_plan) over `features`: nothing but the plan is held."""

    def __init__(self, features: Sequence[dict], plan: list[list[int]]):
        self.features, self.plan = features, plan

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return packed([self.features[i] for i in self.plan[index]])


def to_device(batch: dict, device: torch.device) -> dict:
    """A collated batch on `device` (its tensors; flags such as use_cache stay as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def pack(features: Sequence[dict], max_length: int) -> list[dict]:
    """Rows of at most `max_length` tokens, each holding whole examples: `input_ids`, `labels` and
    `position_ids` (0.. per example), and `lengths` (the examples' token counts, in row order; the
    collator drops it). Examples are already truncated to max_length by encoding."""
    plan = pack_plan([len(f["input_ids"]) for f in features], max_length)
    return [packed([features[i] for i in members]) for members in plan]


def pack_plan(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Which examples share a row (best-fit decreasing on their token `lengths`): example indices per row.
    Needs the lengths alone, so a whole split is planned without reading its token ids."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []  # example indices per row
    free: list[tuple[int, int]] = []  # (tokens left, row index), sorted: the fullest row that fits is found by bisect
    for i in order:
        n = lengths[i]
        if n > max_length:
            raise ValueError(f"packing: an example of {n} tokens is longer than model.max_length {max_length}")
        at = bisect.bisect_left(free, (n, -1))
        if at == len(free):  # fits no open row: open one
            rows.append([i])
            bisect.insort(free, (max_length - n, len(rows) - 1))
            continue
        left, row = free.pop(at)
        rows[row].append(i)
        if left - n > 0:
            bisect.insort(free, (left - n, row))
    return rows


def packed(examples: Sequence[dict]) -> dict:
    """One packed row of `examples`, in that order."""
    input_ids, labels, positions, lengths = [], [], [], []
    for example in examples:
        ids = list(example["input_ids"])
        input_ids += ids
        labels += [IGNORE_INDEX, *example["labels"][1:]]
        positions += range(len(ids))
        lengths.append(len(ids))
    return {"input_ids": input_ids, "labels": labels, "position_ids": positions, "lengths": lengths}


def row_boundaries(row: dict) -> list[tuple[int, int]]:
    """(start, end) token offsets of each example in a packed row."""
    bounds, start = [], 0
    for n in row["lengths"]:
        bounds.append((start, start + n))
        start += n
    return bounds


class PackedCollator:
    """Stacks packed rows into a batch, padding each to the longest row: pad tokens, ignored labels, and
    positions 0.. of their own, so the padding is one more sequence that nothing real attends to. No
    attention mask: the positions define it.

    The batch also says `use_cache: False`. Transformers looks for packed positions only when no key/value
    cache exists, and a causal LM's config asks for one by default, in training too: with a cache every
    example would attend to the ones before it in its row (tests/unit/test_packing.py catches this)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, rows: Sequence[dict]) -> dict:
        width = max(len(r["input_ids"]) for r in rows)
        batch = {"input_ids": [], "labels": [], "position_ids": []}
        for r in rows:
            pad = width - len(r["input_ids"])
            batch["input_ids"].append(list(r["input_ids"]) + [self.pad_token_id] * pad)
            batch["labels"].append(list(r["labels"]) + [IGNORE_INDEX] * pad)
            batch["position_ids"].append(list(r["position_ids"]) + list(range(pad)))
        return {**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}, "use_cache": False}
