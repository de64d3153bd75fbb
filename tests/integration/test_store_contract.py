"""One contract for every Store backend (file://, and s3:// on a real moto server and on a real SeaweedFS
server), then S3-only behaviour on moto: injected throttling, error translation, configuration from the
environment, stale multipart uploads."""

from __future__ import annotations

import hashlib
import inspect
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from entrypoint.store import check_conditional_writes, open_store
from entrypoint.store.base import (
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    PrefixedStore,
    Store,
    StoreError,
    StoreUnusable,
    TransientStoreError,
)
from entrypoint.store.checkpoint import upload_files
from entrypoint.store.s3 import CONFLICT_RETRIES, S3Store
from tests.integration.conftest import TEST_PART_SIZE
from tests.s3server import CutShort, Faults, create_bucket, raw_client

MiB = 1 << 20
BIG_SIZE = 12 * MiB  # > TEST_PART_SIZE: 3 parts up, 3 ranged GETs down


def _random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@dataclass
class Backend:
    name: str
    store: Store
    snapshot: Callable[[], set[str]]  # everything in the backing storage, inside the store or not


# Each S3 backend: the fixture giving a store in a fresh bucket, and the one giving the server's endpoint.
S3_BACKENDS = {"moto": ("s3_store", "s3_server"), "seaweedfs": ("seaweed_store", "seaweed_server")}


