"""Background checkpoint commits (entrypoint/store/committer.py) on a real FileStore whose uploads a test
can hold back or make fail: the caller gets control back while the upload runs, the manifest appears only
once every file is up, one commit at a time, failures are counted, recorded and retried by the next
checkpoint, and a failing streak stops training with the store's error."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from entrypoint.store import FileStore, TransientStoreError
from entrypoint.store.checkpoint import MANIFEST, CheckpointError, commit_checkpoint, find_latest
from entrypoint.store.committer import MAX_FAILED_COMMITS, Committer
from entrypoint.store.hashing import file_sha256

PREFIX = "trials/main/checkpoints"
STATUS = "trials/main/commit-status.json"


class ControlledStore(FileStore):
    """A FileStore whose put_file waits for `gate` and raises while `failing` is set."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.gate = threading.Event()
        self.gate.set()
        self.failing = False
        self.uploading = threading.Event()

    def put_file(self, key, path):
        self.uploading.set()
        self.gate.wait(timeout=30)
        if self.failing:
            raise TransientStoreError(f"{key}: 503 SlowDown (after 8 attempts)")
        return super().put_file(key, path)


def _folder(tmp_path: Path, step: int) -> Path:
    folder = tmp_path / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * (step + 1))
    (folder / "optimizer.pt").write_bytes(b"o" * 1000)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


@pytest.fixture
def store(tmp_path) -> ControlledStore:
    return ControlledStore(tmp_path / "store")


def _committer(store, lines: list[str], keep: int = 2) -> Committer:
    return Committer(store, PREFIX, {"trial_id": "main"}, keep, lines.append, status_key=STATUS)


def test_a_background_commit_returns_at_once_and_publishes_the_manifest_last(store, tmp_path):
    lines: list[str] = []
    committer = _committer(store, lines)
    folder = _folder(tmp_path, 10)
    expected = {p.name: file_sha256(p) for p in folder.iterdir()}
    size = sum(p.stat().st_size for p in folder.iterdir())
    store.gate.clear()  # the upload hangs until the test lets it go
    record = committer.commit(10, folder, background=True)
    assert store.uploading.wait(timeout=10)
    assert record["commit_s"] is None and committer.committed == []
    assert store.head(f"{PREFIX}/step-00000010/{MANIFEST}") is None  # no manifest while files are in flight
    store.gate.set()
    committer.wait()
    manifest = json.loads(store.get_bytes(f"{PREFIX}/step-00000010/{MANIFEST}"))
    assert {name: info["sha256"] for name, info in manifest["files"].items()} == expected
    assert record["commit_s"] is not None and record["error"] is None and record["bytes"] == size
    assert committer.committed == [10] and not folder.exists()
    assert any(line.startswith("checkpoint: committed step 10") and "in the background" in line for line in lines)


def test_one_commit_in_flight_the_next_waits_for_it(store, tmp_path):
    committer = _committer(store, [], keep=5)
    store.gate.clear()
    committer.commit(10, _folder(tmp_path, 10), background=True)
    assert store.uploading.wait(timeout=10)
    releaser = threading.Timer(0.3, store.gate.set)
    releaser.start()
    committer.commit(20, _folder(tmp_path, 20), background=True)  # waits for step 10 first
    assert committer.committed == [10]
    committer.wait()
    assert committer.committed == [10, 20]


def test_failures_are_logged_recorded_and_the_next_checkpoint_retries(store, tmp_path):
    lines: list[str] = []
    committer = _committer(store, lines)
    store.failing = True
    first = committer.commit(10, _folder(tmp_path, 10), background=True)
    committer.wait()
    assert "503 SlowDown" in first["error"] and committer.failures == 1
    assert any("commit of step 10 failed (1 in a row)" in line and "next checkpoint retries" in line for line in lines)
    store.failing = False  # the status object is written with put_bytes, which did not fail
    assert json.loads(store.get_bytes(STATUS))["failures_in_a_row"] == 1
    assert not (tmp_path / "checkpoint-10").exists()  # the failed step's local files are dropped
    committer.raise_if_failing()  # one failure is not a streak
    committer.commit(20, _folder(tmp_path, 20), background=True)
    committer.wait()
    assert committer.failures == 0 and committer.committed == [20]
    assert json.loads(store.get_bytes(STATUS))["failures_in_a_row"] == 0
    restored = find_latest(store, PREFIX, tmp_path / "restore", lines.append)
    assert restored is not None and restored.step == 20


def test_a_failing_streak_stops_training_with_the_stores_error(store, tmp_path):
    committer = _committer(store, [])
    store.failing = True
    for step in range(10, 10 * (MAX_FAILED_COMMITS + 1), 10):
        committer.raise_if_failing()  # training goes on until the streak is complete
        committer.commit(step, _folder(tmp_path, step), background=True)
        committer.wait()
    with pytest.raises(CheckpointError, match=f"{MAX_FAILED_COMMITS} checkpoint commits in a row failed") as caught:
        committer.raise_if_failing()
    assert "503 SlowDown" in str(caught.value) and isinstance(caught.value.__cause__, TransientStoreError)


def test_a_synchronous_commit_raises_its_error(store, tmp_path):
    committer = _committer(store, [])
    store.failing = True
    with pytest.raises(TransientStoreError):
        committer.commit(10, _folder(tmp_path, 10), background=False)
    assert committer.records[-1]["error"] and committer.committed == []


def test_upload_hash_is_the_files_sha256(tmp_path):
    """Store.put_file hashes the bytes it sends: the manifest's sha256 without a second read."""
    store = FileStore(tmp_path / "store")
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 5000)
    assert store.put_file("blob.bin", path) == file_sha256(path)


def test_a_streak_left_by_an_earlier_process_is_cleared_by_the_first_commit(store, tmp_path):
    store.put_bytes(STATUS, json.dumps({"failures_in_a_row": 2, "step": 30, "error": "503"}).encode())
    committer = _committer(store, [])  # a new process: it knows nothing of the earlier streak
    committer.commit(40, _folder(tmp_path, 40), background=True)
    committer.wait()
    assert json.loads(store.get_bytes(STATUS))["failures_in_a_row"] == 0


def test_a_file_the_store_does_not_hold_as_sent_gets_no_manifest(tmp_path):
    """Each upload is confirmed by its size in the store before the manifest may be written."""

    class ShortStore(FileStore):
        def head(self, key):
            info = super().head(key)
            return info if info is None or not key.endswith("optimizer.pt") else type(info)(key, info.size - 1)

    store = ShortStore(tmp_path / "store")
    with pytest.raises(CheckpointError, match=r"optimizer.pt: upload not confirmed \(expected 1000 bytes"):
        commit_checkpoint(store, PREFIX, 10, _folder(tmp_path, 10), {"trial_id": "main"})
    assert not [info.key for info in store.list(PREFIX) if info.key.endswith(MANIFEST)]
