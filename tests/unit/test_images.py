from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import imagehash
import numpy as np
import pytest
from PIL import Image, ImageDraw

import entrypoint.data.images as images
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
from entrypoint.data.leaks import LeakPair
from entrypoint.data.reading import DataError


def _scene(kind: str, size: int = 128) -> Image.Image:
    """Distinct drawings; pairwise pHash distances between kinds are 26..36 of 64."""
    if kind == "photo":  # gradients and two shapes, like a small photograph
        y, x = np.mgrid[0:size, 0:size]
        img = Image.fromarray(np.stack([x * 2, y * 2, x + y], -1).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        draw.ellipse((30, 40, 90, 100), fill=(250, 220, 40))
        draw.rectangle((80, 10, 120, 50), fill=(10, 10, 80))
        return img
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)
    if kind == "circle":
        draw.ellipse((20, 20, 100, 100), fill=(200, 30, 30))
    elif kind == "stripes":
        for x in range(0, size, 16):
            draw.rectangle((x, 0, x + 7, size), fill=(20, 20, 160))
    elif kind == "triangle":
        draw.polygon([(10, 118), (64, 10), (118, 118)], fill=(30, 160, 30))
    elif kind == "cross":
        draw.rectangle((54, 0, 74, size), fill=(90, 90, 0))
        draw.rectangle((0, 54, size, 74), fill=(90, 90, 0))
    else:
        raise AssertionError(kind)
    return img


def _save(img: Image.Image, path: Path, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kwargs)
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _error_lines(excinfo: pytest.ExceptionInfo) -> list[str]:
    return str(excinfo.value).split("\n")


# ---------------------------------------------------------------- listing


def test_image_folder_three_categories(tmp_path):
    root = tmp_path / "ds"
    _save(_scene("circle"), root / "cat" / "b.png")
    _save(_scene("stripes"), root / "cat" / "a.JPG")  # suffix in any case
    _save(_scene("cross"), root / "dog" / "sub" / "deep" / "x.webp")
    _save(_scene("triangle"), root / "bird" / "z.bmp")
    _save(_scene("photo"), root / "bird" / ".hidden.png")  # hidden file
    _save(_scene("photo"), root / "bird" / ".thumbs" / "t.png")  # hidden folder below a label
    _save(_scene("photo"), root / ".cache" / "c.png")  # hidden label folder
    _save(_scene("photo"), root / "top.png")  # not inside a label folder
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "empty").mkdir()  # a label folder without images gives no rows

    rows = image_rows(root)

    assert [(r["label"], r["name"]) for r in rows] == [
        ("bird", "bird/z.bmp"),
        ("cat", "cat/a.JPG"),
        ("cat", "cat/b.png"),
        ("dog", "dog/sub/deep/x.webp"),
    ]
    for row in rows:
        assert set(row) == {"path", "name", "label", "sha256"}
        assert Path(row["path"]).is_absolute()
        assert Path(row["path"]) == (root / row["name"]).resolve()
        assert row["sha256"] == _sha(Path(row["path"]))
    assert image_rows(str(root)) == rows  # str and Path alike
    assert IMAGES_VERSION == "images-1"


def test_jsonl_relative_and_absolute_paths(tmp_path):
    a = _save(_scene("circle"), tmp_path / "meta" / "imgs" / "a.png")
    b = _save(_scene("stripes"), tmp_path / "meta" / "imgs" / "b.png")
    c = _save(_scene("cross"), tmp_path / "elsewhere" / "c.png")
    lines = [
        {"file": "imgs/b.png", "y": "yes"},
        {"file": str(c), "y": "no"},
        {"file": "imgs/a.png", "y": "yes", "extra": 1},
    ]
    jsonl = tmp_path / "meta" / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]) + "\n")

    rows = image_rows(jsonl, image_field="file", label_field="y")

    assert rows == [
        {"path": str(c.resolve()), "name": str(c), "label": "no", "sha256": _sha(c)},
        {"path": str(a.resolve()), "name": "imgs/a.png", "label": "yes", "sha256": _sha(a)},
        {"path": str(b.resolve()), "name": "imgs/b.png", "label": "yes", "sha256": _sha(b)},
    ]


def test_missing_location_and_wrong_file_kind(tmp_path):
    with pytest.raises(DataError, match=r"nowhere: not found"):
        image_rows(tmp_path / "nowhere")
    csv = tmp_path / "rows.csv"
    csv.write_text("image,label\n")
    with pytest.raises(DataError, match=r"rows\.csv: expected a folder in ImageFolder layout"):
        image_rows(csv)


