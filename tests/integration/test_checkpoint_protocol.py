"""The checkpoint commit protocol against both stores (file:// and a real S3 server): a checkpoint exists
only when its manifest and every file verify; discovery falls back past broken ones and says why."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from entrypoint.store import PrefixedStore, StoreError
from entrypoint.store.checkpoint import (
    MANIFEST,
    CheckpointError,
    Nodes,
    commit_checkpoint,
    find_latest,
    list_steps,
    rotate,
)
from entrypoint.store.s3 import S3Store
from tests.proxy import S3Proxy
from tests.s3server import Faults, create_bucket

PREFIX = "trials/t/checkpoints"
META = {"trial_id": "t", "spec_sha256": "s" * 64}


@pytest.fixture(params=["file", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def _files(folder: Path, step: int, size: int = 2048) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(step)
    (folder / "adapter_model.safetensors").write_bytes(rng.randbytes(size))
    (folder / "optimizer.pt").write_bytes(rng.randbytes(size // 2))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def _commit(store, tmp_path: Path, step: int, **kw) -> dict:
    return commit_checkpoint(store, PREFIX, step, _files(tmp_path / f"src-{step}", step, **kw), META)


def _logger():
    lines: list[str] = []
    return lines, lines.append


def test_commit_then_discover_round_trip(store, tmp_path):
    for step in (10, 20):
        _commit(store, tmp_path, step)
    lines, log = _logger()
    found = find_latest(store, PREFIX, tmp_path / "dl", log)
    assert found.step == 20 and not lines
    assert found.manifest["trial_id"] == "t" and set(found.manifest["files"]) == {
        "adapter_model.safetensors",
        "optimizer.pt",
        "trainer_state.json",
    }
    for name in found.manifest["files"]:
        assert (found.folder / name).read_bytes() == (tmp_path / "src-20" / name).read_bytes()


def test_no_checkpoint_at_all(store, tmp_path):
    assert find_latest(store, PREFIX, tmp_path / "dl", print) is None


def test_one_corrupt_byte_falls_back_and_logs_why(store, tmp_path):
    _commit(store, tmp_path, 10)
    _commit(store, tmp_path, 20)
    key = f"{PREFIX}/step-00000020/optimizer.pt"
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(key, bytes(data))
    lines, log = _logger()
    found = find_latest(store, PREFIX, tmp_path / "dl", log)
    assert found.step == 10
    assert len(lines) == 1 and lines[0].startswith("checkpoint step 20: optimizer.pt does not match its sha256")
    assert lines[0].endswith("; falling back to an older checkpoint")


def _flip(body: bytes, at: int = 100) -> bytes:
    return body[:at] + bytes([body[at] ^ 0x01]) + body[at + 1 :]


def _two_steps_on_s3(s3_server: str, tmp_path: Path) -> tuple[str, S3Store]:
    """Steps 10 and 20 committed to a fresh bucket on moto: the bucket and a store reaching it directly."""
    bucket = create_bucket(s3_server)
    direct = S3Store.from_uri(f"s3://{bucket}/r", endpoint_url=s3_server)
    for step in (10, 20):
        _commit(direct, tmp_path, step)
    return bucket, direct


def _step_20_optimizer(method: str, path: str) -> bool:
    return method == "GET" and path.split("?")[0].endswith("step-00000020/optimizer.pt")


def test_a_bit_flipped_in_transit_is_downloaded_again_and_withdraws_nothing(s3_server, tmp_path):
    """One download of step 20's optimizer.pt has a flipped bit (a proxy between rentune and a real S3
    server): it is downloaded again, verifies, and step 20 is the checkpoint found, not withdrawn."""
    bucket, direct = _two_steps_on_s3(s3_server, tmp_path)
    flipped = []

    def once(method: str, path: str, body: bytes) -> bytes:
        if _step_20_optimizer(method, path) and not flipped:
            flipped.append(path)
            return _flip(body)
        return body

    with S3Proxy(s3_server, mangle=once) as proxy:
        through = S3Store.from_uri(f"s3://{bucket}/r", endpoint_url=proxy.endpoint_url)
        lines, log = _logger()
        found = find_latest(through, PREFIX, tmp_path / "dl", log)
    assert flipped and found.step == 20 and not lines
    assert direct.head(f"{PREFIX}/step-00000020/{MANIFEST}") is not None
    assert direct.head(f"{PREFIX}/step-00000020/REJECTED.json") is None


def test_bytes_that_differ_on_every_download_are_an_error_and_stored_bytes_that_are_wrong_withdraw(s3_server, tmp_path):
    bucket, direct = _two_steps_on_s3(s3_server, tmp_path)
    gets = []

    def each_time_another(method: str, path: str, body: bytes) -> bytes:
        if _step_20_optimizer(method, path):
            gets.append(path)
            return _flip(body, 100 + len(gets))
        return body

    with S3Proxy(s3_server, mangle=each_time_another) as proxy:
        through = S3Store.from_uri(f"s3://{bucket}/r", endpoint_url=proxy.endpoint_url)
        with pytest.raises(CheckpointError, match="3 downloads gave different bytes"):
            find_latest(through, PREFIX, tmp_path / "dl", print)
    assert len(gets) == 3 and direct.head(f"{PREFIX}/step-00000020/{MANIFEST}") is not None

    key = f"{PREFIX}/step-00000020/optimizer.pt"  # now the stored bytes themselves are wrong
    direct.put_bytes(key, _flip(direct.get_bytes(key)))
    lines, log = _logger()
    assert find_latest(direct, PREFIX, tmp_path / "dl2", log).step == 10
    assert "optimizer.pt does not match its sha256" in lines[0]
    assert direct.head(f"{PREFIX}/step-00000020/{MANIFEST}") is None  # withdrawn: REJECTED.json says why
    assert "does not match" in json.loads(direct.get_bytes(f"{PREFIX}/step-00000020/REJECTED.json"))["reason"]


def test_deleted_object_falls_back_and_logs_why(store, tmp_path):
    _commit(store, tmp_path, 10)
    _commit(store, tmp_path, 20)
    store.delete(f"{PREFIX}/step-00000020/adapter_model.safetensors")
    lines, log = _logger()
    assert find_latest(store, PREFIX, tmp_path / "dl", log).step == 10
    assert "adapter_model.safetensors is missing" in lines[0]


def test_truncated_file_and_missing_manifest_and_garbage_manifest(store, tmp_path):
    _commit(store, tmp_path, 10)
    _commit(store, tmp_path, 20)
    _commit(store, tmp_path, 30)
    store.put_bytes(f"{PREFIX}/step-00000030/optimizer.pt", b"short")
    store.put_bytes(f"{PREFIX}/step-00000040/optimizer.pt", b"upload never finished")
    store.put_bytes(f"{PREFIX}/step-00000050/{MANIFEST}", b"{not json")
    lines, log = _logger()
    assert find_latest(store, PREFIX, tmp_path / "dl", log).step == 20
    assert [line.split(":")[0] for line in lines] == ["checkpoint step 50", "checkpoint step 40", "checkpoint step 30"]
    assert "unreadable manifest" in lines[0] and "no manifest" in lines[1] and "has 5 bytes" in lines[2]


@pytest.mark.parametrize("damage", ["truncated", "not-a-mapping", "wrong-step"])
def test_unreadable_manifest_is_withdrawn_so_the_step_can_be_committed_again(store, tmp_path, damage):
    """A truncated manifest is withdrawn like one that fails verification: training that reaches the step
    again commits it (before, the commit read the broken manifest and failed on every rerun)."""
    _commit(store, tmp_path, 10)
    manifest = _commit(store, tmp_path, 20)
    body = json.dumps(manifest).encode()
    broken = {
        "truncated": body[: len(body) // 2],
        "not-a-mapping": b"[1]",
        "wrong-step": body.replace(b'"step": 20', b'"step": 7'),
    }
    store.put_bytes(f"{PREFIX}/step-00000020/{MANIFEST}", broken[damage])
    lines, log = _logger()
    assert find_latest(store, PREFIX, tmp_path / "dl", log).step == 10
    assert lines[0].startswith("checkpoint step 20: ") and "falling back" in lines[0]
    assert store.head(f"{PREFIX}/step-00000020/{MANIFEST}") is None
    assert "REJECTED.json" in list_steps(store, PREFIX)[20]
    again = _commit(store, tmp_path, 20)
    assert again["files"] == manifest["files"]
    assert find_latest(store, PREFIX, tmp_path / "dl2", log).step == 20


def test_rotation_keeps_the_last_k_valid_and_clears_older_debris(store, tmp_path):
    for step in (10, 20, 30, 40):
        _commit(store, tmp_path, step)
    store.put_bytes(f"{PREFIX}/step-00000015/optimizer.pt", b"debris of a killed upload")
    store.put_bytes(f"{PREFIX}/step-00000045/optimizer.pt", b"maybe another writer, in progress")
    deleted = rotate(store, PREFIX, keep=2, log=lambda m: None)
    assert deleted == [10, 15, 20]
    assert sorted(list_steps(store, PREFIX)) == [30, 40, 45]
    assert find_latest(store, PREFIX, tmp_path / "dl", lambda m: None).step == 40


def test_two_writers_racing_for_one_manifest(store, tmp_path):
    """Exactly one manifest wins. A writer with the same files gets the winner's manifest; a writer with
    different files is told so (the 412 from S3 or EEXIST on disk is handled, not raised raw)."""
    a, b = _files(tmp_path / "a", 1), _files(tmp_path / "b", 2)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def write(name: str, folder: Path) -> None:
        barrier.wait()
        try:
            outcomes[name] = commit_checkpoint(store, PREFIX, 7, folder, {**META, "writer": name})
        except CheckpointError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=write, args=(n, f)) for n, f in (("a", a), ("b", b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [n for n, o in outcomes.items() if isinstance(o, dict)]
    assert len(winners) == 1, outcomes
    stored = json.loads(store.get_bytes(f"{PREFIX}/step-00000007/{MANIFEST}"))
    assert stored["writer"] == winners[0]
    # The same content again is accepted and returns the manifest that won.
    same = commit_checkpoint(store, PREFIX, 7, tmp_path / winners[0], {**META, "writer": "late"})
    assert same["writer"] == winners[0]


def test_commit_survives_injected_throttling(s3_store, tmp_path):
    faults = Faults(rate=0.3, seed=7)
    s3_store.client.meta.events.register("before-send.s3", faults)
    try:
        _commit(s3_store, tmp_path, 10, size=12 << 20)  # 12 MiB: multipart at the test's 5 MiB parts
    finally:
        s3_store.client.meta.events.unregister("before-send.s3", faults)
    assert faults.injected > 0
    assert find_latest(s3_store, PREFIX, tmp_path / "dl", print).step == 10


UPLOADER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from entrypoint.store.checkpoint import commit_checkpoint
    from entrypoint.store.s3 import S3Store
    store = S3Store.from_uri(sys.argv[1], endpoint_url=sys.argv[2], addressing_style="path",
                             multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=2)
    lock = threading.Lock()  # multipart parts go from several threads: one whole line at a time
    def announce(request, **kwargs):  # one line per HTTP request, so the test can kill between any two
        with lock:
            print("request", request.method, flush=True)
        time.sleep(0.05)
    store.client.meta.events.register("before-send.s3", announce)
    commit_checkpoint(store, sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]), {"trial_id": "t"})
    print("committed", flush=True)
    """
)


