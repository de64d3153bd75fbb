"""Data phase: prove that train, eval and the sealed test split are what the user thinks, before any
compute is spent on them.

    read (JSONL, local or s3://, every row checked) -> clean (named rules, counted) -> drop exact
    duplicates -> split (stratified, seeded) or take the given files -> check categories per split
    -> leak check between splits (exact + near duplicates; fail | drop | warn) -> version
    -> inspection (examples as the trainer sees them) -> smoke pass (one batch per split, forward + loss)

Commits `phases/data/{train,eval,test}.jsonl` (canonical rows), `leaks.json`, `inspection.{json,md}`
before its result, so every later phase, on any node, uses exactly these bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter, defaultdict

import torch
from transformers import AutoTokenizer

from entrypoint.cleaning import apply_rules, rule_ids
from entrypoint.context import PhaseContext, dumps, to_jsonl
from entrypoint.dataio import DataError, read_source, rows_from_jsonl
from entrypoint.inspection import build_inspection, length_stats, to_markdown
from entrypoint.leakcheck import LEAKCHECK_VERSION, find_leaks
from entrypoint.model import build_model, resolve_model_dir
from entrypoint.phases.test import check_seal
from entrypoint.preprocess import (
    PREPROCESS_VERSION,
    collator,
    encode_rows,
    is_causal,
    is_image,
    prepare_tokenizer,
    tokenizer_sha256,
)

__all__ = [
    "LEAK_PAIRS",
    "SPLITS",
    "DataError",
    "apply_leak_policy",
    "check_categories",
    "data_version",
    "run",
    "smoke_pass",
    "split_rows",
]

SPLITS = ("train", "eval", "test")
SPLIT_VERSION = "stratified-1"
# (side kept, side dropped from under `drop`, which policy applies): training data never wins over the
# splits that measure it.
LEAK_PAIRS = (("eval", "train", "eval"), ("test", "train", "test"), ("test", "eval", "test"))


def split_rows(rows: list[dict], eval_share: float, test_share: float, seed: int) -> dict[str, list[dict]]:
    """Stratified split: each category is shuffled with `seed` and cut by the shares, so every split holds
    every category in about the same proportion. Deterministic for the same rows in any input order."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: json.dumps(r, sort_keys=True)):
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


