"""Data phase for images (`data.modality: image`): the same protocol as text, with checks that look at pixels.

read (ImageFolder or JSONL; every file hashed) -> drop exact duplicates (same bytes) -> split (stratified,
seeded) or take the given ones -> decode every image (corrupt files and unexpected modes are errors
naming the file) -> leak check between splits (same bytes, or perceptual hashes within
data.leaks.image_max_distance; fail | drop | warn) -> store every image content-addressed under
phases/data/images/, so any node trains from the store alone -> version (image sha256s, labels,
modes, transform parameters) -> inspection per category (original sizes and modes, the share resized
and converted, shape and value range after the exact transform the trainer uses, a PNG grid of
transformed examples per category) -> smoke pass (one batch per split, forward + loss)
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from pathlib import Path

from entrypoint.context import PhaseContext, dumps, to_jsonl
from entrypoint.dataio import DataError
from entrypoint.images import (
    IMAGES_VERSION,
    denormalize,
    find_image_leaks,
    grid_png,
    image_rows,
    inspect_images,
    load_image,
    perceptual_hash,
    transform_summary,
)
from entrypoint.model import resolve_model_dir
from entrypoint.phases.data import (
    LEAK_PAIRS,
    SPLIT_VERSION,
    SPLITS,
    apply_leak_policy,
    check_categories,
    data_version,
    smoke_pass,
    split_rows,
)
from entrypoint.phases.test import check_seal
from entrypoint.preprocess import PREPROCESS_VERSION, encode_image, load_processor, tokenizer_sha256

__all__ = ["run", "target_size"]


def _width_height(size) -> tuple[int, int] | None:
    """(width, height) from an int, a dict or a SizeDict; shortest_edge counts for both."""
    if size is None:
        return None
    if isinstance(size, int):
        return size, size
    get = size.get if isinstance(size, dict) else lambda key: getattr(size, key, None)
    if get("height") and get("width"):
        return int(get("width")), int(get("height"))
    if get("shortest_edge"):
        return int(get("shortest_edge")), int(get("shortest_edge"))
    return None


def target_size(processor) -> tuple[int, int]:
    """(width, height) of the pixels the model receives, from the processor's crop or resize settings."""
    if getattr(processor, "do_center_crop", False) and _width_height(getattr(processor, "crop_size", None)):
        return _width_height(processor.crop_size)
    size = _width_height(getattr(processor, "size", None))
    if size is None:
        raise DataError(f"model: cannot tell the image size from {type(processor).__name__}'s settings")
    return size


def _read(ctx: PhaseContext) -> tuple[dict[str, list[dict]], dict, int]:
    data = ctx.spec.data
    sources = {"all": data.source} if data.source else {name: getattr(data.files, name) for name in SPLITS}
    parts, read, duplicates = {}, {}, 0
    for name, location in sources.items():
        rows = image_rows(location.removeprefix("file://"), data.image_field, data.label_field)
        if data.labels:
            bad = [f"{r['name']}: label {r['label']!r}" for r in rows if r["label"] not in data.labels]
            if bad:
                raise DataError(f"{location}: labels outside data.labels: " + "; ".join(bad[:10]))
        read[name] = len(rows)
        seen, kept, conflicts = {}, [], []
        for row in rows:
            first = seen.get(row["sha256"])
            if first is None:
                seen[row["sha256"]] = row
                kept.append(row)
            elif first["label"] != row["label"]:
                conflicts.append(f"{first['name']} ({first['label']}) = {row['name']} ({row['label']})")
        if conflicts:
            raise DataError(f"{location}: the same image under two labels: " + "; ".join(conflicts[:10]))
        duplicates += len(rows) - len(kept)
        parts[name] = kept
    return parts, read, duplicates