def _uploader(uri: str, endpoint: str, step: int, folder: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", UPLOADER, uri, endpoint, PREFIX, str(step), str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_sigkill_during_upload_never_leaves_a_usable_partial_checkpoint(s3_store, s3_server, tmp_path):
    """Kill the uploading process after a random one of its HTTP requests, many times: discovery never
    raises, always returns the previous valid checkpoint, and no killed step has a manifest."""
    uri = f"s3://{s3_store.bucket}/{s3_store.prefix}"
    _commit(s3_store, tmp_path, 1)
    big = _files(tmp_path / "big", 2, size=12 << 20)  # 12 MiB + 6 MiB: multipart, a dozen requests
    complete = _uploader(uri, s3_server, 99, big)
    requests = [line for line in complete.communicate()[0].splitlines() if line.startswith("request")]
    assert complete.returncode == 0 and requests[-1] == "request PUT"  # the manifest is the last request
    assert find_latest(s3_store, PREFIX, tmp_path / "dl", print).step == 99
    s3_store.delete(f"{PREFIX}/step-00000099/{MANIFEST}")

    rng = random.Random(2024)
    for attempt in range(12):
        step = 100 + attempt
        kill_after = rng.randint(1, len(requests) - 3)  # the manifest PUT is never reached
        proc = _uploader(uri, s3_server, step, big)
        for _ in range(kill_after):
            assert proc.stdout.readline().startswith("request")
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert s3_store.head(f"{PREFIX}/step-{step:08d}/{MANIFEST}") is None, (attempt, kill_after)
        lines, log = _logger()
        found = find_latest(s3_store, PREFIX, tmp_path / "dl", log)
        assert found.step == 1, (attempt, kill_after, lines)
    assert all(MANIFEST not in names for step, names in list_steps(s3_store, PREFIX).items() if step >= 99)


def test_prefixed_job_store_confines_checkpoints(file_store, tmp_path):
    job = PrefixedStore(file_store, "jobs/a")
    _commit(job, tmp_path, 5)
    assert all(info.key.startswith("jobs/a/trials/") for info in file_store.list(""))


def test_a_rejected_step_can_be_committed_again_and_a_committed_one_is_never_overwritten(store, tmp_path):
    _commit(store, tmp_path, 10)
    _commit(store, tmp_path, 20)
    before = store.get_bytes(f"{PREFIX}/step-00000010/optimizer.pt")
    with pytest.raises(CheckpointError, match="another writer committed different files"):
        commit_checkpoint(store, PREFIX, 10, _files(tmp_path / "other", 99), META)
    assert store.get_bytes(f"{PREFIX}/step-00000010/optimizer.pt") == before  # nothing re-uploaded

    store.put_bytes(f"{PREFIX}/step-00000020/optimizer.pt", b"corrupted")
    lines, log = _logger()
    assert find_latest(store, PREFIX, tmp_path / "dl", log).step == 10
    assert "has 9 bytes" in json.loads(store.get_bytes(f"{PREFIX}/step-00000020/REJECTED.json"))["reason"]
    _commit(store, tmp_path, 20)  # training reached step 20 again: the step is committed afresh
    assert find_latest(store, PREFIX, tmp_path / "dl", log).step == 20


@pytest.mark.parametrize("name", ["/tmp/escaped-by-manifest", "../escaped", "a/../../escaped"])
def test_a_manifest_naming_a_path_outside_the_folder_is_skipped_and_writes_nothing(store, tmp_path, name):
    _commit(store, tmp_path, 10)
    store.put_bytes(f"{PREFIX}/step-00000020/{name.lstrip('/').replace('..', 'x')}", b"payload")
    manifest = {"step": 20, "files": {name: {"size": 7, "sha256": "0" * 64}}}
    store.put_bytes(f"{PREFIX}/step-00000020/{MANIFEST}", json.dumps(manifest).encode())
    lines, log = _logger()
    assert find_latest(store, PREFIX, tmp_path / "dl" / "deep", log).step == 10
    assert "unsafe file name" in lines[0]
    assert not Path("/tmp/escaped-by-manifest").exists() and not (tmp_path / "dl" / "escaped").exists()


# Across nodes: each node commits its own files into the step folder and reports them; node 0 writes the
# one manifest after every report of the same launch.


def _node_files(folder: Path, node: int, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / f"rng_state_{node}.pth").write_bytes(random.Random(node * 1000 + step).randbytes(512))
    if node == 0:
        _files(folder, step)
    return folder


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_node_zero_waits_for_every_node_and_lists_every_rank_file(store, tmp_path):
    launch = "launch-a"
    nodes = [Nodes(node=k, count=3, launch_id=launch, wait_s=60) for k in range(3)]
    folders = [_node_files(tmp_path / f"node-{k}", k, 10) for k in range(3)]
    lead, out = _in_thread(lambda: commit_checkpoint(store, PREFIX, 10, folders[0], META, nodes=nodes[0]))
    for k in (2, 1):  # node 0 is already waiting; the others report in any order
        report = commit_checkpoint(store, PREFIX, 10, folders[k], META, nodes=nodes[k])
        assert set(report["files"]) == {f"rng_state_{k}.pth"} and report["launch_id"] == launch
        assert store.head(f"{PREFIX}/step-00000010/{MANIFEST}") is None or k == 1
    lead.join(timeout=60)
    manifest = out["value"]
    assert {f"rng_state_{k}.pth" for k in range(3)} | {"adapter_model.safetensors"} <= set(manifest["files"])
    found = find_latest(store, PREFIX, tmp_path / "dl", lambda line: None)
    assert (
        found.step == 10
        and (found.folder / "rng_state_2.pth").read_bytes() == (folders[2] / "rng_state_2.pth").read_bytes()
    )


def test_a_report_of_an_earlier_launch_does_not_count(store, tmp_path):
    old = Nodes(node=1, count=2, launch_id="earlier")
    commit_checkpoint(store, PREFIX, 10, _node_files(tmp_path / "old-1", 1, 10), META, nodes=old)
    lead = Nodes(node=0, count=2, launch_id="now", wait_s=1.0)
    with pytest.raises(CheckpointError, match="node 1 did not report"):
        commit_checkpoint(store, PREFIX, 10, _node_files(tmp_path / "node-0", 0, 10), META, nodes=lead)
    assert store.head(f"{PREFIX}/step-00000010/{MANIFEST}") is None  # no manifest: the step does not exist


def test_a_node_that_cannot_upload_fails_node_zeros_commit_with_its_error(file_store, tmp_path, monkeypatch):
    def full(key, path):
        raise StoreError(f"{key}: no space left on device (injected)")

    with monkeypatch.context() as patch:
        patch.setattr(file_store, "put_file", full)
        with pytest.raises(StoreError, match="no space left"):
            nodes = Nodes(node=1, count=2, launch_id="x")
            commit_checkpoint(file_store, PREFIX, 10, _node_files(tmp_path / "node-1", 1, 10), META, nodes=nodes)
    lead = Nodes(node=0, count=2, launch_id="x", wait_s=30)
    with pytest.raises(CheckpointError, match="node 1 could not commit its files: StoreError: .*no space left"):
        commit_checkpoint(file_store, PREFIX, 10, _node_files(tmp_path / "node-0", 0, 10), META, nodes=lead)


def test_two_nodes_holding_one_file_with_different_bytes_is_refused(store, tmp_path):
    other = _node_files(tmp_path / "node-1", 1, 10)
    (other / "trainer_state.json").write_text('{"global_step": 999}')  # node 0 holds it too, differently
    commit_checkpoint(store, PREFIX, 10, other, META, nodes=Nodes(node=1, count=2, launch_id="x"))
    lead = Nodes(node=0, count=2, launch_id="x", wait_s=30)
    with pytest.raises(CheckpointError, match="node 1 wrote a different trainer_state.json"):
        commit_checkpoint(store, PREFIX, 10, _node_files(tmp_path / "node-0", 0, 10), META, nodes=lead)
