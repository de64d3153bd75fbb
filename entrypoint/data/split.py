"""Splits: the seeded stratified split, the per-split category check, and the data version over them."""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from entrypoint.data.reading import DataError
from entrypoint.data.spool import SpooledRows, labels_of, order_digest

__all__ = [
    "SPLITS",
    "SPLIT_VERSION",
    "check_categories",
    "data_version",
    "sort_digests",
    "split_positions",
    "split_rows",
]

SPLITS = ("train", "eval", "test")
SPLIT_VERSION = "stratified-2"  # 2: rows ordered by a digest of their JSON, not the JSON itself


def split_rows(
    rows: Sequence[dict],
    eval_share: float,
    test_share: float,
    seed: int,
    identity: Callable[[dict], dict] | None = None,
) -> dict[str, Sequence[dict]]:
    """Stratified split: each category is shuffled with `seed` and cut by the shares, so every split holds
    every category in about the same proportion. Deterministic for the same rows in any input order: rows
    are first ordered by a digest of their `identity` (the row itself when None). Spooled rows (text rows,
    their own identity) use the digests taken when they were spooled and give views of the same spool
    (data/spool.py); a list gives lists."""
    if isinstance(rows, SpooledRows):
        order = rows.order
    else:
        digests = b"".join(order_digest(identity(row) if identity else row) for row in rows)
        order = np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16)
    positions = split_positions(order, labels_of(rows), eval_share, test_share, seed)
    if isinstance(rows, SpooledRows):
        return {name: rows.take(chosen) for name, chosen in positions.items()}
    return {name: [rows[i] for i in chosen] for name, chosen in positions.items()}


def split_positions(
    order: np.ndarray, labels: Sequence[str], eval_share: float, test_share: float, seed: int
) -> dict[str, list[int]]:
    """The split as positions into the rows: rows sorted by their 16-byte `order` digests, grouped by label,
    each group shuffled with `seed` and cut by the shares."""
    by_label: dict[str, list[int]] = defaultdict(list)
    sorted_positions = sort_digests(order) if len(order) else np.zeros(0, dtype=np.int64)
    for i in sorted_positions.tolist():
        by_label[labels[i]].append(i)
    splits: dict[str, list[int]] = {name: [] for name in SPLITS}
    for label in sorted(by_label):
        group = by_label[label]
        random.Random(f"{seed}:{label}").shuffle(group)
        n_eval, n_test = round(len(group) * eval_share), round(len(group) * test_share)
        if n_eval < 1 or n_test < 1 or len(group) - n_eval - n_test < 1:
            raise DataError(
                f"data.source: category {label!r} has {len(group)} examples, too few to put at least one in "
                "each of train, eval and test; add examples or change data.split"
            )
        splits["test"] += group[:n_test]
        splits["eval"] += group[n_test : n_test + n_eval]
        splits["train"] += group[n_test + n_eval :]
    random.Random(seed).shuffle(splits["train"])
    return splits


def sort_digests(digests: np.ndarray) -> np.ndarray:
    """Positions of (n, k) uint8 digests in byte order (stable), as bytes objects would sort."""
    words = digests.view(">u8").astype(np.uint64)  # (n, k/8) big-endian words: numeric order = byte order
    return np.lexsort(words.T[::-1])


def data_version(splits: dict[str, Sequence[dict]], recipe: dict) -> str:
    """sha256 over the sorted hashes of each split's canonical rows and the `recipe` (rules, preprocessing
    and split method versions, tokenizer hash). The same examples in another order or file give the same
    version; one changed example or rule gives another. Holds 32 bytes per row, not the rows' hashes as text."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for name in sorted(splits):
        hashes = bytearray()
        for row in splits[name]:
            hashes += hashlib.sha256(json.dumps(row, sort_keys=True).encode()).digest()
        table = np.frombuffer(bytes(hashes), dtype=np.uint8).reshape(-1, 32)
        table = table[sort_digests(table)] if len(table) else table
        digest.update(f"\n{name}:".encode())
        for start in range(0, len(table), 65_536):  # hex, comma separated, a block at a time
            block = ",".join(row.tobytes().hex() for row in table[start : start + 65_536])
            digest.update(("," if start else "").encode() + block.encode())
    return digest.hexdigest()


def check_categories(splits: dict[str, list[dict]], declared: list[str] | None) -> list[str]:
    """The labels (declared, or those of the train split); every split must be non-empty and hold each."""
    for name, rows in splits.items():
        if not rows:
            raise DataError(
                f"data: the {name} split is empty (after cleaning, leak handling and, for causal LMs, dropping "
                "rows with nothing to train on at model.max_length)"
            )
    labels = declared or sorted(set(labels_of(splits["train"])))
    for name, rows in splits.items():
        missing = sorted(set(labels) - set(labels_of(rows)))
        if missing:
            raise DataError(f"data: categories {missing} are absent from the {name} split; every split needs each one")
    return labels