def run(ctx: PhaseContext) -> dict:
    spec, data = ctx.spec, ctx.spec.data
    parts, read, duplicates = _read(ctx)
    if data.source:
        splits = split_rows(parts["all"], data.split.eval, data.split.test, data.split.seed)
    else:
        splits = parts
    check_categories(splits, data.labels)

    # Decode every image once: unreadable files and unexpected modes fail here, naming the file.
    decoded = {name: [load_image(r["path"], data.image_modes) for r in rows] for name, rows in splits.items()}
    hashes = {
        name: [(r["sha256"], perceptual_hash(img)) for r, (img, _, _) in zip(rows, decoded[name], strict=True)]
        for name, rows in splits.items()
    }
    pairs = [(dropped, kept) for kept, dropped, _ in LEAK_PAIRS]
    distance = data.leaks.image_max_distance
    found = find_image_leaks(hashes, pairs, max_distance=distance)
    shown = {name: [r["name"] for r in rows] for name, rows in splits.items()}
    by_path = {r["path"]: d for name, rows in splits.items() for r, d in zip(rows, decoded[name], strict=True)}
    splits, leaks = apply_leak_policy(ctx, splits, found, shown, f"{IMAGES_VERSION}/phash", distance)
    decoded = {name: [by_path[r["path"]] for r in rows] for name, rows in splits.items()}
    labels = check_categories(splits, data.labels)

    canonical = {
        name: [
            {
                "image": r["sha256"] + Path(r["path"]).suffix.lower(),
                "sha256": r["sha256"],
                "label": r["label"],
                "name": r["name"],
            }
            for r in rows
        ]
        for name, rows in splits.items()
    }
    check_seal(ctx, hashlib.sha256(to_jsonl(canonical["test"])).hexdigest())  # before any compute is spent
    for name, rows in splits.items():
        for row, entry in zip(rows, canonical[name], strict=True):
            key = f"phases/data/images/{entry['image']}"
            if ctx.store.head(key) is None:  # content-addressed: the same image is stored once
                ctx.store.put_file(key, Path(row["path"]))
        ctx.store.put_bytes(f"phases/data/{name}.jsonl", to_jsonl(canonical[name]))

    folder = resolve_model_dir(spec.model)
    processor = load_processor(folder, spec)
    transform = transform_summary(processor)
    recipe = {
        "modality": "image",
        "split": SPLIT_VERSION if data.source else "given",
        "images": IMAGES_VERSION,
        "image_modes": list(data.image_modes),
        "preprocess": PREPROCESS_VERSION,
        "transform": transform,
        "processor_sha256": tokenizer_sha256(folder),
    }
    content = {n: [{"sha256": r["sha256"], "label": r["label"]} for r in rows] for n, rows in canonical.items()}
    version = data_version(content, recipe)  # image bytes and labels, not file names or folders

    # Inspection: what the files are, and what the model receives after the exact transform.
    size = target_size(processor)
    every_row = [r for rows in splits.values() for r in rows]
    every_image = [d for name in splits for d in decoded[name]]
    categories = inspect_images(every_row, every_image, size)
    per_category = defaultdict(list)
    for row in splits["train"]:
        if len(per_category[row["label"]]) < data.inspect_per_category:
            per_category[row["label"]].append(row)
    index = {label: i for i, label in enumerate(labels)}
    examples, grid, transformed = [], {}, {}
    mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
    for label in labels:
        pixels_list = []
        for row in per_category[label]:
            pixels = encode_image(processor, row["path"], index[label], data.image_modes).features["pixel_values"]
            pixels_list.append(pixels)
            examples.append({"label": label, "name": row["name"], "sha256": row["sha256"]})
        stacked = pixels_list
        transformed[label] = {
            "shape": list(stacked[0].shape),
            "min": float(min(p.min() for p in stacked)),
            "max": float(max(p.max() for p in stacked)),
        }
        grid[label] = [denormalize(p, mean or [0.0] * 3, std or [1.0] * 3) for p in stacked]
    ctx.store.put_bytes("phases/data/inspection_grid.png", grid_png(grid))

    encoded = {
        name: [encode_image(processor, r["path"], index[r["label"]], data.image_modes) for r in rows[:8]]
        for name, rows in splits.items()
    }
    smoke = smoke_pass(ctx, folder, processor, encoded, labels, False)
    inspection = {
        "transform": transform,
        "target_size": list(size),
        "categories": categories,
        "after_transform": transformed,
        "examples": examples,
        "grid": "phases/data/inspection_grid.png (one row per category, transformed examples, denormalised)",
        "smoke": smoke,
    }
    ctx.store.put_bytes("phases/data/inspection.json", dumps(inspection))
    ctx.store.put_bytes("phases/data/inspection.md", _markdown(inspection).encode())

    counts = {name: dict(sorted(Counter(r["label"] for r in rows).items())) for name, rows in splits.items()}
    ctx.log(f"data: {sum(read.values())} images read, {duplicates} exact duplicates dropped, {len(labels)} categories")
    for name, rows in splits.items():
        ctx.log(f"data:   {name:<5} {len(rows):>6} images")
    ctx.log(f"data: version {version[:16]}; inspection and grid at {ctx.store.uri}/phases/data/")
    return {
        "modality": "image",
        "rows_read": read,
        "exact_duplicates_dropped": duplicates,
        "labels": labels,
        "counts": counts,
        "split": {"method": recipe["split"], "eval": data.split.eval, "test": data.split.test, "seed": data.split.seed},
        "leaks": {"counts": leaks["counts"], "dropped": leaks["dropped"], "method": leaks["method"]},
        "smoke": smoke["splits"],
        "recipe": recipe,
        "data_version": version,
    }


def _markdown(inspection: dict) -> str:
    lines = ["# Image data inspection", "", f"Transform: `{inspection['transform']}`", ""]
    lines.append(f"The model receives pixels of {inspection['target_size'][0]}x{inspection['target_size'][1]}.")
    lines += ["", "| category | images | modes | most common sizes | resized | converted | shape after | range after |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for label, stats in inspection["categories"].items():
        after = inspection["after_transform"].get(label, {})
        lines.append(
            f"| {label} | {stats['count']} | {stats['modes']} | {stats['sizes']} | {stats['resized_share']:.0%} | "
            f"{stats['converted_share']:.0%} | {after.get('shape')} | "
            f"{after.get('min', 0):.2f}..{after.get('max', 0):.2f} |"
        )
    lines += ["", "![transformed examples per category](inspection_grid.png)", ""]
    return "\n".join(lines)