def test_empty_folders_named(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError) as excinfo:
        image_rows(empty)
    assert str(excinfo.value) == f"{empty}: no label subfolders; expected ImageFolder layout <folder>/<label>/<image>"

    no_images = tmp_path / "no_images"
    (no_images / "cat").mkdir(parents=True)
    (no_images / "dog").mkdir()
    (no_images / "cat" / "readme.txt").write_text("x")
    with pytest.raises(DataError) as excinfo:
        image_rows(no_images)
    assert str(excinfo.value).startswith(f"{no_images}: no images (.png, .jpg")
    assert str(excinfo.value).endswith("in 2 label folder(s)")


def test_jsonl_problems_all_listed_with_line_numbers(tmp_path):
    _save(_scene("circle"), tmp_path / "ok.png")
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(
        "\n".join(
            [
                json.dumps({"image": "ok.png", "label": "a"}),  # 1: fine
                '{"image": "ok.png", "label": ',  # 2: invalid JSON
                json.dumps({"image": "ok.png"}),  # 3: no label
                json.dumps({"image": "ok.png", "label": 3}),  # 4: label not a string
                json.dumps({"image": "gone.png", "label": "a"}),  # 5: file missing
                json.dumps(["ok.png", "a"]),  # 6: not an object
            ]
        )
    )
    with pytest.raises(DataError) as excinfo:
        image_rows(jsonl)
    lines = _error_lines(excinfo)
    assert len(lines) == 5
    assert lines[0].startswith(f"{jsonl}:2: not valid JSON (")
    assert lines[1] == f"{jsonl}:3: field 'label' is missing; expected a string"
    assert lines[2] == f"{jsonl}:4: field 'label' is an int; expected a string"
    assert lines[3] == f"{jsonl}:5: image file not found (gone.png -> {(tmp_path / 'gone.png').resolve()})"
    assert lines[4] == f"{jsonl}:6: expected a JSON object, got list"


def test_jsonl_problems_capped_at_twenty(tmp_path):
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps({"image": f"m{i}.png", "label": "a"}) for i in range(25)))
    with pytest.raises(DataError) as excinfo:
        image_rows(jsonl)
    lines = _error_lines(excinfo)
    assert len(lines) == 21
    assert lines[19].startswith(f"{jsonl}:20: image file not found (m19.png")
    assert lines[20] == "... and 5 more"


# ---------------------------------------------------------------- decoding


def test_random_bytes_with_png_suffix_is_named(tmp_path):
    bad = tmp_path / "noise.png"
    bad.write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    with pytest.raises(DataError) as excinfo:
        load_image(bad, ["RGB"])
    assert str(excinfo.value) == f"{bad}: not a readable image (unrecognised format)"


