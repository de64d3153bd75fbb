"""Data phase: prove that train, eval and the sealed test split are what the user thinks, before any
compute is spent on them. The same recipe for every kind of job; the kind reads, finds leaks and inspects.

    read (every row or file checked, cleaned, exact duplicates dropped) -> split (stratified, seeded) or
    take the given files -> check categories per split -> leak check between splits (fail | drop | warn)
    -> refuse a test split another job opened -> commit the splits -> version -> inspection (examples as
    the trainer sees them) -> smoke pass (one batch per split through the real model: forward + loss)

Commits `phases/data/{train,eval,test}.jsonl` (canonical rows), `leaks.json` and `inspection.{json,md}`
before its result, so every later phase, on any node, uses exactly these bytes.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from entrypoint.context import PhaseContext
from entrypoint.data.inspection import chat_markdown, smoke_markdown, untrainable_markdown
from entrypoint.data.leak_policy import apply_leak_policy, checked_pairs, refuse_failing
from entrypoint.data.packing import step_rows, to_device
from entrypoint.data.parts import DataParts
from entrypoint.data.reading import DataError
from entrypoint.data.split import check_categories, data_version, split_rows
from entrypoint.data.spool import Mapped, chunked, labels_of
from entrypoint.data.tokens import (
    TOKENS_FORMAT,
    TokenizedSplit,
    encoder_pool,
    tokenize,
    tokenize_processes,
    tokens_key,
    tokens_store_key,
    write_tokens,
)
from entrypoint.evaluation.seal import check_seal
from entrypoint.job import layout
from entrypoint.job.state import to_jsonl
from entrypoint.kinds import encoder_for

__all__ = ["run", "smoke_pass", "write_jsonl"]


def run(ctx: PhaseContext) -> dict:
    folder = ctx.workdir / "spool"  # rows read, and splits before upload: this phase's scratch space
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    parts = ctx.kind.data.read(folder, ctx.log)
    try:
        return _run(ctx, parts, folder)
    finally:
        for spool in parts.spools:
            spool.remove()
        shutil.rmtree(folder, ignore_errors=True)


def _run(ctx: PhaseContext, parts: DataParts, folder: Path) -> dict:
    data, kind, side = ctx.spec.data, ctx.kind, ctx.kind.data
    if data.source:
        splits = split_rows(parts.rows["all"], data.split.eval, data.split.test, data.split.seed, side.identity)
    else:
        splits = parts.rows
    check_categories(splits, data.labels)

    leaks = side.find_leaks(splits, checked_pairs())
    splits, summary = apply_leak_policy(
        data.leaks, splits, leaks.found, leaks.shown, leaks.method, leaks.threshold, ctx.log
    )
    ctx.write_json(layout.DATA_LEAKS, summary)
    refuse_failing(summary)
    labels = check_categories(splits, data.labels)

    canonical = side.commit_splits(ctx.store, splits)
    written = {name: write_jsonl(rows, folder / f"split-{name}.jsonl") for name, rows in canonical.items()}
    check_seal(ctx, written["test"])  # before any compute is spent
    for name, sha256 in written.items():
        if ctx.store.put_file(layout.data_split(name), folder / f"split-{name}.jsonl") != sha256:
            raise RuntimeError(f"data: {folder}/split-{name}.jsonl changed while it was uploaded; run the job again")

    processor = kind.model.processor(ctx.model_dir)
    recipe = side.recipe(ctx.model_dir, processor)
    version = data_version({name: Mapped(rows, side.identity) for name, rows in canonical.items()}, recipe)
    encoded, tokens = store_tokens(ctx, processor, canonical, labels, version) if kind.stores_tokens else (None, None)
    inspection, markdown, files = side.inspect(processor, splits, labels, encoded)
    smoke = smoke_pass(ctx, processor, splits, labels, encoded)
    for name, content in files.items():
        ctx.store.put_bytes(layout.data_file(name), content)
    if "chat_template_sha256" in recipe:
        markdown += chat_markdown(recipe)
    untrainable = parts.summary.get("untrainable")
    if untrainable is not None:
        inspection["untrainable"] = untrainable
        markdown += untrainable_markdown(untrainable, ctx.spec.model.max_length)
    ctx.write_json(layout.DATA_INSPECTION_JSON, {**inspection, "smoke": smoke})
    ctx.store.put_bytes(layout.DATA_INSPECTION_MD, (markdown + smoke_markdown(smoke)).encode())

    lengths = inspection.get("lengths", {})
    ctx.log(
        f"data: {sum(parts.read.values())} rows read, {parts.duplicates} exact duplicates dropped, "
        f"{len(labels)} categories"
    )
    for name, rows in splits.items():
        truncated = f", {lengths[name]['truncated']} truncated" if name in lengths else ""
        ctx.log(f"data:   {name:<5} {len(rows):>6} examples{truncated}")
    ctx.log(f"data: version {version[:16]}; inspection at {ctx.store.uri}/phases/data/inspection.md")
    return {
        **parts.summary,
        "kind": kind.name,
        "rows_read": parts.read,
        "exact_duplicates_dropped": parts.duplicates,
        "labels": labels,
        "counts": {name: dict(sorted(Counter(labels_of(rows)).items())) for name, rows in splits.items()},
        "split": {"method": recipe["split"], "eval": data.split.eval, "test": data.split.test, "seed": data.split.seed},
        "leaks": {"counts": summary["counts"], "dropped": summary["dropped"], "method": summary["method"]},
        **({"lengths": lengths} if lengths else {}),
        "smoke": smoke["splits"],
        "recipe": recipe,
        "data_version": version,
        **({"tokens": tokens} if tokens else {}),
    }


def write_jsonl(rows: Iterable[dict], path: Path) -> str:
    """`rows` written to `path` as the store keeps them (`to_jsonl`), a chunk at a time; returns the sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for chunk in chunked(rows):
            data = to_jsonl(chunk)
            out.write(data)
            digest.update(data)
    return digest.hexdigest()


