"""Text examples for the text kinds (classifier, causal LM): the spec's sources (JSONL, Parquet, saved
datasets) read, cleaned and exactly de-duplicated, and the leak check between splits on their text. Each
kind says which fields it reads (`wanted`) and which of them identify an example (`key_fields`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from entrypoint.data.cleaning import apply_rules, rule_ids
from entrypoint.data.encoding import PREPROCESS_VERSION, processor_sha256
from entrypoint.data.inspection import build_inspection, length_stats, packed_row, to_markdown
from entrypoint.data.leaks import LEAKCHECK_VERSION, find_leaks
from entrypoint.data.normalize import NORMALIZE_VERSION, normalize_text
from entrypoint.data.packing import pack
from entrypoint.data.reading import DataError, RawFile, open_source, rows_from_file
from entrypoint.data.split import SPLIT_VERSION, SPLITS
from entrypoint.kinds import DataParts, Leaks
from jobspec.schema import JobSpec

__all__ = ["dedupe", "read_text_parts", "text_inspection", "text_leaks", "text_recipe"]


def dedupe(rows: list[dict], key_fields: Sequence[str], where: str, labelled: bool) -> tuple[list[dict], int]:
    """Drop rows whose `key_fields` are the same text after `normalize_text` (case, Unicode form,
    whitespace, punctuation at word edges: what the leak check calls the same), keeping the first. For
    `labelled` data the same text under two labels is an error (the data contradicts itself); otherwise
    the label is only a group and the first row stands."""
    seen: dict[bytes, dict] = {}  # a 16-byte digest of the normalised fields, not the texts themselves
    for row in rows:
        key = hashlib.blake2b("\0".join(normalize_text(row[f]) for f in key_fields).encode(), digest_size=16).digest()
        first = seen.setdefault(key, row)
        if labelled and first["label"] != row["label"]:
            also = "" if row[key_fields[0]] == first[key_fields[0]] else f" (also as {row[key_fields[0]][:60]!r})"
            raise DataError(
                f"{where}: the text {first[key_fields[0]][:60]!r}{also} appears with labels {first['label']!r} "
                f"and {row['label']!r}; texts that differ only in case, whitespace or punctuation at word "
                "edges are the same text; fix the label"
            )
    return list(seen.values()), len(rows) - len(seen)


def read_text_parts(
    spec: JobSpec,
    wanted: Mapping[str, str],
    key_fields: Sequence[str],
    group_field: str | None = None,
    parse: Callable[[RawFile], list[dict]] | None = None,
    clean: Callable[[list[dict]], tuple[list[dict], dict]] | None = None,
) -> DataParts:
    """Every source of `spec.data` (one `source`, or `files` per split) read, cleaned and de-duplicated.
    `parse` and `clean` replace the field reader and the per-field cleaning (chat rows: data/chat.py)."""
    data = spec.data
    sources = {"all": data.source} if data.source else {name: getattr(data.files, name) for name in SPLITS}
    parts, read, touched, duplicates, hashes = {}, {}, Counter(), 0, {}
    for name, location in sources.items():
        field = "data.source" if name == "all" else f"data.files.{name}"
        with open_source(location, spec.store, field) as raw:
            hashes[location] = raw.sha256
            rows = parse(raw) if parse else rows_from_file(raw, wanted, data.labels, group_field)
        read[name] = len(rows)
        rows, counts = clean(rows) if clean else apply_rules(rows, tuple(key_fields), data.clean)
        touched.update(counts)
        rows, dropped = dedupe(rows, key_fields, field, labelled=group_field is None)
        duplicates += dropped
        parts[name] = rows
    return DataParts(parts, read, duplicates, {"sources": hashes, "cleaning": dict(touched)})


def text_leaks(
    splits: dict[str, list[dict]], pairs: list[tuple[str, str]], threshold: float, text: Callable[[dict], str]
) -> Leaks:
    """Exact and MinHash near duplicates between `pairs` of splits, on `text(row)`."""
    texts = {name: [text(r) for r in rows] for name, rows in splits.items()}
    return Leaks(find_leaks(texts, pairs, threshold=threshold), texts, LEAKCHECK_VERSION, threshold)


def text_inspection(
    kind, processor, splits: dict[str, list[dict]], labels: list[str], encoded: dict | None = None
) -> tuple[dict, str, dict]:
    """The text kinds' inspection: examples per category as the trainer sees them, and lengths per split
    (`encoded`: the splits as the data phase encoded them; encoded here when None)."""
    spec = kind.spec
    if encoded is None:
        encoded = {name: kind.encode(processor, rows, labels) for name, rows in splits.items()}
    stats = {name: length_stats(items, spec.model.max_length) for name, items in encoded.items()}
    records = build_inspection(
        processor, splits["train"], encoded["train"], spec.data.inspect_per_category, spec.model.max_length, labels
    )
    inspection, markdown = {"examples": records, "lengths": stats}, to_markdown(records, stats)
    if spec.training.packing:
        rows = pack([e.features for e in encoded["train"]], spec.model.max_length)
        inspection["packing"], shown = packed_row(processor, rows, spec.model.max_length)
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
