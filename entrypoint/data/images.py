"""Image data: listing, decoding, perceptual hashing, split leaks, and what the model will see.

- `image_rows` lists an ImageFolder tree or a JSONL of `{image, label}` rows, every problem in one DataError.
- `load_image` fully decodes a file to `(rgb_image, original_mode, original_size)`; a corrupt file or a mode
  outside `allowed_modes` is a DataError naming the file. No EXIF rotation, as in transformers' loaders.
- `perceptual_hash` is imagehash's 64-bit pHash as an int (`int(str(phash(img)), 16)`); `find_image_leaks`
  compares them across splits with numpy. `IMAGES_VERSION` goes into reports; bump it when either changes.
- `transform_summary`, `inspect_images`, `grid_png` and `denormalize` describe the pixels; none changes data.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from entrypoint.data.bucket import BucketFiles, is_uri, join_uri
from entrypoint.data.leaks import LeakPair
from entrypoint.data.reading import DataError, RawFile, a_type, json_objects, refuse
from jobspec.schema import IMAGE_SUFFIXES

if TYPE_CHECKING:
    from PIL import Image

__all__ = [
    "IMAGES_VERSION",
    "IMAGE_SUFFIXES",
    "denormalize",
    "find_image_leaks",
    "grid_png",
    "image_rows",
    "inspect_images",
    "load_image",
    "perceptual_hash",
    "transform_summary",
]

IMAGES_VERSION = "images-1"

_BLOCK_ELEMENTS = 1 << 22  # XOR block of the leak search: 32 MiB of uint64 per block
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_HAS_BITWISE_COUNT = hasattr(np, "bitwise_count")  # numpy >= 2.0
_TRANSFORM_KEYS = ("size", "crop_size", "do_resize", "do_center_crop", "do_rescale", "rescale_factor", "do_normalize")
_TRANSFORM_KEYS += ("image_mean", "image_std", "resample", "do_convert_rgb")
_TOP_SIZES = 5


def image_rows(
    location: str | Path, image_field: str = "image", label_field: str = "label", bucket: BucketFiles | None = None
) -> list[dict]:
    """Rows `{"path": absolute str, "name": str, "label": str, "sha256": hex}` sorted by (label, name).

    Folder (ImageFolder): each non-hidden subfolder is a label; files with an `IMAGE_SUFFIXES` suffix (any
    case) at any depth below it are its images, `name` being the posix path relative to the folder. Hidden
    entries and other files are ignored. A `.jsonl` holds `{image_field: path, label_field: label}` rows;
    relative paths resolve against its folder and `name` is the path as written. In a bucket (`bucket`
    fetches them): an `s3://bucket/prefix` ImageFolder, an `s3://.../rows.jsonl` (relative image paths
    resolve against its prefix), and `s3://` image paths in any JSONL, each image downloaded once. Raises
    DataError (up to 20 lines, each naming the file and line) for: location missing or not a folder/.jsonl;
    no label subfolders or no images; invalid JSON, a missing/empty/non-string field, or an image file (or
    object) that does not exist.
    """
    location = str(location)
    if is_uri(location) and bucket is None:
        raise DataError(f"{location}: images in a bucket are read by the data phase (no bucket access given)")
    if is_uri(location) and location.lower().endswith(".jsonl"):
        local = bucket.file(location)
        if local is None:
            raise DataError(f"{location}: no such object")
        rows = _jsonl_rows(local, image_field, label_field, bucket, shown=location)
    elif is_uri(location):
        rows = _folder_rows(bucket.prefix(location))
    else:
        root = Path(location)
        if not root.exists():
            raise DataError(f"{location}: not found (resolved from {Path.cwd()})")
        if not root.is_dir() and root.suffix.lower() != ".jsonl":
            raise DataError(
                f"{location}: expected a folder in ImageFolder layout (<folder>/<label>/<image>) or a .jsonl"
            )
        rows = _folder_rows(root) if root.is_dir() else _jsonl_rows(root, image_field, label_field, bucket)
    rows.sort(key=lambda r: (r["label"], r["name"]))
    for row in rows:
        row["sha256"] = hashlib.sha256(Path(row["path"]).read_bytes()).hexdigest()
    return rows


def _folder_rows(root: Path) -> list[dict]:
    labels = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not labels:
        raise DataError(f"{root}: no label subfolders; expected ImageFolder layout <folder>/<label>/<image>")
    rows = []
    for label_dir in labels:
        for path in label_dir.rglob("*"):
            rel = path.relative_to(root)
            if any(part.startswith(".") for part in rel.parts) or path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            if path.is_file():
                rows.append({"path": str(path.resolve()), "name": rel.as_posix(), "label": label_dir.name})
    if not rows:
        raise DataError(f"{root}: no images ({', '.join(IMAGE_SUFFIXES)}) in {len(labels)} label folder(s)")
    return rows


def _jsonl_rows(
    path: Path, image_field: str, label_field: str, bucket: BucketFiles | None, shown: str | None = None
) -> list[dict]:
    """Rows of a JSONL file at `path` (`shown`: its s3:// URI when it was downloaded from a bucket)."""
    rows, errors = [], []
    for number, obj in json_objects(RawFile(shown or str(path), path), errors):
        where = f"{shown or path}:{number}"
        values = {}
        for field in (image_field, label_field):
            value = obj.get(field)
            if isinstance(value, str) and value:
                values[field] = value
            else:
                what = "missing" if value is None else f"{value!r}" if value == "" else a_type(value)
                errors.append(f"{where}: field {field!r} is {what}; expected a string")
        if image_field not in values or label_field not in values:
            continue
        written = values[image_field]
        uri = written if is_uri(written) else join_uri(shown, written) if shown else None
        if uri is not None:
            image = bucket.file(uri) if bucket is not None else None
            if image is None:
                errors.append(f"{where}: image not found in the bucket ({written} -> {uri})")
                continue
        else:
            image = (path.parent / written).resolve()
            if not image.is_file():
                errors.append(f"{where}: image file not found ({written} -> {image})")
                continue
        rows.append({"path": str(image), "name": written, "label": values[label_field]})
    refuse(errors)
    if not rows:
        raise DataError(f"{shown or path}: no rows")
    return rows


def load_image(path: str | Path, allowed_modes: Sequence[str]) -> tuple[Image.Image, str, tuple[int, int]]:
    """`(rgb_image, original_mode, (width, height))` of a fully decoded file (first frame of an animation).

    Palette images with transparency go through RGBA; alpha is dropped, as `convert("RGB")` does.
    Raises DataError `"<path>: not a readable image (<reason>)"` for a missing, corrupt, truncated or
    non-image file, and `"<path>: image mode 'X'; expected one of ... (data.image_modes)"`.
    """
    from PIL import Image, UnidentifiedImageError

    rgb = None
    try:
        with Image.open(path) as img:
            img.load()
            mode, size = img.mode, img.size
            if mode in allowed_modes:
                source = img.convert("RGBA") if mode == "P" and "transparency" in img.info else img
                rgb = source.convert("RGB")  # a copy even when already RGB, so the file can close
    except UnidentifiedImageError:
        raise DataError(f"{path}: not a readable image (unrecognised format)") from None
    except FileNotFoundError:
        raise DataError(f"{path}: not a readable image (file not found)") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from None
    if rgb is None:
        expected = ", ".join(allowed_modes)
        raise DataError(f"{path}: image mode {mode!r}; expected one of {expected} (data.image_modes)")
    return rgb, mode, size


def perceptual_hash(image: Image.Image) -> int:
    """imagehash.phash (8x8 DCT, 64 bits) as an unsigned int; Hamming distance = popcount of the XOR."""
    import imagehash

    bits = np.asarray(imagehash.phash(image).hash, dtype=bool).reshape(-1)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def _popcount64(x: np.ndarray) -> np.ndarray:
    if _HAS_BITWISE_COUNT:
        return np.bitwise_count(x)
    return _POPCOUNT8[x.view(np.uint8)].reshape(*x.shape, 8).sum(axis=-1, dtype=np.uint8)


def find_image_leaks(
    hashes: Mapping[str, Sequence[tuple[str, int]]], pairs: Sequence[tuple[str, str]], max_distance: int = 6
) -> list[LeakPair]:
    """Leaks between splits from per-row `(content sha256, phash int)`, in row order. Exact: same sha256
    (similarity 1.0). Near: different content, Hamming distance d <= `max_distance`, similarity
    `round(1 - d / 64, 4)`. Each row pair once; sorted by (a_split, a_index, b_split, b_index), `a_split`
    being the first name of its pair. Raises ValueError (all problems at once) for unknown split names, a
    split paired with itself or in both orientations, `max_distance` outside 0..64, a phash outside uint64."""
    problems = []
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or not 0 <= max_distance <= 64:
        problems.append(f"max_distance: must be an int in 0..64, got {max_distance!r}")
    wanted: list[tuple[str, str]] = []
    for a, b in pairs:
        unknown = [name for name in (a, b) if name not in hashes]
        if unknown:
            problems.append(f"pairs: unknown split {', '.join(map(repr, unknown))}; known: {sorted(hashes)}")
        elif a == b:
            problems.append(f"pairs: {(a, b)!r} pairs a split with itself")
        elif (b, a) in wanted:
            problems.append(f"pairs: {(a, b)!r} and {(b, a)!r} both given; keep one orientation")
        elif (a, b) not in wanted:
            wanted.append((a, b))
    arrays: dict[str, np.ndarray] = {}
    for name in sorted({n for pair in wanted for n in pair}):
        try:
            arrays[name] = np.array([h for _, h in hashes[name]], dtype=np.uint64).reshape(-1)
        except (OverflowError, TypeError, ValueError):
            problems.append(f"hashes[{name!r}]: every phash must be an int in 0..2**64-1")
    if problems:
        raise ValueError("find_image_leaks: " + "; ".join(problems))

    found: list[LeakPair] = []
    for a, b in wanted:
        sha_a, sha_b = [s for s, _ in hashes[a]], [s for s, _ in hashes[b]]
        by_sha: dict[str, list[int]] = {}
        for j, sha in enumerate(sha_b):
            by_sha.setdefault(sha, []).append(j)
        for i, sha in enumerate(sha_a):
            found.extend(LeakPair("exact", a, i, b, j, 1.0) for j in by_sha.get(sha, ()))
        ha, hb = arrays[a], arrays[b]
        if not len(ha) or not len(hb):
            continue
        step = max(1, _BLOCK_ELEMENTS // len(hb))
        for start in range(0, len(ha), step):
            dist = _popcount64(ha[start : start + step, None] ^ hb[None, :])
            for bi, bj in zip(*np.nonzero(dist <= max_distance), strict=True):
                i, j = start + int(bi), int(bj)
                if sha_a[i] != sha_b[j]:
                    found.append(LeakPair("near", a, i, b, j, round(1.0 - int(dist[bi, bj]) / 64, 4)))
    found.sort(key=lambda x: (x.a_split, x.a_index, x.b_split, x.b_index))
    return found


def _jsonable(value: Any) -> Any:
    """JSON-safe copy: dataclasses and mappings lose None entries; enums become their lowercase name."""
    if isinstance(value, enum.Enum):
        return str(value.name).lower()
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    return str(value)


def transform_summary(processor: Any) -> dict:
    """`{"class": type name, <key>: value}` for the pixel-deciding attributes the processor has (size,
    crop_size, do_resize, do_center_crop, do_rescale, rescale_factor, do_normalize, image_mean, image_std,
    resample, do_convert_rgb). Size dicts drop None entries; `resample` is a lowercase name ("bilinear")
    when it is a PIL/torchvision enum or a PIL int constant. Every value is JSON-serialisable."""
    summary: dict[str, Any] = {"class": type(processor).__name__}
    for key in _TRANSFORM_KEYS:
        if not hasattr(processor, key):
            continue
        value = getattr(processor, key)
        if key == "resample" and type(value) is int:  # a PIL constant such as 2 (bilinear)
            from PIL import Image

            value = Image.Resampling(value) if value in set(Image.Resampling) else value
        summary[key] = _jsonable(value)
    return summary


def _stats(images: list[tuple[Image.Image, str, tuple[int, int]]], target: tuple[int, int]) -> dict:
    n = len(images)
    sizes = Counter(f"{w}x{h}" for _, _, (w, h) in images)
    ranked = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    top = dict(ranked[:_TOP_SIZES])
    other = sum(c for _, c in ranked[_TOP_SIZES:])
    if other:
        top["other"] = other
    by_area = sorted((w * h, w, h) for _, _, (w, h) in images)
    return {
        "count": n,
        "modes": dict(sorted(Counter(mode for _, mode, _ in images).items())),
        "sizes": top,
        "min_size": list(by_area[0][1:]),
        "max_size": list(by_area[-1][1:]),
        "resized_share": round(sum(tuple(s) != target for _, _, s in images) / n, 4),
        "converted_share": round(sum(mode != "RGB" for _, mode, _ in images) / n, 4),
    }


def inspect_images(
    rows: Sequence[dict], images: Sequence[tuple[Image.Image, str, tuple[int, int]]], target_size: tuple[int, int]
) -> dict:
    """`{label: {"count", "modes": {mode: n}, "sizes": {"WxH": n}, "min_size": [w, h], "max_size": [w, h],
    "resized_share", "converted_share"}}` for labels in sorted order; `images[i]` is `load_image` of `rows[i]`.

    `target_size` is (width, height). `sizes` holds the 5 commonest sizes (ties by name) plus "other" when
    more exist; min/max are the images with the fewest/most pixels; shares are rounded to 4 places.
    Raises ValueError when `rows` and `images` differ in length.
    """
    if len(rows) != len(images):
        raise ValueError(f"inspect_images: {len(rows)} rows but {len(images)} images")
    target = (int(target_size[0]), int(target_size[1]))
    groups: dict[str, list[tuple[Image.Image, str, tuple[int, int]]]] = {}
    for row, image in zip(rows, images, strict=True):
        groups.setdefault(str(row["label"]), []).append(image)
    return {label: _stats(groups[label], target) for label in sorted(groups)}


def grid_png(examples: Mapping[str, Sequence[Image.Image]], cell: int = 96) -> bytes:
    """PNG bytes: one row per category in mapping order, its name at the left (Pillow's default font),
    then its images resized to `cell` x `cell`; white background. Height is `len(examples) * cell`; width
    is the name column plus `cell` times the longest row. Raises ValueError for no categories or cell < 8."""
    from PIL import Image, ImageDraw, ImageFont

    if not examples:
        raise ValueError("grid_png: no categories")
    if cell < 8:
        raise ValueError(f"grid_png: cell must be >= 8 pixels, got {cell}")
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    names = [str(name) if len(str(name)) <= 24 else str(name)[:21] + "..." for name in examples]
    label_w = 8 + max(int(measure.textlength(name, font=font)) for name in names) + 8
    columns = max(len(images) for images in examples.values())
    canvas = Image.new("RGB", (label_w + columns * cell, len(examples) * cell), "white")
    draw = ImageDraw.Draw(canvas)
    for r, (name, images) in enumerate(zip(names, examples.values(), strict=True)):
        top = r * cell
        _, y0, _, y1 = draw.textbbox((0, 0), name, font=font)
        draw.text((8, top + (cell - (y1 - y0)) // 2 - y0), name, fill="black", font=font)
        for c, image in enumerate(images):
            tile = image.convert("RGB").resize((cell, cell), Image.Resampling.BILINEAR)
            canvas.paste(tile, (label_w + c * cell, top))
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()


def denormalize(pixel_values: Any, image_mean: Sequence[float], image_std: Sequence[float]) -> Image.Image:
    """RGB image of a processor's normalised (3, H, W) output: `x * std + mean`, clipped to 0..1, times 255.
    Assumes the processor rescaled to 0..1 first (do_rescale with 1/255). Accepts numpy arrays and torch
    tensors (any dtype, any device). Raises ValueError for another shape, a mean/std that is not 1 or 3
    numbers, or a zero std."""
    from PIL import Image

    if hasattr(pixel_values, "detach"):
        pixel_values = pixel_values.detach().cpu().float()
    x = np.asarray(pixel_values, dtype=np.float32)
    if x.ndim != 3 or x.shape[0] != 3:
        raise ValueError(f"denormalize: expected a (3, H, W) array, got shape {tuple(x.shape)}")
    mean = np.asarray(image_mean, dtype=np.float32).reshape(-1)
    std = np.asarray(image_std, dtype=np.float32).reshape(-1)
    if mean.size not in (1, 3) or std.size not in (1, 3) or np.any(std == 0):
        raise ValueError(f"denormalize: image_mean/image_std must be 1 or 3 numbers, std non-zero; got {mean}, {std}")
    rgb = np.clip(x * std.reshape(-1, 1, 1) + mean.reshape(-1, 1, 1), 0.0, 1.0)
    return Image.fromarray(np.round(rgb * 255.0).astype(np.uint8).transpose(1, 2, 0))