def store_tokens(
    ctx: PhaseContext, processor, canonical: dict[str, Sequence[dict]], labels: list[str], version: str
) -> tuple[dict[str, TokenizedSplit], dict]:
    """Encode every split once, as training will see it, write it to an Arrow file in this node's token
    cache and commit it to the store (data/tokens.py). Returns the memory-mapped splits and the record
    later phases find them by (key, and rows, bytes and sha256 per split)."""
    key = tokens_key(version, ctx.spec.model.max_length, labels)
    folder = ctx.workdir / "tokens" / key
    folder.mkdir(parents=True, exist_ok=True)
    encoded, files = {}, {}
    processes = tokenize_processes(sum(len(rows) for rows in canonical.values()), ctx.kind.encodes_in_tokenizer)
    with encoder_pool(encoder_for, (ctx.spec, str(ctx.model_dir), labels), processes) as pool:
        if pool is not None:
            ctx.log(f"data: tokenizing in {processes} processes")
        for name, rows in canonical.items():
            path = folder / f"{name}.arrow"
            chunks = tokenize(lambda part: ctx.kind.model.encode(processor, part, labels), rows, name, ctx.log, pool)
            files[name] = write_tokens(chunks, path)
            sent = ctx.store.put_file(tokens_store_key(key, name), path)
            if sent != files[name]["sha256"]:
                raise RuntimeError(f"data: {path} changed while it was uploaded; run the job again")
            encoded[name] = TokenizedSplit(path)
    total = sum(f["bytes"] for f in files.values())
    ctx.log(f"data: tokenized once: {sum(f['rows'] for f in files.values()):,} examples, {total / 1e6:.1f} MB stored")
    return encoded, {"key": key, "format": TOKENS_FORMAT, "files": files}


def smoke_pass(
    ctx: PhaseContext, processor, splits: dict[str, Sequence[dict]], labels: list[str], encoded: dict | None = None
) -> dict:
    """One batch per split through the real collator, forward and loss: wiring errors show now, not after
    hours of training. Says nothing about quality. Records the input shape the model itself received."""
    side = ctx.kind.model
    model = side.load(ctx.model_dir, labels, ctx.spec.adaptation).to(ctx.device)
    collate = side.collator(processor)
    received: dict[str, list[int]] = {}

    def record(module, args, kwargs):
        for key in ("pixel_values", "input_ids"):
            if kwargs.get(key) is not None:
                received[key] = list(kwargs[key].shape)

    model.register_forward_pre_hook(record, with_kwargs=True)
    size = min(ctx.spec.training.microbatch, 8)
    results = {}
    model.eval()
    with torch.no_grad():
        for name, rows in splits.items():
            items = encoded[name][:size] if encoded else side.encode(processor, rows[:size], labels)
            batch = collate(step_rows(ctx.spec, [e.features for e in items]))
            loss = model(**to_device(batch, ctx.device)).loss.item()
            if not math.isfinite(loss):
                raise DataError(f"data: smoke pass on the {name} split gave a non-finite loss ({loss})")
            results[name] = {"batch": len(rows[:size]), "loss": loss, "model_input_shape": dict(received)}
    return {
        "note": "One batch per split through the collator, forward and loss. This checks wiring only; it says "
        "nothing about quality.",
        "splits": results,
    }