def data_version(splits: dict[str, list[dict]], recipe: dict) -> str:
    """sha256 over the sorted hashes of each split's canonical rows and the `recipe` (rules, preprocessing
    and split method versions, tokenizer hash). The same examples in another order or file give the same
    version; one changed example or rule gives another."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    for name in sorted(splits):
        row_hashes = sorted(hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest() for r in splits[name])
        digest.update(f"\n{name}:{','.join(row_hashes)}".encode())
    return digest.hexdigest()


def _dedupe(rows: list[dict], key_fields: tuple[str, ...], where: str) -> tuple[list[dict], int]:
    """Drop exact duplicate rows; the same input under two labels is an error (the data contradicts itself)."""
    seen: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[f] for f in key_fields)
        first = seen.setdefault(key, row)
        if first["label"] != row["label"] and "response" not in row:
            raise DataError(
                f"{where}: the text {key[0][:60]!r} appears with labels {first['label']!r} and {row['label']!r}; "
                "fix the label"
            )
    return list(seen.values()), len(rows) - len(seen)


def check_categories(splits: dict[str, list[dict]], declared: list[str] | None) -> list[str]:
    for name, rows in splits.items():
        if not rows:
            raise DataError(f"data: the {name} split is empty (after cleaning and leak handling)")
    labels = declared or sorted({r["label"] for r in splits["train"]})
    for name, rows in splits.items():
        missing = sorted(set(labels) - {r["label"] for r in rows})
        if missing:
            raise DataError(f"data: categories {missing} are absent from the {name} split; every split needs each one")
    return labels


def _leak_text(row: dict) -> str:
    return row["text"] if "text" in row else f"{row['prompt']}\n{row['response']}"


def _handle_leaks(ctx: PhaseContext, splits: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], dict]:
    policy = ctx.spec.data.leaks
    texts = {name: [_leak_text(r) for r in rows] for name, rows in splits.items()}
    pairs = [(dropped, kept) for kept, dropped, _ in LEAK_PAIRS]
    found = find_leaks(texts, pairs, threshold=policy.near_threshold)
    return apply_leak_policy(ctx, splits, found, texts, LEAKCHECK_VERSION, policy.near_threshold)


def apply_leak_policy(
    ctx: PhaseContext, splits: dict[str, list[dict]], found: list, shown: dict[str, list[str]], method: str, threshold
) -> tuple[dict[str, list[dict]], dict]:
    """Apply `data.leaks` to the leaks found: fail (listing the pairs), drop from the training side, or warn.
    `shown` holds what identifies each row in messages (the text, or the image's file name)."""
    policy = ctx.spec.data.leaks
    texts = shown
    action_for = {(dropped, kept): getattr(policy, which) for kept, dropped, which in LEAK_PAIRS}
    records, failing, doomed = [], [], defaultdict(set)
    for leak in found:
        action = action_for[(leak.a_split, leak.b_split)]
        record = {
            "kind": leak.kind,
            "similarity": round(leak.similarity, 4),
            "action": action,
            leak.a_split: texts[leak.a_split][leak.a_index],
            leak.b_split: texts[leak.b_split][leak.b_index],
            "pair": f"{leak.a_split}-{leak.b_split}",
        }
        records.append(record)
        if action == "fail":
            failing.append(record)
        elif action == "drop":
            doomed[leak.a_split].add(leak.a_index)
        else:
            ctx.log(f"data: warning: {leak.kind} duplicate {leak.a_split}/{leak.b_split} ({leak.similarity:.2f})")
    summary = {
        "method": method,
        "near_threshold": threshold,
        "policy": {"eval": policy.eval, "test": policy.test},
        "pairs": records,
        "counts": dict(Counter(f"{r['pair']}:{r['kind']}" for r in records)),
        "dropped": {name: len(indices) for name, indices in doomed.items()},
    }
    ctx.write_json("phases/data/leaks.json", summary)
    if failing:
        lines = [
            f"  {r['pair']} {r['kind']} (similarity {r['similarity']:.2f}): "
            f"{r[r['pair'].split('-')[0]][:70]!r} ~ {r[r['pair'].split('-')[1]][:70]!r}"
            for r in failing[:20]
        ]
        more = f"\n  ... and {len(failing) - 20} more (all in phases/data/leaks.json)" if len(failing) > 20 else ""
        raise DataError(
            f"data.leaks: {len(failing)} duplicate(s) between splits under policy 'fail':\n"
            + "\n".join(lines)
            + more
            + "\nremove them from the data, or set data.leaks.test/eval to 'drop' to remove them from the "
            "training side"
        )
    for name, indices in doomed.items():
        splits[name] = [row for i, row in enumerate(splits[name]) if i not in indices]
        ctx.log(f"data: dropped {len(indices)} leaking example(s) from {name}")
    return splits, summary


def smoke_pass(ctx, folder, tokenizer, encoded: dict, labels: list[str], causal: bool) -> dict:
    """One batch per split through the real collator, forward and loss: wiring errors show now, not after
    hours of training. Says nothing about quality. Records the input shape the model itself received."""
    image = is_image(ctx.spec)
    model = build_model(folder, causal, labels, ctx.spec.adaptation, image).to(ctx.device)
    collate = collator(tokenizer, causal, image)
    received: dict[str, list[int]] = {}

    def record(module, args, kwargs):
        for key in ("pixel_values", "input_ids"):
            if kwargs.get(key) is not None:
                received[key] = list(kwargs[key].shape)

    model.register_forward_pre_hook(record, with_kwargs=True)
    batch_size = min(ctx.spec.training.microbatch, 8)
    results = {}
    model.eval()
    with torch.no_grad():
        for name, items in encoded.items():
            batch = collate([e.features for e in items[:batch_size]])
            loss = model(**{k: v.to(ctx.device) for k, v in batch.items()}).loss.item()
            if not math.isfinite(loss):
                raise DataError(f"data: smoke pass on the {name} split gave a non-finite loss ({loss})")
            results[name] = {"batch": len(items[:batch_size]), "loss": loss, "model_input_shape": dict(received)}
    return {
        "note": "One batch per split through the collator, forward and loss. This checks wiring only; it says "
        "nothing about quality.",
        "splits": results,
    }


def run(ctx: PhaseContext) -> dict:
    if is_image(ctx.spec):
        from entrypoint.phases import data_images

        return data_images.run(ctx)
    spec, data = ctx.spec, ctx.spec.data
    causal = is_causal(spec)
    key_fields = ("prompt", "response") if causal else ("text",)
    sources = {"all": data.source} if data.source else {name: getattr(data.files, name) for name in SPLITS}
    parts, read, touched, duplicates, source_hashes = {}, {}, Counter(), 0, {}
    for name, location in sources.items():
        field = "data.source" if name == "all" else f"data.files.{name}"
        raw = read_source(location, spec.store, field)
        source_hashes[location] = hashlib.sha256(raw.data).hexdigest()
        rows = rows_from_jsonl(raw, data, causal)
        read[name] = len(rows)
        rows, counts = apply_rules(rows, key_fields, data.clean)
        touched.update(counts)
        rows, dropped = _dedupe(rows, key_fields, field)
        duplicates += dropped
        parts[name] = rows
    if data.source:
        splits = split_rows(parts["all"], data.split.eval, data.split.test, data.split.seed)
    else:
        splits = parts
    check_categories(splits, data.labels)
    splits, leaks = _handle_leaks(ctx, splits)
    labels = check_categories(splits, data.labels)

    folder = resolve_model_dir(spec.model)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(folder), causal)
    recipe = {
        "split": SPLIT_VERSION if data.source else "given",
        "rules": rule_ids(data.clean),
        "preprocess": PREPROCESS_VERSION,
        "tokenizer_sha256": tokenizer_sha256(folder),
        "task": "causal_lm" if causal else "classification",
        **({"template": data.template} if causal else {}),
    }
    version = data_version(splits, recipe)
    check_seal(ctx, hashlib.sha256(to_jsonl(splits["test"])).hexdigest())  # before any compute is spent
    for name, rows in splits.items():
        ctx.store.put_bytes(f"phases/data/{name}.jsonl", to_jsonl(rows))

    encoded = {name: encode_rows(tokenizer, rows, spec, labels) for name, rows in splits.items()}
    stats = {name: length_stats(items, spec.model.max_length) for name, items in encoded.items()}
    records = build_inspection(
        tokenizer, splits["train"], encoded["train"], data.inspect_per_category, causal, spec.model.max_length, labels
    )
    smoke = smoke_pass(ctx, folder, tokenizer, encoded, labels, causal)
    ctx.store.put_bytes("phases/data/inspection.json", dumps({"examples": records, "lengths": stats, "smoke": smoke}))
    ctx.store.put_bytes("phases/data/inspection.md", to_markdown(records, stats, causal, smoke).encode())

    counts = {name: dict(sorted(Counter(r["label"] for r in rows).items())) for name, rows in splits.items()}
    ctx.log(f"data: {sum(read.values())} rows read, {duplicates} exact duplicates dropped, {len(labels)} categories")
    for name, rows in splits.items():
        ctx.log(f"data:   {name:<5} {len(rows):>6} examples, {stats[name]['truncated']} truncated")
    ctx.log(f"data: version {version[:16]}; inspection at {ctx.store.uri}/phases/data/inspection.md")
    return {
        "sources": source_hashes,
        "rows_read": read,
        "cleaning": dict(touched),
        "exact_duplicates_dropped": duplicates,
        "labels": labels,
        "counts": counts,
        "split": {"method": recipe["split"], "eval": data.split.eval, "test": data.split.test, "seed": data.split.seed},
        "leaks": {"counts": leaks["counts"], "dropped": leaks["dropped"], "method": leaks["method"]},
        "lengths": stats,
        "smoke": smoke["splits"],
        "recipe": recipe,
        "data_version": version,
    }
