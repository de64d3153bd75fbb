"""Splits: the seeded stratified split, the per-split category check, and the data version over them."""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict

from entrypoint.data.reading import DataError

__all__ = ["SPLITS", "SPLIT_VERSION", "check_categories", "data_version", "split_rows"]

SPLITS = ("train", "eval", "test")
SPLIT_VERSION = "stratified-2"  # 2: rows ordered by a digest of their JSON, not the JSON itself


def split_rows(rows: list[dict], eval_share: float, test_share: float, seed: int) -> dict[str, list[dict]]:
    """Stratified split: each category is shuffled with `seed` and cut by the shares, so every split holds
    every category in about the same proportion. Deterministic for the same rows in any input order."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(rows, key=_row_digest):
        by_label[row["label"]].append(row)
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
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


def _row_digest(row: dict) -> bytes:
    """A row's order before the seeded shuffle: 16 bytes per row to sort by, not a copy of its text."""
    return hashlib.blake2b(json.dumps(row, sort_keys=True).encode(), digest_size=16).digest()


def data_version(splits: dict[str, list[dict]], recipe: dict) -> str:
    """sha256 over the sorted hashes of each split's canonical rows and the `recipe` (rules, preprocessing
    and split method versions, tokenizer hash). The same examples in another order or file give the same
    version; one changed example or rule gives another."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for name in sorted(splits):
        row_hashes = sorted(hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest() for r in splits[name])
        digest.update(f"\n{name}:{','.join(row_hashes)}".encode())
    return digest.hexdigest()


def check_categories(splits: dict[str, list[dict]], declared: list[str] | None) -> list[str]:
    """The labels (declared, or those of the train split); every split must be non-empty and hold each."""
    for name, rows in splits.items():
        if not rows:
            raise DataError(f"data: the {name} split is empty (after cleaning and leak handling)")
    labels = declared or sorted({r["label"] for r in splits["train"]})
    for name, rows in splits.items():
        missing = sorted(set(labels) - {r["label"] for r in rows})
        if missing:
            raise DataError(f"data: categories {missing} are absent from the {name} split; every split needs each one")
    return labels
