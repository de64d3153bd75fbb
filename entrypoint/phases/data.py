"""Data phase: read the source, check every row, split by category with a recorded seed, version it.

Commits `phases/data/{train,eval,test}.jsonl` (canonical rows) before its result, so every later phase,
on any node, trains and evaluates on exactly these bytes.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path

from entrypoint.context import PhaseContext, to_jsonl

__all__ = ["DataError", "data_version", "run", "split_rows"]

SPLIT_VERSION = "stratified-1"


class DataError(ValueError):
    """Input data that cannot be used; the message names the file, the line and the field."""


def _read_source(ctx: PhaseContext) -> tuple[list[dict], bytes]:
    data = ctx.spec.data
    path = Path(data.source.removeprefix("file://"))
    if data.source.startswith("s3://"):
        raise DataError(f"data.source: {data.source}: s3:// data sources are not supported yet; copy it locally")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"data.source: file not found ({path}, resolved from {Path.cwd()})") from None
    rows, errors = [], []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{path}:{number}: not valid JSON ({exc.msg})")
            continue
        text, label = (obj.get(data.text_field), obj.get(data.label_field)) if isinstance(obj, dict) else (0, 0)
        if not isinstance(text, str) or not text.strip():
            errors.append(f"{path}:{number}: field {data.text_field!r} (data.text_field): expected non-empty text")
        elif not isinstance(label, str) or not label.strip():
            errors.append(f"{path}:{number}: field {data.label_field!r} (data.label_field): expected a label")
        else:
            rows.append({"text": text.strip(), "label": label.strip()})
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise DataError("\n".join(shown))
    return rows, raw


def split_rows(rows: list[dict], eval_share: float, test_share: float, seed: int) -> dict[str, list[dict]]:
    """Stratified split: each category is shuffled with `seed` and cut by the shares, so every split holds
    every category in about the same proportion. Deterministic for the same rows in any input order."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["label"], r["text"])):
        by_label[row["label"]].append(row)
    splits: dict[str, list[dict]] = {"train": [], "eval": [], "test": []}
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


def data_version(splits: dict[str, list[dict]]) -> str:
    """sha256 over the sorted hashes of each split's canonical rows and the split method.

    The same examples in another order or file give the same version; one changed example changes it.
    """
    digest = hashlib.sha256(SPLIT_VERSION.encode())
    for name in sorted(splits):
        row_hashes = sorted(hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest() for r in splits[name])
        digest.update(f"\n{name}:{','.join(row_hashes)}".encode())
    return digest.hexdigest()


def run(ctx: PhaseContext) -> dict:
    rows, raw = _read_source(ctx)
    seen: dict[str, str] = {}
    for row in rows:
        if seen.setdefault(row["text"], row["label"]) != row["label"]:
            raise DataError(
                f"data.source: the text {row['text'][:60]!r} appears with labels {seen[row['text']]!r} and "
                f"{row['label']!r}; fix the label"
            )
    unique = list({row["text"]: row for row in rows}.values())
    policy = ctx.spec.data.split
    splits = split_rows(unique, policy.eval, policy.test, policy.seed)
    for name, split_rows_ in splits.items():
        ctx.store.put_bytes(f"phases/data/{name}.jsonl", to_jsonl(split_rows_))
    labels = sorted({row["label"] for row in unique})
    counts = {
        name: {label: sum(r["label"] == label for r in part) for label in labels} for name, part in splits.items()
    }
    ctx.log(f"data: {len(rows)} rows, {len(rows) - len(unique)} exact duplicates dropped, {len(labels)} categories")
    for name, part in splits.items():
        ctx.log(f"data:   {name:<5} {len(part):>5} examples")
    return {
        "source": ctx.spec.data.source,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "rows_read": len(rows),
        "exact_duplicates_dropped": len(rows) - len(unique),
        "labels": labels,
        "counts": counts,
        "split": {"method": SPLIT_VERSION, "eval": policy.eval, "test": policy.test, "seed": policy.seed},
        "data_version": data_version(splits),
    }