@pytest.fixture(params=["file", *S3_BACKENDS])
def backend(request, tmp_path) -> Backend:
    if request.param == "file":
        store = request.getfixturevalue("file_store")
        return Backend("file", store, lambda: {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")})
    store_fixture, server_fixture = S3_BACKENDS[request.param]
    store = request.getfixturevalue(store_fixture)
    raw = raw_client(request.getfixturevalue(server_fixture))

    def snapshot() -> set[str]:
        found = {
            obj["Key"]
            for page in raw.get_paginator("list_objects_v2").paginate(Bucket=store.bucket)
            for obj in page.get("Contents", ())
        }
        uploads = raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads", ())
        return found | {"upload:" + upload["Key"] for upload in uploads}

    return Backend(request.param, store, snapshot)


@pytest.fixture
def store(backend) -> Store:
    return backend.store


@pytest.fixture
def local(tmp_path) -> Path:
    """A folder for local source and destination files, outside any store."""
    path = tmp_path / "local"
    path.mkdir()
    return path


# --- The contract -------------------------------------------------------------------------------------


def test_implements_the_protocol(store):
    assert isinstance(store, Store)
    assert store.uri.startswith(("file://", "s3://"))


def test_bytes_round_trip_and_overwrite(store):
    payload = bytes(range(256)) * 3
    store.put_bytes("jobs/j1/state.json", payload)
    assert store.get_bytes("jobs/j1/state.json") == payload
    store.put_bytes("jobs/j1/state.json", b"second")
    assert store.get_bytes("jobs/j1/state.json") == b"second"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""
    assert store.head("empty") == ObjectInfo(key="empty", size=0)


@pytest.mark.parametrize(
    "size",
    [0, 1000, TEST_PART_SIZE - 1, TEST_PART_SIZE, 2 * TEST_PART_SIZE, BIG_SIZE],
    ids=["empty", "small", "below-part", "one-part", "two-parts-exactly", "multipart"],
)
def test_file_round_trip(store, local, size):
    data = _random_bytes(size, seed=size)
    src = local / "src.bin"
    src.write_bytes(data)
    sent = store.put_file("trials/t1/checkpoints/step-00000010/model.safetensors", src)
    assert sent == hashlib.sha256(data).hexdigest()  # the hash of what was read for the upload
    assert store.head("trials/t1/checkpoints/step-00000010/model.safetensors").size == size

    dest = local / "nested" / "dir" / "model.safetensors"
    got = store.get_file("trials/t1/checkpoints/step-00000010/model.safetensors", dest)
    assert got == hashlib.sha256(dest.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()  # its sha256
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.safetensors"]  # no temp file left


def test_get_file_replaces_existing_destination(store, local):
    store.put_bytes("a.json", b'{"new": true}')
    dest = local / "a.json"
    dest.write_bytes(b"old content that is longer than the new one")
    store.get_file("a.json", dest)
    assert dest.read_bytes() == b'{"new": true}'


def test_missing_key(store, local):
    with pytest.raises(ObjectNotFound, match="nope/missing.json"):
        store.get_bytes("nope/missing.json")
    dest = local / "out.json"
    with pytest.raises(ObjectNotFound):
        store.get_file("nope/missing.json", dest)
    assert list(local.iterdir()) == []  # neither the destination nor a temp file
    assert store.head("nope/missing.json") is None
    assert list(store.list("nope")) == []
    store.delete("nope/missing.json")  # absent is not an error


def test_missing_local_file_is_a_local_error(store, local):
    with pytest.raises(FileNotFoundError) as info:
        store.put_file("x.bin", local / "does-not-exist.bin")
    assert not isinstance(info.value, StoreError)
    assert store.head("x.bin") is None


def test_head_list_delete(store):
    contents = {"a/b/c.json": b"abc", "a/d.bin": b"dddd", "ab/e": b"e", "z": b""}
    for key, data in contents.items():
        store.put_bytes(key, data)

    assert store.head("a/d.bin") == ObjectInfo(key="a/d.bin", size=4)
    assert store.head("a") is None  # a "directory" is not an object
    assert store.head("a/b/c.json/more") is None

    everything = {info.key: info.size for info in store.list()}
    assert everything == {key: len(data) for key, data in contents.items()}
    # A prefix is directory-like: "a" does not take in "ab/e".
    assert sorted(info.key for info in store.list("a")) == ["a/b/c.json", "a/d.bin"]
    assert [info.key for info in store.list("a/b")] == ["a/b/c.json"]
    assert list(store.list("a/b/c.json")) == [ObjectInfo(key="a/b/c.json", size=3)]
    assert list(store.list("a/b/c")) == []

    store.delete("a/d.bin")
    assert store.head("a/d.bin") is None
    with pytest.raises(ObjectNotFound):
        store.get_bytes("a/d.bin")
    assert sorted(info.key for info in store.list()) == ["a/b/c.json", "ab/e", "z"]
    store.delete("a/d.bin")


def test_put_if_absent(store):
    store.put_if_absent("jobs/j1/claim.json", b"worker-1")
    with pytest.raises(ObjectExists, match="jobs/j1/claim.json"):
        store.put_if_absent("jobs/j1/claim.json", b"worker-2")
    assert store.get_bytes("jobs/j1/claim.json") == b"worker-1"

    store.put_bytes("jobs/j2/claim.json", b"plain put")
    with pytest.raises(FileExistsError):  # ObjectExists is also a FileExistsError
        store.put_if_absent("jobs/j2/claim.json", b"worker-3")
    assert store.get_bytes("jobs/j2/claim.json") == b"plain put"


def _race(store: Store, key: str, writers: int) -> list[int]:
    """`writers` threads released together, each trying put_if_absent(key); returns the winners."""
    barrier = threading.Barrier(writers)

    def attempt(writer: int) -> int | None:
        barrier.wait(timeout=30)
        try:
            store.put_if_absent(key, f"writer-{writer}".encode())
        except ObjectExists:
            return None
        return writer

    with ThreadPoolExecutor(max_workers=writers) as pool:
        return [w for w in pool.map(attempt, range(writers)) if w is not None]


def test_put_if_absent_race_has_exactly_one_winner(backend):
    if backend.name == "moto":  # the server's atomicity is what this checks; rentune sends one conditional PUT
        pytest.skip(
            "moto checks If-None-Match and then writes, without a lock (moto/s3/responses.py): under load two "
            "concurrent writers can both win there (seen once in a suite run: round 4, two winners). Checked on "
            "file:// and SeaweedFS"
        )
    store = backend.store
    for round_ in range(10):
        key = f"claims/round-{round_}.json"
        winners = _race(store, key, writers=8)
        assert len(winners) == 1, f"round {round_}: winners {winners}"
        assert store.get_bytes(key) == f"writer-{winners[0]}".encode()


def test_conditional_write_check_passes_and_leaves_nothing(store):
    """Every backend honours If-None-Match (or its file equivalent): the start-up check passes on it."""
    check_conditional_writes(store, "scratch")
    assert list(store.list()) == []


BAD_KEYS = ["../escape", "a/../../escape", "a/./b", "a//b", "a/", "./a", "a\\..\\escape", "nul\x00byte"]


@pytest.mark.parametrize("bad", [*BAD_KEYS, "", "ABSOLUTE"])
def test_unsafe_keys_are_refused_and_nothing_is_written(backend, local, tmp_path, bad):
    store = backend.store
    if bad == "ABSOLUTE":
        bad = str(tmp_path / "absolute-target")
    src = local / "src.bin"
    src.write_bytes(b"payload")
    before = backend.snapshot()
    operations = {
        "put_bytes": lambda: store.put_bytes(bad, b"x"),
        "put_if_absent": lambda: store.put_if_absent(bad, b"x"),
        "get_bytes": lambda: store.get_bytes(bad),
        "put_file": lambda: store.put_file(bad, src),
        "get_file": lambda: store.get_file(bad, local / "out.bin"),
        "head": lambda: store.head(bad),
        "delete": lambda: store.delete(bad),
    }
    if bad:  # list("") means the whole store
        operations["list"] = lambda: list(store.list(bad))
    for name, operation in operations.items():
        with pytest.raises(InvalidKey):
            operation()
            pytest.fail(f"{name}({bad!r}) was accepted")
    assert backend.snapshot() == before
    assert not (tmp_path / "escape").exists() and not (tmp_path / "absolute-target").exists()


def test_prefixed_store_is_confined(store):
    view = PrefixedStore(store, "jobs/j1")
    assert view.uri == store.uri.rstrip("/") + "/jobs/j1"
    view.put_bytes("phases/data/result.json", b"r")
    store.put_bytes("jobs/j1x/sibling", b"s")
    store.put_bytes("jobs/j2/other", b"o")

    assert store.get_bytes("jobs/j1/phases/data/result.json") == b"r"
    assert [info.key for info in view.list()] == ["phases/data/result.json"]
    assert [info.key for info in view.list("phases")] == ["phases/data/result.json"]
    assert view.head("phases/data/result.json") == ObjectInfo(key="phases/data/result.json", size=1)
    for bad in ["../j2/other", "../j1x/sibling", "/jobs/j2/other", ""]:
        with pytest.raises(InvalidKey):
            view.get_bytes(bad)
    with pytest.raises(InvalidKey):
        PrefixedStore(store, "jobs/../..")
    view.delete("phases/data/result.json")
    assert list(view.list()) == []
    assert store.get_bytes("jobs/j1x/sibling") == b"s"


# --- S3 only: hostile listings --------------------------------------------------------------------------

HOSTILE_SUFFIXES = ["../../x", "../x", "a/../../../x", "a//b", "a/./b", "/leading"]


@pytest.mark.parametrize("suffix", HOSTILE_SUFFIXES)
def test_listed_unsafe_key_is_refused(s3_store, s3_server, suffix):
    raw = raw_client(s3_server)
    hostile = f"{s3_store.prefix}/{suffix}"
    s3_store.put_bytes("a/fine.json", b"ok")
    raw.put_object(Bucket=s3_store.bucket, Key=hostile, Body=b"evil")
    listed = {o["Key"] for o in raw.list_objects_v2(Bucket=s3_store.bucket)["Contents"]}
    assert hostile in listed, f"the server normalised {hostile!r}; this test would prove nothing"

    with pytest.raises(InvalidKey, match="refused listed key"):
        list(s3_store.list())
    if suffix.startswith("a/"):  # also when listing just the folder it hides in, or through a view of it
        with pytest.raises(InvalidKey):
            list(s3_store.list("a"))
        with pytest.raises(InvalidKey):
            list(PrefixedStore(s3_store, "a").list())


def test_fetch_that_meets_a_planted_key_names_it_and_fetches_nothing(s3_store, s3_server, tmp_path):
    """`rentune fetch`, the installed entry point as a real process: one hostile name among a job's report
    files refuses the whole download (no file could be written outside the destination), and says which
    name and that nothing was fetched."""
    s3_store.put_bytes("jobs/j/report/results.json", b"{}")
    hostile = f"{s3_store.prefix}/jobs/j/report/../../../x"
    raw_client(s3_server).put_object(Bucket=s3_store.bucket, Key=hostile, Body=b"evil")
    rentune = Path(sys.executable).parent / "rentune"
    store = ["--store", f"s3://{s3_store.bucket}/{s3_store.prefix}", "--endpoint-url", s3_server]
    dest = tmp_path / "dest"
    done = subprocess.run(
        [rentune, "fetch", "j", *store, "--addressing-style", "path", "--dest", str(dest)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "report/../../../x" in done.stderr and "nothing was fetched" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not dest.exists() and not (tmp_path / "x").exists()


def test_objects_outside_the_prefix_are_invisible(s3_store, s3_server):
    raw = raw_client(s3_server)
    for key in ["outside", f"{s3_store.prefix}x/sibling", s3_store.prefix]:
        raw.put_object(Bucket=s3_store.bucket, Key=key, Body=b"not ours")
    s3_store.put_bytes("inside", b"ours")
    assert list(s3_store.list()) == [ObjectInfo(key="inside", size=4)]


# --- S3 only: multipart, faults, error translation ------------------------------------------------------


def _sibling(s3_store: S3Store, endpoint: str, **options) -> S3Store:
    """Another S3Store on the same bucket and prefix with different transfer or retry settings."""
    settings = {"multipart_threshold": TEST_PART_SIZE, "multipart_chunksize": TEST_PART_SIZE}
    settings.update(options)
    return S3Store(s3_store.bucket, s3_store.prefix, endpoint_url=endpoint, addressing_style="path", **settings)


def test_large_file_really_goes_in_parts(s3_store, s3_server, local):
    recorder = Faults(rate=0.0)
    s3_store.client.meta.events.register("before-send.s3", recorder)
    data = _random_bytes(BIG_SIZE, seed=7)
    (local / "big.bin").write_bytes(data)
    s3_store.put_file("big.bin", local / "big.bin")
    etag = raw_client(s3_server).head_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/big.bin")["ETag"]
    assert etag.strip('"').endswith("-3")  # a multipart ETag: md5-of-md5s plus the part count
    parts = [h for method, h in recorder.requests if method == "PUT"]
    assert len(parts) == 3 and all(h.get("Expect") == b"100-continue" for h in parts)  # go-ahead first

    recorder.requests.clear()
    s3_store.get_file("big.bin", local / "copy.bin")
    ranged = [h for method, h in recorder.requests if method == "GET" and "Range" in h]
    assert len(ranged) == 3
    assert (local / "copy.bin").read_bytes() == data


def test_upload_parts_reuse_the_stores_buffers(s3_store, s3_server, local):
    data = _random_bytes(BIG_SIZE, seed=5)
    (local / "big.bin").write_bytes(data)
    buffers = s3_store.part_buffers
    s3_store.put_file("first.bin", local / "big.bin")
    made = buffers.made
    assert 1 <= made <= buffers.limit
    for name in ("second.bin", "third.bin"):
        assert s3_store.put_file(name, local / "big.bin") == hashlib.sha256(data).hexdigest()
    assert buffers.made == made and buffers.in_use == 0  # no new part buffer: no fresh memory per part
    raw = raw_client(s3_server)
    assert raw.get_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/third.bin")["Body"].read() == data


def test_files_going_up_together_share_a_small_pool_of_buffers(s3_store, s3_server, local):
    """Four 3-part files at once through 2 buffers (max_concurrency=1): each waits its turn for a buffer,
    none deadlocks, and every file arrives whole with its own sha256."""
    store = _sibling(s3_store, s3_server, max_concurrency=1)
    files = {f"f{i}.bin": _random_bytes(BIG_SIZE, seed=30 + i) for i in range(4)}
    for name, data in files.items():
        (local / name).write_bytes(data)
    sent = upload_files(store, "together", {name: local / name for name in files}, threads=4)
    assert {name: info["sha256"] for name, info in sent.items()} == {
        name: hashlib.sha256(data).hexdigest() for name, data in files.items()
    }
    assert store.part_buffers.made == 2 and store.part_buffers.in_use == 0
    raw = raw_client(s3_server)
    for name, data in files.items():
        assert raw.get_object(Bucket=store.bucket, Key=f"{store.prefix}/together/{name}")["Body"].read() == data


@pytest.mark.parametrize(
    "status, code, error", [(403, "AccessDenied", StoreUnusable), (503, "SlowDown", TransientStoreError)]
)
def test_a_failed_part_aborts_the_upload(s3_store, s3_server, local, status, code, error):
    (local / "big.bin").write_bytes(_random_bytes(BIG_SIZE, seed=9))
    store = _sibling(s3_store, s3_server, max_attempts=2)
    faults = Faults(rate=1.0, status=status, code=code, only=lambda request: "partNumber=2&" in request.url + "&")
    store.client.meta.events.register("before-send.s3", faults)
    with pytest.raises(error, match=f"s3://{store.bucket}/{store.prefix}/big.bin: upload failed: .*{code}"):
        store.put_file("big.bin", local / "big.bin")
    assert faults.injected >= 1
    raw = raw_client(s3_server)
    assert raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []  # aborted, not left billed
    assert store.head("big.bin") is None
    assert store.part_buffers.in_use == 0  # every buffer back, for the next commit


def test_part_checksums_when_the_client_sends_checksums(s3_store, s3_server, local, monkeypatch):
    """With botocore's `when_supported` (a user's AWS_REQUEST_CHECKSUM_CALCULATION), the upload is created
    with CRC32 and its completion lists every part's CRC32, as S3 requires of such an upload."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    store = _sibling(s3_store, s3_server)
    seen: list[tuple[str, str, dict, bytes]] = []
    store.client.meta.events.register(
        "before-send.s3", lambda request, **_: seen.append((request.method, request.url, request.headers, request.body))
    )
    data = _random_bytes(BIG_SIZE, seed=13)
    (local / "big.bin").write_bytes(data)
    assert store.put_file("big.bin", local / "big.bin") == hashlib.sha256(data).hexdigest()
    create = [h for method, url, h, _ in seen if method == "POST" and url.endswith("?uploads")]
    assert [h.get("x-amz-checksum-algorithm") for h in create] == [b"CRC32"]
    assert len([url for method, url, _, _ in seen if method == "PUT" and "partNumber=" in url]) == 3
    (complete,) = [body for method, url, _, body in seen if method == "POST" and "uploadId=" in url]
    assert complete.count(b"<ChecksumCRC32>") == 3
    stored = raw_client(s3_server).get_object(Bucket=store.bucket, Key=f"{store.prefix}/big.bin")["Body"].read()
    assert stored == data


def test_transfers_survive_throttling(s3_store, s3_server, local):
    faults = Faults(rate=0.3, seed=20240601)
    s3_store.client.meta.events.register("before-send.s3", faults)
    data = _random_bytes(BIG_SIZE, seed=11)
    (local / "big.bin").write_bytes(data)
    s3_store.put_file("ckpt/big.bin", local / "big.bin")
    got = s3_store.get_file("ckpt/big.bin", local / "copy.bin")  # parts retried, then hashed
    assert got == hashlib.sha256((local / "copy.bin").read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    small = {f"small/{i}.json": _random_bytes(100 + i, seed=i) for i in range(6)}
    for key, payload in small.items():
        s3_store.put_bytes(key, payload)
    for key, payload in small.items():
        assert s3_store.get_bytes(key) == payload
    assert {i.key: i.size for i in s3_store.list("small")} == {k: len(v) for k, v in small.items()}

    raw = raw_client(s3_server)  # what the server holds, read without faults
    stored = raw.get_object(Bucket=s3_store.bucket, Key=f"{s3_store.prefix}/ckpt/big.bin")["Body"].read()
    assert stored == data
    assert faults.injected >= 3, f"only {faults.injected} of {faults.sent} requests failed: nothing tested"


def test_a_part_cut_short_is_asked_for_again_from_where_it_stopped(s3_store, s3_server, local):
    """The second part's body ends halfway: the download asks for the rest of that
    part only (a range starting past the part's start), and the file arrives whole with its sha256."""
    data = _random_bytes(BIG_SIZE, seed=17)
    (local / "big.bin").write_bytes(data)
    s3_store.put_file("cut.bin", local / "big.bin")
    cut = CutShort(data, TEST_PART_SIZE, TEST_PART_SIZE + 1)
    s3_store.client.meta.events.register("before-send.s3", cut)
    got = s3_store.get_file("cut.bin", local / "copy.bin")
    assert cut.cut == 1
    assert got == hashlib.sha256(data).hexdigest() and (local / "copy.bin").read_bytes() == data
    again = [first for first, last in cut.ranges if TEST_PART_SIZE < first < 2 * TEST_PART_SIZE]
    assert again == [TEST_PART_SIZE + TEST_PART_SIZE // 2]  # the bytes already written are not fetched again


def test_a_part_that_keeps_stopping_short_fails_the_download_and_leaves_no_file(s3_store, s3_server, local):
    from entrypoint.store.s3_download import ATTEMPTS

    data = _random_bytes(BIG_SIZE, seed=19)
    (local / "big.bin").write_bytes(data)
    s3_store.put_file("cut.bin", local / "big.bin")
    cut = CutShort(data, 0, TEST_PART_SIZE, times=10**6)  # every request of the first part
    s3_store.client.meta.events.register("before-send.s3", cut)
    with pytest.raises(TransientStoreError, match=f"s3://{s3_store.bucket}/{s3_store.prefix}/cut.bin: download"):
        s3_store.get_file("cut.bin", local / "copy.bin")
    starts = [first for first, _ in cut.ranges if first < TEST_PART_SIZE]
    assert cut.cut == len(starts) == ATTEMPTS
    assert starts == sorted(set(starts))  # each try from the byte the one before reached
    assert not (local / "copy.bin").exists() and list(local.glob(".tmp-*")) == []


@pytest.mark.parametrize(
    "operation",
    ["put_bytes", "put_if_absent", "get_bytes", "head", "list", "put_file", "put_file_multipart", "get_file"],
)
def test_errors_that_outlast_retries_are_transient(s3_store, s3_server, local, operation):
    s3_store.put_bytes("k", b"v")
    (local / "small.bin").write_bytes(b"abc")
    (local / "big.bin").write_bytes(_random_bytes(BIG_SIZE, seed=3))
    store = _sibling(s3_store, s3_server, max_attempts=1)
    faults = Faults(rate=1.0)
    store.client.meta.events.register("before-send.s3", faults)
    calls = {
        "put_bytes": lambda: store.put_bytes("k", b"x"),
        "put_if_absent": lambda: store.put_if_absent("new", b"x"),
        "get_bytes": lambda: store.get_bytes("k"),
        "head": lambda: store.head("k"),
        "list": lambda: list(store.list()),
        "put_file": lambda: store.put_file("k", local / "small.bin"),
        "put_file_multipart": lambda: store.put_file("k", local / "big.bin"),
        "get_file": lambda: store.get_file("k", local / "out.bin"),
    }
    with pytest.raises(TransientStoreError, match=f"s3://{store.bucket}/{store.prefix}"):
        calls[operation]()
    assert faults.injected >= 1
    assert s3_store.get_bytes("k") == b"v"
    assert not (local / "out.bin").exists()


def test_retries_happen_before_giving_up(s3_store, s3_server):
    s3_store.put_bytes("k", b"v")
    store = _sibling(s3_store, s3_server, max_attempts=2)
    faults = Faults(rate=1.0, status=500, code="InternalError")
    store.client.meta.events.register("before-send.s3", faults)
    with pytest.raises(TransientStoreError, match="InternalError"):
        store.get_bytes("k")
    assert faults.sent == 2


@pytest.mark.parametrize("operation", ["get_bytes", "head", "put_bytes", "list"])
def test_access_denied_is_refused_with_what_to_check_and_never_read_as_absent(s3_store, s3_server, operation):
    s3_store.put_bytes("k", b"v")
    store = _sibling(s3_store, s3_server, max_attempts=1)
    store.client.meta.events.register("before-send.s3", Faults(rate=1.0, status=403, code="AccessDenied"))
    calls = {
        "get_bytes": lambda: store.get_bytes("k"),
        "head": lambda: store.head("k"),  # must not read as "absent"
        "put_bytes": lambda: store.put_bytes("k", b"x"),
        "list": lambda: list(store.list()),
    }
    with pytest.raises(StoreUnusable) as info:  # exit 2: a setting to fix, not a failed job
        calls[operation]()
    said = str(info.value)  # (a real HEAD's 403 has no body: tests/integration/test_store_refusals.py)
    assert "access denied (AccessDenied): the credentials were accepted" in said and "s3:ListBucket" in said


def test_unreachable_endpoint_is_transient(s3_server):
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3Store("no-such-server", "p", endpoint_url=f"http://127.0.0.1:{port}", max_attempts=1)
    with pytest.raises(TransientStoreError, match="s3://no-such-server/p/k"):
        store.get_bytes("k")


def test_conditional_write_conflict_is_asked_again(s3_store):
    """A 409 ConditionalRequestConflict means another conditional write was in flight: retry, then the
    real answer decides; a conflict that never clears counts as having lost."""
    conflicts = Faults(rate=1.0, status=409, code="ConditionalRequestConflict")
    s3_store.client.meta.events.register("before-send.s3.PutObject", conflicts)
    with pytest.raises(ObjectExists, match="ConditionalRequestConflict"):
        s3_store.put_if_absent("claim.json", b"w1")
    assert conflicts.sent == CONFLICT_RETRIES + 1
    s3_store.client.meta.events.unregister("before-send.s3.PutObject", conflicts)

    once = Faults(rate=1.0, status=409, code="ConditionalRequestConflict", limit=1)
    s3_store.client.meta.events.register("before-send.s3.PutObject", once)
    s3_store.put_if_absent("claim.json", b"w2")
    assert (once.injected, once.sent) == (1, 2)
    assert s3_store.get_bytes("claim.json") == b"w2"


def test_abort_stale_uploads(s3_store, s3_server):
    raw = raw_client(s3_server)
    bucket, prefix = s3_store.bucket, s3_store.prefix
    now = datetime.now(timezone.utc)
    initiated: dict[str, datetime] = {}

    def start_upload(key: str, age_s: float) -> None:
        upload_id = raw.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        raw.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"x" * 1024)
        initiated[key] = now - timedelta(seconds=age_s)

    def real_start_times(parsed, **_kwargs):
        # moto 5.2.5 reports every upload as initiated on 2010-11-10; give back the times the test chose.
        for upload in parsed.get("Uploads", ()):
            upload["Initiated"] = initiated[upload["Key"]]

    s3_store.client.meta.events.register("after-call.s3.ListMultipartUploads", real_start_times)
    start_upload(f"{prefix}/jobs/a/step-00000001/model.safetensors", age_s=7200)
    start_upload(f"{prefix}/jobs/a/step-00000002/model.safetensors", age_s=1)
    start_upload(f"{prefix}/jobs/ab/other.bin", age_s=7200)  # a sibling of jobs/a, not under it
    start_upload("outside/the/store.bin", age_s=7200)

    def open_uploads() -> list[str]:
        return sorted(u["Key"] for u in raw.list_multipart_uploads(Bucket=bucket).get("Uploads", ()))

    assert s3_store.abort_stale_uploads("jobs/a", older_than_s=3600) == 1
    assert open_uploads() == [
        "outside/the/store.bin",
        f"{prefix}/jobs/a/step-00000002/model.safetensors",
        f"{prefix}/jobs/ab/other.bin",
    ]
    assert s3_store.abort_stale_uploads("", older_than_s=3600) == 1
    assert open_uploads() == ["outside/the/store.bin", f"{prefix}/jobs/a/step-00000002/model.safetensors"]
    assert s3_store.abort_stale_uploads("", older_than_s=0) == 1
    assert open_uploads() == ["outside/the/store.bin"]
    assert list(s3_store.list()) == []

    start_upload(f"{prefix}/jobs/../../escape", age_s=7200)
    with pytest.raises(InvalidKey):
        s3_store.abort_stale_uploads("", older_than_s=0)
    with pytest.raises(ValueError):
        s3_store.abort_stale_uploads("", older_than_s=-1)


# --- S3 only: configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix", "canonical"),
    [
        ("s3://bkt", "bkt", "", "s3://bkt"),
        ("s3://bkt/", "bkt", "", "s3://bkt"),
        ("s3://bkt/runs/team-a/", "bkt", "runs/team-a", "s3://bkt/runs/team-a"),
    ],
)
def test_from_uri(s3_server, uri, bucket, prefix, canonical):
    store = S3Store.from_uri(uri, endpoint_url=s3_server)
    assert (store.bucket, store.prefix, store.uri) == (bucket, prefix, canonical)


@pytest.mark.parametrize("uri", ["s3://", "s3:///p", "s3://bkt/a/../../x", "s3://bkt/a//b", "gs://bkt/p", "s3://b/x"])
def test_from_uri_refuses_malformed(s3_server, uri):
    with pytest.raises(InvalidKey):
        S3Store.from_uri(uri, endpoint_url=s3_server)


def test_open_store_passes_options(s3_server):
    bucket = create_bucket(s3_server)
    store = open_store(f"s3://{bucket}/root", endpoint_url=s3_server, region=None, addressing_style="path")
    assert isinstance(store, S3Store)
    store.put_bytes("x", b"1")
    assert raw_client(s3_server).get_object(Bucket=bucket, Key="root/x")["Body"].read() == b"1"


def test_endpoint_region_and_style_from_environment(s3_server, monkeypatch):
    bucket = create_bucket(s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    monkeypatch.setenv("RENTUNE_S3_ADDRESSING_STYLE", "path")
    store = S3Store.from_uri(f"s3://{bucket}/p")
    assert store.client.meta.region_name == "eu-west-3"
    assert store.client.meta.config.s3["addressing_style"] == "path"
    store.put_bytes("k", b"via the environment")
    assert raw_client(s3_server).get_object(Bucket=bucket, Key="p/k")["Body"].read() == b"via the environment"

    explicit = S3Store.from_uri(f"s3://{bucket}/p", region="ap-south-1", addressing_style="virtual")
    assert explicit.client.meta.region_name == "ap-south-1"
    assert explicit.client.meta.config.s3["addressing_style"] == "virtual"
    monkeypatch.setenv("RENTUNE_S3_ADDRESSING_STYLE", "sideways")
    with pytest.raises(StoreError, match="sideways"):
        S3Store.from_uri(f"s3://{bucket}/p")


def _checksum_headers(store: S3Store) -> set[str]:
    recorder = Faults(rate=0.0)
    store.client.meta.events.register("before-send.s3.PutObject", recorder)
    store.put_bytes("k", b"checksummed?")
    assert store.get_bytes("k") == b"checksummed?"
    (_, headers) = recorder.requests[-1]
    return {name.lower() for name in headers if "checksum" in name.lower()}


def test_checksums_only_when_required_unless_the_environment_says(s3_store, s3_server, monkeypatch):
    assert s3_store.client.meta.config.request_checksum_calculation == "when_required"
    assert s3_store.client.meta.config.response_checksum_validation == "when_required"
    assert _checksum_headers(s3_store) == set()

    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    store = _sibling(s3_store, s3_server)
    assert store.client.meta.config.request_checksum_calculation == "when_supported"
    assert any(name.startswith("x-amz-checksum-") for name in _checksum_headers(store))


def test_credentials_are_never_parameters():
    names = set(inspect.signature(S3Store).parameters) | set(inspect.signature(S3Store.from_uri).parameters)
    assert not {n for n in names if "key" in n or "secret" in n or "token" in n or "credential" in n}
