"""Image data (`data.modality: image`): ImageFolder or JSONL rows, every file hashed; exact duplicates are
the same bytes; every image is decoded once (corrupt files and unexpected modes are errors naming the
file); leaks are the same bytes or perceptual hashes within `data.leaks.image_max_distance`; images are
stored content-addressed under `phases/data/images/`, so any node trains from the store alone. The data
version covers image bytes, labels, modes and transform parameters, never file names.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from entrypoint.data.bucket import BucketFiles
from entrypoint.data.encoding import PREPROCESS_VERSION, processor_sha256
from entrypoint.data.images import (
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
from entrypoint.data.parts import DataParts, Leaks
from entrypoint.data.reading import DataError
from entrypoint.data.split import SPLIT_VERSION, SPLITS
from entrypoint.job import layout
from jobspec.schema import JobSpec

__all__ = ["ImageData", "target_size"]

GRID = "inspection_grid.png"  # the data phase's picture of the transformed examples, under phases/data/


class ImageData:
    """The data side of image jobs. `model`: the model side, whose exact transform the inspection shows."""

    def __init__(self, spec: JobSpec, model):
        self.spec, self.model = spec, model
        self._decoded: dict[str, tuple] = {}  # path -> load_image(path): each file decoded once per phase

    def read(self, folder: Path, log: Callable[[str], None]) -> DataParts:
        data = self.spec.data
        sources = {"all": data.source} if data.source else {name: getattr(data.files, name) for name in SPLITS}
        parts, read, duplicates = {}, {}, 0
        bucket = BucketFiles(self.spec.store, folder / "bucket")  # images in s3://, fetched once for this phase
        for name, location in sources.items():
            rows = image_rows(location.removeprefix("file://"), data.image_field, data.label_field, bucket)
            if data.labels:
                bad = [f"{r['name']}: label {r['label']!r}" for r in rows if r["label"] not in data.labels]
                if bad:
                    raise DataError(f"{location}: labels outside data.labels: " + "; ".join(bad[:10]))
            read[name] = len(rows)
            kept, dropped = _same_bytes_once(rows, location)
            duplicates += dropped
            parts[name] = kept
        return DataParts(parts, read, duplicates)

    def find_leaks(self, splits: dict[str, list[dict]], pairs: list[tuple[str, str]]) -> Leaks:
        # Decode every image once: unreadable files and unexpected modes fail here, naming the file.
        modes = self.spec.data.image_modes
        for rows in splits.values():
            for row in rows:
                self._decoded[row["path"]] = load_image(row["path"], modes)
        hashes = {
            name: [(r["sha256"], perceptual_hash(self._decoded[r["path"]][0])) for r in rows]
            for name, rows in splits.items()
        }
        distance = self.spec.data.leaks.image_max_distance
        found = find_image_leaks(hashes, pairs, max_distance=distance)
        shown = {name: [r["name"] for r in rows] for name, rows in splits.items()}
        return Leaks(found, shown, f"{IMAGES_VERSION}/phash", distance)

    def commit_splits(self, store, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
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
        for name, rows in splits.items():
            for row, entry in zip(rows, canonical[name], strict=True):
                key = layout.data_image(entry["image"])
                if store.head(key) is None:  # content-addressed: the same image is stored once
                    store.put_file(key, Path(row["path"]))
        return canonical

    def identity(self, row: dict) -> dict:
        return {"sha256": row["sha256"], "label": row["label"]}  # the same image anywhere, under any name

    def recipe(self, folder: Path, processor) -> dict:
        data = self.spec.data
        return {
            "modality": "image",
            "split": f"{SPLIT_VERSION}-by-content" if data.source else "given",  # ordered by identity()
            "images": IMAGES_VERSION,
            "image_modes": list(data.image_modes),
            "preprocess": PREPROCESS_VERSION,
            "transform": transform_summary(processor),
            "processor_sha256": processor_sha256(folder),
        }

    def inspect(self, processor, splits: dict[str, list[dict]], labels: list[str], encoded) -> tuple[dict, str, dict]:
        """What the files are, and what the model receives after the exact transform: per category sizes,
        modes, the share resized and converted, shape and range after the transform, and a PNG grid."""
        data = self.spec.data
        size = target_size(processor)
        every_row = [r for rows in splits.values() for r in rows]
        categories = inspect_images(every_row, [self._decode(r["path"]) for r in every_row], size)
        per_category = defaultdict(list)
        for row in splits["train"]:
            if len(per_category[row["label"]]) < data.inspect_per_category:
                per_category[row["label"]].append(row)
        mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
        examples, grid, transformed = [], {}, {}
        for label in labels:
            encoded = self.model.encode(processor, per_category[label], labels)
            pixels = [e.features["pixel_values"] for e in encoded]
            examples += [{"label": label, "name": r["name"], "sha256": r["sha256"]} for r in per_category[label]]
            transformed[label] = {
                "shape": list(pixels[0].shape),
                "min": float(min(p.min() for p in pixels)),
                "max": float(max(p.max() for p in pixels)),
            }
            grid[label] = [denormalize(p, mean or [0.0] * 3, std or [1.0] * 3) for p in pixels]
        inspection = {
            "transform": transform_summary(processor),
            "target_size": list(size),
            "categories": categories,
            "after_transform": transformed,
            "examples": examples,
            "grid": f"{layout.data_file(GRID)} (one row per category, transformed examples, denormalised)",
        }
        return inspection, _markdown(inspection), {GRID: grid_png(grid)}

    def fetch(self, store, rows: list[dict], workdir: Path) -> list[dict]:
        """Rows with "path": each image downloaded into the work dir (its sha256 checked), so that any node
        trains from the store alone."""
        folder = workdir / "images"
        folder.mkdir(parents=True, exist_ok=True)
        for row in rows:
            local = folder / row["image"]
            if not local.is_file():
                data = store.get_bytes(layout.data_image(row["image"]))
                if hashlib.sha256(data).hexdigest() != row["sha256"]:
                    raise ValueError(f"{layout.data_image(row['image'])}: content does not match its sha256")
                # a unique temp name: the ranks of a torchrun job share this folder
                handle, partial = tempfile.mkstemp(dir=folder, suffix=".partial")
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                os.replace(partial, local)
            row["path"] = str(local)
        return rows

    def _decode(self, path: str) -> tuple:
        if path not in self._decoded:
            self._decoded[path] = load_image(path, self.spec.data.image_modes)
        return self._decoded[path]


def _same_bytes_once(rows: list[dict], location: str) -> tuple[list[dict], int]:
    """Drop exact duplicates (same sha256); the same image under two labels is an error."""
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
    return kept, len(rows) - len(kept)


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
