"""Text examples for the text kinds (classifier, causal LM): the spec's sources (JSONL, Parquet, saved
datasets) read, cleaned and exactly de-duplicated, and the leak check between splits on their text. Each
kind says which fields it reads (`wanted`) and which of them identify an example (`key_fields`)."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from entrypoint.data.cleaning import apply_rules, rule_ids
from entrypoint.data.encoding import PREPROCESS_VERSION, processor_sha256
from entrypoint.data.inspection import build_inspection, length_stats, packed_row, to_markdown
from entrypoint.data.leaks import LEAKCHECK_VERSION, find_leaks
from entrypoint.data.normalize import NORMALIZE_VERSION, normalize_text
from entrypoint.data.parts import DataParts, Leaks
from entrypoint.data.reading import WHERE, DataError, RawFile, open_source, refuse, row_byte_limit, text_rows
from entrypoint.data.split import SPLIT_VERSION, SPLITS, sort_digests
from entrypoint.data.spool import Mapped, Spool, SpooledRows, chunked
from entrypoint.data.tokens import features_of, token_counts
from jobspec.schema import JobSpec

__all__ = ["dedupe", "dedupe_key", "read_text_parts", "text_inspection", "text_leaks", "text_recipe"]


def dedupe_key(row: dict, key_fields: Sequence[str]) -> bytes:
    """What makes two rows the same example: a 16-byte digest of their `key_fields` after `normalize_text`
    (case, Unicode form, whitespace, punctuation at word edges: what the leak check calls the same)."""
    return hashlib.blake2b("\0".join(normalize_text(row[f]) for f in key_fields).encode(), digest_size=16).digest()


def dedupe(rows: SpooledRows, key_fields: Sequence[str], where: str, labelled: bool) -> tuple[SpooledRows, int]:
    """Drop rows whose de-duplication keys are equal, keeping the first. For `labelled` data the same text
    under two labels is an error (the data contradicts itself), raised for the first such row in reading
    order; otherwise the label is only a group and the first row stands. Compares the spooled 16-byte keys,
    never the texts."""
    keys = rows.keys
    if not len(keys):
        return rows, 0
    order = sort_digests(keys)  # stable: within a group of equal keys, reading order
    ordered = keys[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    leader = order[np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]  # each row's first
    if labelled:
        codes = rows.spool.codes[rows.indices]
        clashing = order[codes[order] != codes[leader]]
        if len(clashing):
            i = int(clashing.min())
            first, row = rows[int(leader[np.nonzero(order == i)[0][0]])], rows[i]
            also = "" if row[key_fields[0]] == first[key_fields[0]] else f" (also as {row[key_fields[0]][:60]!r})"
            raise DataError(
                f"{where}: the text {first[key_fields[0]][:60]!r}{also} appears with labels {first['label']!r} "
                f"and {row['label']!r}; texts that differ only in case, whitespace or punctuation at word "
                "edges are the same text; fix the label"
            )
    kept = np.sort(order[starts])
    return rows.take(kept), len(rows) - len(kept)


def read_text_parts(
    spec: JobSpec,
    folder: Path,
    log: Callable[[str], None],
    wanted: Mapping[str, str],
    key_fields: Sequence[str],
    group_field: str | None = None,
    parse: Callable[[RawFile, list[str]], Iterator[dict]] | None = None,
    clean: Callable[[list[dict]], tuple[list[dict], dict]] | None = None,
    trains: Callable[[dict], bool] | None = None,
) -> DataParts:
    """Every source of `spec.data` (one `source`, or `files` per split) read a chunk at a time, cleaned,
    spooled to `folder` (data/spool.py) and de-duplicated. `parse` and `clean` replace the field reader and
    the per-field cleaning (chat rows: data/chat.py); `clean` sees a bounded chunk of rows at a time. A row
    for which `trains` says False (nothing to learn within model.max_length) is dropped, counted and the
    first one named, or with data.truncation: fail refused, each named."""
    data = spec.data
    sources = {"all": data.source} if data.source else {name: getattr(data.files, name) for name in SPLITS}
    parts = DataParts({}, {}, 0, {"sources": {}, "cleaning": Counter()})
    untrainable = {"rows": 0, "first": None}  # rows that train on nothing: how many, where the first was
    try:
        for name, location in sources.items():
            field = "data.source" if name == "all" else f"data.files.{name}"
            spool = Spool(folder / f"{name}.jsonl")
            parts.spools.append(spool)
            with open_source(location, spec.store, field) as raw:
                parts.summary["sources"][location] = raw.sha256
                raw = replace(raw, max_row_bytes=row_byte_limit(spec.model.max_length))
                errors: list[str] = []
                rows = (
                    parse(raw, errors)
                    if parse
                    else text_rows(raw, wanted, data.labels, group_field, errors, data.cluster_field)
                )
                parts.read[name] = 0
                started = last = time.monotonic()
                for chunk in chunked(rows):
                    parts.read[name] += len(chunk)
                    chunk, counts = clean(chunk) if clean else apply_rules(chunk, tuple(key_fields), data.clean)
                    parts.summary["cleaning"].update(counts)
                    for row in chunk:
                        where = row.pop(WHERE, "?")
                        try:
                            kept = trains is None or _trains(trains, row, where, untrainable, log)
                        except DataError as exc:  # a chat template that refuses the conversation
                            errors.append(f"{where}: {exc}")
                            continue
                        if not kept:
                            if data.truncation == "fail":
                                errors.append(f"{where}: {_NOTHING_TO_TRAIN} (data.truncation: fail)")
                            continue
                        spool.add(row, dedupe_key(row, key_fields))
                    if time.monotonic() - last > 5:
                        last, done = time.monotonic(), parts.read[name]
                        log(f"data: read {done:,} rows of {raw.name} ({done / (last - started):,.0f} rows/s)")
                refuse(errors)
            parts.rows[name], dropped = dedupe(spool.close(), key_fields, field, labelled=group_field is None)
            parts.duplicates += dropped
    except BaseException:
        for spool in parts.spools:
            spool.remove()
        raise
    parts.summary["cleaning"] = dict(parts.summary["cleaning"])
    if trains is not None:
        dropped, first = untrainable["rows"], untrainable["first"]
        parts.summary["untrainable"] = {"policy": data.truncation, "dropped": dropped, "first": first}
        if dropped:
            rows = "1 row" if dropped == 1 else f"{dropped} rows"
            log(f"data: {rows} dropped: {_NOTHING_TO_TRAIN} (the first: {first}; data.truncation: drop)")
    return parts


_NOTHING_TO_TRAIN = "every token that counts in the loss lies past model.max_length"
SLOW_ROW_S = 3.0  # a row that takes longer than this to check is named in the log


def _trains(trains: Callable[[dict], bool], row: dict, where: str, untrainable: dict, log) -> bool:
    started = time.monotonic()
    kept = trains(row)
    took = time.monotonic() - started
    if took > SLOW_ROW_S:
        log(f"data: {where} took {took:.1f} s to check against model.max_length")
    if not kept:
        untrainable["rows"] += 1
        untrainable["first"] = untrainable["first"] or where
    return kept


def text_leaks(
    splits: dict[str, Sequence[dict]], pairs: list[tuple[str, str]], threshold: float, text: Callable[[dict], str]
) -> Leaks:
    """Exact and MinHash near duplicates between `pairs` of splits, on `text(row)` (computed when the check
    reads a row, never held for a whole split)."""
    texts = {name: Mapped(rows, text) for name, rows in splits.items()}
    return Leaks(find_leaks(texts, pairs, threshold=threshold), texts, LEAKCHECK_VERSION, threshold)


def text_inspection(
    spec: JobSpec,
    encode: Callable[[Sequence[dict]], list],
    processor,
    splits: dict[str, list[dict]],
    labels: list[str],
    encoded: dict | None = None,
) -> tuple[dict, str, dict]:
    """The text kinds' inspection: examples per category as the trainer sees them, and lengths per split
    (`encoded`: the splits as the data phase encoded them; `encode`d here when None)."""
    if encoded is None:
        encoded = {name: encode(rows) for name, rows in splits.items()}
    stats = {name: length_stats(items, spec.model.max_length) for name, items in encoded.items()}
    records = build_inspection(
        processor, splits["train"], encoded["train"], spec.data.inspect_per_category, spec.model.max_length, labels
    )
    inspection, markdown = {"examples": records, "lengths": stats}, to_markdown(records, stats)
    if spec.training.packing:
        train = encoded["train"]
        lengths = token_counts(train)
        inspection["packing"], shown = packed_row(processor, features_of(train), lengths, spec.model.max_length)
        markdown += shown
    return inspection, markdown, {}


def text_recipe(spec: JobSpec, folder: Path, task: str) -> dict:
    """What besides the examples decides what a text kind trains on: split method, cleaning rules,
    preprocessing version and the tokenizer's files."""
    return {
        "split": SPLIT_VERSION if spec.data.source else "given",
        "rules": rule_ids(spec.data.clean),
        "preprocess": PREPROCESS_VERSION,
        "same_text": NORMALIZE_VERSION,
        "tokenizer_sha256": processor_sha256(folder),
        "task": task,
    }
