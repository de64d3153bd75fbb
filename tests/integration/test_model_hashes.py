"""The base model's sha256 at the size users train, scaled down: a model in 20 shards. Every process of a job
(the run, a resume, the recheck and parity processes, each torchrun rank) hashes the base; at 140 GB a full
read costs minutes per process. A node reads a file's bytes for its hash once: a model fetched from the
bucket not at all (its download hashed every byte), a local folder once, again only where a file changed.
File reads are counted at `file_sha256`, the one function that reads a file to hash it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from entrypoint.store import PrefixedStore, hashing
from entrypoint.store.hashing import RACY_NS, file_sha256
from entrypoint.store.models import fetch_model, push_model
from entrypoint.training import model as model_module
from entrypoint.training.model import hash_base_model

SHARDS, SHARD_BYTES = 20, 1 << 20


@pytest.fixture
def reads(monkeypatch) -> list[Path]:
    """Every file read to be hashed, in a fresh process's state (no hash kept in memory)."""
    seen: list[Path] = []

    def counting(path: Path) -> str:
        seen.append(Path(path))
        return file_sha256(path)

    monkeypatch.setattr(hashing, "file_sha256", counting)
    monkeypatch.setattr(model_module, "file_sha256", counting, raising=False)  # wherever a hash reads a file
    model_module._hash_files.cache_clear()  # as a new process starts
    yield seen
    model_module._hash_files.cache_clear()


def _sharded(folder: Path) -> Path:
    """20 weight shards of random bytes with an index and a config, as save_pretrained lays out a large model."""
    folder.mkdir(parents=True)
    names = [f"model-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)]
    for name in names:
        (folder / name).write_bytes(os.urandom(SHARD_BYTES))
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (folder / "config.json").write_text("{}")
    return folder


def _new_process() -> None:
    model_module._hash_files.cache_clear()


def test_a_model_fetched_from_the_bucket_is_not_read_again_for_its_hash(tmp_path, s3_store, monkeypatch, reads):
    monkeypatch.setenv("RENTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    folder = _sharded(tmp_path / "model")
    models = PrefixedStore(s3_store, "models/m")
    manifest = push_model(models, folder, print)
    reads.clear()

    fetched = fetch_model(models, tmp_path / "cache", print)
    assert hash_base_model(fetched).sha256 == manifest["base_model_sha256"]
    assert reads == []  # the download's own hashes, recorded for this node
    _new_process()
    assert hash_base_model(fetched).sha256 == manifest["base_model_sha256"] and reads == []

    shard = fetched / "model-00007-of-00020.safetensors"  # the cached copy damaged, size and mtime kept
    stat = shard.stat()
    with open(shard, "r+b") as handle:
        handle.write(b"\0" * 16)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    _new_process()
    damaged = hash_base_model(fetched)
    assert reads == [shard]  # ctime moved: read again, and only it
    assert damaged.sha256 != manifest["base_model_sha256"]
    assert damaged.files[shard.name] != manifest["files"][shard.name]["sha256"]


def test_a_local_folder_is_read_once_per_node_and_again_only_where_it_changed(tmp_path, monkeypatch, reads):
    monkeypatch.setenv("RENTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    folder = _sharded(tmp_path / "model")
    written = time.time_ns()
    first = hash_base_model(folder)
    assert len(reads) == SHARDS
    assert first.files == {p.name: file_sha256(p) for p in folder.glob("*.safetensors")}

    # Just written: the kernel's coarse timestamps could hide a write right after the read ("racy"), so
    # these are read again until they are older than RACY_NS at the start of a hash.
    reads.clear()
    _new_process()
    assert hash_base_model(folder) == first and len(reads) == SHARDS
    time.sleep(max(0.0, (written + RACY_NS - time.time_ns()) / 1e9) + 0.2)
    reads.clear()
    _new_process()
    assert hash_base_model(folder) == first and len(reads) == SHARDS  # recorded now as settled
    reads.clear()
    _new_process()
    assert hash_base_model(folder) == first and reads == []

    replaced = folder / "model-00003-of-00020.safetensors"  # a new file in its place: another inode
    (folder / "new").write_bytes(os.urandom(SHARD_BYTES))
    os.replace(folder / "new", replaced)
    reads.clear()
    _new_process()
    after = hash_base_model(folder)
    assert reads == [replaced] and after.files[replaced.name] == file_sha256(replaced) != first.files[replaced.name]

    reads.clear()  # check-export's hash reads every byte, whatever the memo says
    _new_process()
    assert hash_base_model(folder, memo=False) == after and len(reads) == SHARDS