def test_truncated_png_is_named(tmp_path):
    noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    full = io.BytesIO()
    Image.fromarray(noise).save(full, format="PNG")
    cut = tmp_path / "cut.png"
    cut.write_bytes(full.getvalue()[: len(full.getvalue()) // 2])
    with pytest.raises(DataError) as excinfo:
        load_image(cut, ["RGB"])
    message = str(excinfo.value)
    assert message.startswith(f"{cut}: not a readable image (")
    assert "truncated" in message
    with pytest.raises(DataError, match=r"not a readable image"):  # decoding is checked before the mode
        load_image(cut, ["L"])


def test_missing_image_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"gone\.png: not a readable image \(file not found\)"):
        load_image(tmp_path / "gone.png", ["RGB"])


@pytest.mark.parametrize(("mode", "name"), [("CMYK", "c.jpg"), ("I;16", "deep.png")])
def test_mode_not_allowed_names_file_and_mode(tmp_path, mode, name):
    path = _save(Image.new(mode, (16, 12)), tmp_path / name)
    with pytest.raises(DataError) as excinfo:
        load_image(path, ["RGB", "L"])
    assert str(excinfo.value) == f"{path}: image mode {mode!r}; expected one of RGB, L (data.image_modes)"


def test_grey_image_converted_to_rgb_and_original_mode_reported(tmp_path):
    grey = Image.fromarray(np.arange(20 * 10, dtype=np.uint8).reshape(10, 20), mode="L")
    path = _save(grey, tmp_path / "g.png")
    rgb, mode, size = load_image(path, ["RGB", "L"])
    assert (rgb.mode, mode, size) == ("RGB", "L", (20, 10))
    arr = np.asarray(rgb)
    assert arr.shape == (10, 20, 3)
    for channel in range(3):
        np.testing.assert_array_equal(arr[:, :, channel], np.asarray(grey))


def test_rgb_image_returned_unchanged(tmp_path):
    path = _save(_scene("photo"), tmp_path / "p.png")
    rgb, mode, size = load_image(path, ["RGB"])
    assert (mode, size) == ("RGB", (128, 128))
    np.testing.assert_array_equal(np.asarray(rgb), np.asarray(_scene("photo")))


# ---------------------------------------------------------------- hashing and leaks


def test_perceptual_hash_is_imagehash_phash_as_int():
    a, b = _scene("photo"), _scene("circle")
    assert perceptual_hash(a) == int(str(imagehash.phash(a)), 16)
    assert perceptual_hash(a) < 2**64
    distance = bin(perceptual_hash(a) ^ perceptual_hash(b)).count("1")
    assert distance == imagehash.phash(a) - imagehash.phash(b)


def _hashes(paths: list[Path]) -> list[tuple[str, int]]:
    return [(_sha(p), perceptual_hash(load_image(p, ["RGB"])[0])) for p in paths]


def test_exact_near_and_different_images(tmp_path):
    base = _scene("photo")
    train = [
        _save(base, tmp_path / "train" / "0.png"),
        _save(_scene("circle"), tmp_path / "train" / "1.png"),
        _save(_scene("stripes"), tmp_path / "train" / "2.png"),
    ]
    smaller = base.resize((115, 115), Image.Resampling.BICUBIC)
    test = [
        _save(_scene("triangle"), tmp_path / "test" / "0.png"),
        _save(base, tmp_path / "test" / "1.png"),  # the same file again: exact
        _save(smaller, tmp_path / "test" / "2.jpg", quality=90),  # re-encoded and resized: near
        _save(_scene("cross"), tmp_path / "test" / "3.png"),
    ]
    hashes = {"train": _hashes(train), "test": _hashes(test)}
    near_distance = imagehash.phash(Image.open(train[0])) - imagehash.phash(Image.open(test[2]))
    assert near_distance <= 4
    for i, j in [(0, 0), (0, 3), (1, 0), (1, 3), (2, 0), (2, 3), (1, 2), (2, 2)]:  # all pairs of different drawings
        assert imagehash.phash(Image.open(train[i])) - imagehash.phash(Image.open(test[j])) >= 20

    leaks = find_image_leaks(hashes, [("train", "test")])

    assert leaks == [
        LeakPair("exact", "train", 0, "test", 1, 1.0),
        LeakPair("near", "train", 0, "test", 2, round(1 - near_distance / 64, 4)),
    ]
    at_zero = leaks if near_distance == 0 else leaks[:1]  # the exact pair does not depend on the distance
    assert find_image_leaks(hashes, [("train", "test")], max_distance=0) == at_zero
    assert find_image_leaks(hashes, [("test", "train")]) == [
        LeakPair("exact", "test", 1, "train", 0, 1.0),
        LeakPair("near", "test", 2, "train", 0, round(1 - near_distance / 64, 4)),
    ]


def test_exact_pair_reported_once_and_distance_threshold_inclusive():
    sha = ["s0", "s1", "s2"]
    hashes = {
        "a": [(sha[0], 0), (sha[1], 0b1111)],
        "b": [(sha[0], 0), (sha[2], 0b0111), ("s3", 2**64 - 1)],
    }
    # (a0, b0): exact (and distance 0, still reported once); (a0, b1): 3 bits; (a1, b1): 1 bit;
    # (a0, b2): 64 bits; (a1, b0): 4 bits; (a1, b2): 60 bits.
    assert find_image_leaks(hashes, [("a", "b")], max_distance=3) == [
        LeakPair("exact", "a", 0, "b", 0, 1.0),
        LeakPair("near", "a", 0, "b", 1, 0.9531),
        LeakPair("near", "a", 1, "b", 1, 0.9844),
    ]
    assert len(find_image_leaks(hashes, [("a", "b")], max_distance=64)) == 6
    assert find_image_leaks(hashes, [("a", "b")], max_distance=0) == [LeakPair("exact", "a", 0, "b", 0, 1.0)]


@pytest.mark.parametrize(
    ("pairs", "max_distance", "message"),
    [
        ([("train", "val")], 6, r"unknown split 'val'; known: \['test', 'train'\]"),
        ([("train", "train")], 6, r"pairs a split with itself"),
        ([("train", "test"), ("test", "train")], 6, r"both given"),
        ([("train", "test")], 65, r"max_distance: must be an int in 0\.\.64, got 65"),
        ([("train", "test")], -1, r"max_distance: must be an int in 0\.\.64, got -1"),
        ([("train", "test")], 2.5, r"max_distance"),
    ],
)
def test_find_image_leaks_rejects_bad_arguments(pairs, max_distance, message):
    hashes = {"train": [("s", 1)], "test": [("t", 2)]}
    with pytest.raises(ValueError, match=message):
        find_image_leaks(hashes, pairs, max_distance=max_distance)


def test_find_image_leaks_rejects_hash_outside_uint64():
    with pytest.raises(ValueError, match=r"hashes\['b'\]: every phash must be an int in 0\.\.2\*\*64-1"):
        find_image_leaks({"a": [("s", 1)], "b": [("t", -1)]}, [("a", "b")])


def _random_splits(n_a: int, n_b: int, seed: int) -> tuple[dict, list[LeakPair]]:
    rng = np.random.default_rng(seed)
    ha = [int(x) for x in rng.integers(0, 2**64, n_a, dtype=np.uint64)]
    hb = [int(x) for x in rng.integers(0, 2**64, n_b, dtype=np.uint64)]
    sa, sb = [f"a{i}" for i in range(n_a)], [f"b{j}" for j in range(n_b)]
    hb[n_b - 1] = ha[17]  # same phash, other content: near at distance 0
    hb[42] = ha[n_a // 2] ^ 0b1011  # 3 bits flipped
    sb[123] = sa[n_a - 1]  # same content: exact (its random phash is far away)
    expected = [
        LeakPair("near", "a", 17, "b", n_b - 1, 1.0),
        LeakPair("near", "a", n_a // 2, "b", 42, 0.9531),
        LeakPair("exact", "a", n_a - 1, "b", 123, 1.0),
    ]
    expected.sort(key=lambda x: (x.a_index, x.b_index))
    return {"a": list(zip(sa, ha, strict=True)), "b": list(zip(sb, hb, strict=True))}, expected


def test_ten_thousand_by_ten_thousand_finds_planted_duplicates():
    hashes, expected = _random_splits(10_000, 10_000, seed=7)
    assert find_image_leaks(hashes, [("a", "b")]) == expected


def test_byte_table_popcount_matches_native(monkeypatch):
    values = np.array([0, 1, 0b1011, 2**63, 2**64 - 1, 0x0F0F0F0F0F0F0F0F], dtype=np.uint64)
    counts = [0, 1, 3, 1, 64, 32]
    hashes, expected = _random_splits(700, 900, seed=3)
    monkeypatch.setattr(images, "_BLOCK_ELEMENTS", 1000)  # several blocks, one row of `a` each
    assert find_image_leaks(hashes, [("a", "b")]) == expected
    monkeypatch.setattr(images, "_HAS_BITWISE_COUNT", False)
    assert images._popcount64(values).tolist() == counts
    assert images._popcount64(values.reshape(2, 3)).tolist() == [counts[:3], counts[3:]]
    assert find_image_leaks(hashes, [("a", "b")]) == expected


# ---------------------------------------------------------------- describing the pixels


def _loaded(mode: str, size: tuple[int, int]) -> tuple[Image.Image, str, tuple[int, int]]:
    return Image.new("RGB", (4, 4)), mode, size


def test_inspect_images_hand_computed():
    rows = [{"label": "b"}, {"label": "a"}, {"label": "a"}, {"label": "a"}]
    loaded = [_loaded("P", (10, 10)), _loaded("RGB", (224, 224)), _loaded("L", (100, 50)), _loaded("RGBA", (224, 224))]
    c_sizes = [(10, 10), (10, 10), (20, 20), (20, 20), (30, 30), (40, 40), (50, 50), (60, 60), (70, 70)]
    rows += [{"label": "c"}] * len(c_sizes)
    loaded += [_loaded("RGB", s) for s in c_sizes[:-1]] + [_loaded("L", (70, 70))]

    report = inspect_images(rows, loaded, (224, 224))

    assert list(report) == ["a", "b", "c"]
    assert report["a"] == {
        "count": 3,
        "modes": {"L": 1, "RGB": 1, "RGBA": 1},
        "sizes": {"224x224": 2, "100x50": 1},
        "min_size": [100, 50],
        "max_size": [224, 224],
        "resized_share": 0.3333,  # 1 of 3 is not 224x224
        "converted_share": 0.6667,  # L and RGBA
    }
    assert report["b"] == {
        "count": 1,
        "modes": {"P": 1},
        "sizes": {"10x10": 1},
        "min_size": [10, 10],
        "max_size": [10, 10],
        "resized_share": 1.0,
        "converted_share": 1.0,
    }
    assert report["c"]["sizes"] == {"10x10": 2, "20x20": 2, "30x30": 1, "40x40": 1, "50x50": 1, "other": 2}
    assert report["c"]["min_size"] == [10, 10] and report["c"]["max_size"] == [70, 70]
    assert report["c"]["converted_share"] == 0.1111  # 1 of 9
    json.dumps(report)
    with pytest.raises(ValueError, match="2 rows but 1 images"):
        inspect_images(rows[:2], loaded[:1], (224, 224))


def test_grid_png_layout():
    colours = [(255, 0, 0), (0, 128, 0), (0, 0, 255), (40, 40, 40)]
    examples = {
        "cats": [Image.new("RGB", (50, 30), c) for c in colours],
        "dogs": [Image.new("L", (10, 10), 0), Image.new("RGB", (300, 200), (0, 128, 0))],
        "a very long category name that will not fit": [],
    }
    data = grid_png(examples, cell=32)

    Image.open(io.BytesIO(data)).verify()
    grid = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = grid.size
    assert height == 3 * 32
    assert width >= 32 * 4
    label_w = width - 4 * 32
    assert label_w > 8
    for c, colour in enumerate(colours):  # the tiles of the first row, left to right
        assert grid.getpixel((label_w + c * 32 + 16, 16)) == colour
    assert grid.getpixel((label_w + 16, 32 + 16)) == (0, 0, 0)  # "dogs": the L image, converted
    assert grid.getpixel((label_w + 32 * 3 + 16, 32 + 16)) == (255, 255, 255)  # no third/fourth image
    assert grid.getpixel((label_w + 16, 64 + 16)) == (255, 255, 255)  # empty category
    label = np.asarray(grid.crop((0, 0, label_w, 32)))
    assert (label < 128).any()  # the category name is drawn in black
    with pytest.raises(ValueError, match="no categories"):
        grid_png({})


def test_denormalize_round_trips_processor_output():
    rng = np.random.default_rng(5)
    original = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    normalised = (original.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]

    img = denormalize(normalised.astype(np.float32), mean, std)

    assert (img.mode, img.size) == ("RGB", (5, 6))
    np.testing.assert_array_equal(np.asarray(img), original)


def test_denormalize_clips_and_accepts_tensor_like():
    class FakeTensor:  # the torch calls denormalize makes: .detach().cpu().float(), then numpy conversion
        def __init__(self, array):
            self.array = array

        def detach(self):
            return self

        def cpu(self):
            return self

        def float(self):
            return self

        def __array__(self, dtype=None, copy=None):
            return self.array

    x = np.zeros((3, 1, 2), dtype=np.float32)
    x[:, 0, 0], x[:, 0, 1] = -5.0, 5.0
    img = denormalize(FakeTensor(x), [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    assert np.asarray(img).tolist() == [[[0, 0, 0], [255, 255, 255]]]
    with pytest.raises(ValueError, match=r"expected a \(3, H, W\) array, got shape \(1, 3, 1, 2\)"):
        denormalize(x[None], [0.5] * 3, [0.5] * 3)
    with pytest.raises(ValueError, match="std non-zero"):
        denormalize(x, [0.5] * 3, [0.5, 0.0, 0.5])


@dataclasses.dataclass
class _Size:
    height: int | None = None
    width: int | None = None
    shortest_edge: int | None = None


def test_transform_summary_json_ready():
    class FakeProcessor:
        size = _Size(shortest_edge=256)
        crop_size = {"height": 224, "width": 224}
        do_resize = True
        do_center_crop = True
        do_rescale = True
        rescale_factor = np.float64(1 / 255)
        do_normalize = True
        image_mean = (0.5, 0.5, 0.5)
        image_std = np.array([0.25, 0.25, 0.25])
        resample = 3  # PIL's BICUBIC as a plain int

    summary = transform_summary(FakeProcessor())

    assert summary == {
        "class": "FakeProcessor",
        "size": {"shortest_edge": 256},
        "crop_size": {"height": 224, "width": 224},
        "do_resize": True,
        "do_center_crop": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.25, 0.25, 0.25],
        "resample": "bicubic",
    }
    assert json.loads(json.dumps(summary)) == summary

    class Other:
        resample = Image.Resampling.LANCZOS

    assert transform_summary(Other()) == {"class": "Other", "resample": "lanczos"}


@pytest.mark.slow
def test_transform_summary_of_a_real_vit_processor():
    from transformers import ViTImageProcessor

    summary = transform_summary(ViTImageProcessor())
    assert summary["size"] == {"height": 224, "width": 224}
    assert summary["resample"] == "bilinear"
    assert summary["image_mean"] == [0.5, 0.5, 0.5]
    assert summary["do_rescale"] is True
    assert json.loads(json.dumps(summary)) == summary
