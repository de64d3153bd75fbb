"""Image classification jobs: synthetic shapes drawn with Pillow and a tiny ViT built from a config. The data
checks look at pixels (corrupt files, unexpected modes, re-encoded near duplicates across splits), the
inspection records what the model receives, and a job runs end to end and beats its baseline."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from entrypoint.context import PhaseContext
from entrypoint.data.reading import DataError
from entrypoint.phases import data as data_phase
from entrypoint.store import FileStore, PrefixedStore
from jobspec import parse_spec
from tests.shapes import CATEGORIES, build_tiny_vit, write_shapes

ROOT = Path(__file__).resolve().parents[2]
RENTUNE = Path(sys.executable).parent / "rentune"


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> Path:
    return build_tiny_vit(tmp_path_factory.mktemp("vit") / "tiny-vit")


def _example(model: Path, data: dict, **training) -> dict:
    spec = yaml.safe_load((ROOT / "jobspec/examples/images.yaml").read_text())
    spec["model"]["path"] = str(model)
    spec["data"] = {**spec["data"], **data}
    spec["training"] = {**spec["training"], "device": "cpu", **training}
    return spec


def _data_phase(tmp_path: Path, spec: dict) -> tuple[dict, PhaseContext]:
    loaded = parse_spec(yaml.safe_dump(spec), source="spec.yaml")
    store = PrefixedStore(FileStore(tmp_path / "store"), "jobs/shapes")
    ctx = PhaseContext(loaded.spec, loaded.sha256, store, tmp_path / "work", lambda line: None)
    return data_phase.run(ctx), ctx


def _given_splits(tmp_path: Path) -> dict:
    files = {}
    for seed, name in enumerate(("train", "eval", "test")):
        files[name] = str(write_shapes(tmp_path / name, per_category=6, seed=seed + 10))
    return files


def _upload_folder(store, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        store.client.put_object(
            Bucket=store.bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes()
        )


def test_images_in_a_bucket_give_the_data_of_the_same_images_on_disk(tmp_path, vit, s3_server, s3_store):
    """An ImageFolder under a bucket prefix, a JSONL in the bucket with relative paths, and a local JSONL
    with s3:// paths: the same images and labels as the local folder, so the same data version. A missing
    object is refused naming the line and the URI."""
    folder = write_shapes(tmp_path / "shapes", per_category=8, seed=3)
    _upload_folder(s3_store, folder, "data/shapes")
    rows = [
        {"image": p.relative_to(folder).as_posix(), "label": p.parent.name}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    jsonl = "".join(json.dumps(r) + "\n" for r in rows)
    s3_store.client.put_object(Bucket=s3_store.bucket, Key="data/shapes/rows.jsonl", Body=jsonl.encode())
    bucket = f"s3://{s3_store.bucket}/data/shapes"
    local_jsonl = tmp_path / "uris.jsonl"
    local_jsonl.write_text("".join(json.dumps({**r, "image": f"{bucket}/{r['image']}"}) + "\n" for r in rows))
    options = {"endpoint_url": s3_server, "addressing_style": "path"}
    versions = {}
    for name, source in {"local": str(folder), "prefix": bucket, "jsonl": f"{bucket}/rows.jsonl"}.items():
        spec = {**_example(vit, {"source": source}), "store": {"uri": f"s3://{s3_store.bucket}/jobs", **options}}
        result, ctx = _data_phase(tmp_path / name, spec)
        versions[name] = result["data_version"]
        assert not (ctx.workdir / "spool").exists()  # downloaded images go when the phase ends
    uris = {**_example(vit, {"source": str(local_jsonl)}), "store": {"uri": f"s3://{s3_store.bucket}/jobs", **options}}
    # names differ (URIs, not relative paths) but the version is over image bytes and labels
    versions["uris"] = _data_phase(tmp_path / "uris", uris)[0]["data_version"]
    assert len(set(versions.values())) == 1, versions

    local_jsonl.write_text(
        local_jsonl.read_text() + json.dumps({"image": f"{bucket}/circle/gone.png", "label": "circle"}) + "\n"
    )
    with pytest.raises(
        DataError, match=rf"uris.jsonl:{len(rows) + 1}: image not found in the bucket .*{bucket}/circle/gone.png"
    ):
        _data_phase(tmp_path / "missing", uris)


def test_a_re_encoded_resized_copy_across_train_and_test_is_found(tmp_path, vit):
    files = _given_splits(tmp_path)
    original = Path(files["train"]) / "circle" / "circle-002.png"
    copy = Image.open(original).convert("RGB").resize((46, 46))
    buffer = io.BytesIO()
    copy.save(buffer, "JPEG", quality=90)
    (Path(files["test"]) / "circle" / "planted.jpg").write_bytes(buffer.getvalue())
    spec = _example(vit, {"source": None, "files": files, "leaks": {"image_max_distance": 2, "test": "fail"}})
    with pytest.raises(DataError) as caught:
        _data_phase(tmp_path, spec)
    message = str(caught.value)
    assert "train-test near" in message and "circle/circle-002.png" in message and "circle/planted.jpg" in message
    leaks = json.loads((tmp_path / "store/jobs/shapes/phases/data/leaks.json").read_text())
    assert [(p["pair"], p["kind"]) for p in leaks["pairs"]] == [("train-test", "near")]  # nothing else flagged

    spec["data"]["leaks"] = {"image_max_distance": 2, "test": "drop", "eval": "drop"}
    result, ctx = _data_phase(tmp_path / "dropped", spec)
    assert result["leaks"]["dropped"] == {"train": 1} and len(ctx.read_split("train")) == 6 * len(CATEGORIES) - 1


def test_a_corrupt_file_and_an_unexpected_mode_are_named(tmp_path, vit):
    files = _given_splits(tmp_path)
    broken = Path(files["train"]) / "square" / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
    with pytest.raises(DataError, match=rf"{broken}: not a readable image"):
        _data_phase(tmp_path / "a", _example(vit, {"source": None, "files": files}))
    broken.unlink()
    twin = Path(files["train"]) / "square" / "twin.png"
    twin.write_bytes((Path(files["train"]) / "circle" / "circle-001.png").read_bytes())
    with pytest.raises(DataError, match=r"the same image under two labels: circle/circle-001.png \(circle\)"):
        _data_phase(tmp_path / "c", _example(vit, {"source": None, "files": files}))
    twin.unlink()
    cmyk = Path(files["eval"]) / "cross" / "print.jpg"
    Image.new("CMYK", (40, 40), (10, 20, 30, 0)).save(cmyk)
    with pytest.raises(DataError, match=rf"{cmyk}: image mode 'CMYK'; expected one of RGB, L"):
        _data_phase(tmp_path / "b", _example(vit, {"source": None, "files": files}))


@pytest.fixture(scope="module")
def image_job(tmp_path_factory, vit):
    tmp = tmp_path_factory.mktemp("image-job")
    data = write_shapes(tmp / "shapes", per_category=60)
    spec = _example(vit, {"source": str(data)})
    path = tmp / "images.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [RENTUNE, "run", str(path), "--store", f"file://{tmp / 'store'}", "--workdir", str(tmp / "work")]
    run = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return tmp / "store/jobs/shapes", run


def test_image_job_runs_end_to_end_and_beats_its_baseline(image_job):
    job, run = image_job
    results = json.loads((job / "report/results.json").read_text())
    selected = next(t for t in results["trials"] if t["id"] == results["selected"]["trial_id"])
    assert selected["metrics"]["macro_f1"] > results["baseline"]["metrics"]["macro_f1"]
    assert results["baseline"]["method"] == "nearest_train_centroid"
    statuses = {t["id"]: t["status"] for t in results["trials"]}
    assert statuses == {"main": "completed", "lora": "completed"}  # full and LoRA both train
    lora = json.loads((job / "trials/lora/result.json").read_text())
    assert lora["adaptation"]["lora_modules"] and any("classifier" in m for m in lora["adaptation"]["modules_to_save"])
    assert lora["parameter_check"]["passed"]
    assert json.loads((job / "export/BINDING.json").read_text())["trial_id"] == selected["id"]
    assert json.loads((job / "phases/verify/result.json").read_text())["outputs_equal"]


def test_inspection_grid_and_the_shape_the_model_really_receives(image_job, vit):
    job, _ = image_job
    inspection = json.loads((job / "phases/data/inspection.json").read_text())
    grid = Image.open(job / "phases/data/inspection_grid.png")
    grid.verify()
    grid = Image.open(job / "phases/data/inspection_grid.png")
    assert grid.size[1] == len(CATEGORIES) * 96  # one row per category
    config = json.loads((vit / "config.json").read_text())
    size = config["image_size"]
    for label in CATEGORIES:
        assert inspection["after_transform"][label]["shape"] == [3, size, size]
    # what the model received in the smoke pass (a forward hook on the model), not the inspection's numbers
    received = inspection["smoke"]["splits"]["train"]["model_input_shape"]["pixel_values"]
    assert received[1:] == inspection["after_transform"]["circle"]["shape"]
    stats = inspection["categories"]["square"]
    assert stats["count"] == 60 and stats["sizes"] == {"48x48": 60} and stats["resized_share"] == 1.0
    assert 0.0 < sum(inspection["categories"][c]["converted_share"] for c in CATEGORIES) < len(CATEGORIES)
    assert set(stats["modes"]) <= {"RGB", "L"}
    assert inspection["transform"]["class"].startswith("ViTImageProcessor")
