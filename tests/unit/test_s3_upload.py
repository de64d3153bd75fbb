"""entrypoint/store/s3_upload.py without a server: part sizes, the buffer pool, and the upload's order,
hashing, failures and buffer accounting against a recording fake client. Uploads to real servers are
tested in tests/integration/test_store_contract.py."""

from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from entrypoint.store.s3_upload import MAX_PARTS, PartBuffers, _Multipart, _send_parts, part_size_for, upload_hashed

MiB = 1 << 20


def test_part_size_stays_unless_the_file_needs_more_than_10000_parts():
    part = 16 * MiB
    assert part_size_for(0, part) == part
    assert part_size_for(part * MAX_PARTS, part) == part  # exactly 10,000 parts
    bigger = part_size_for(part * MAX_PARTS + 1, part)
    assert bigger % MiB == 0 and bigger > part
    assert -(-(part * MAX_PARTS + 1) // bigger) <= MAX_PARTS
    five_tb = 5 * (1 << 40)  # S3's largest object
    assert -(-five_tb // part_size_for(five_tb, part)) <= MAX_PARTS


def test_buffers_are_made_once_and_handed_out_again():
    buffers = PartBuffers(size=1024, limit=2)
    first = buffers.take()
    buffers.give(first)
    assert buffers.take() is first
    assert buffers.made == 1 and buffers.in_use == 1
    second = buffers.take()
    assert second is not first and len(second) == 1024
    assert buffers.made == 2 and buffers.in_use == 2


def test_take_waits_while_every_buffer_is_out():
    buffers = PartBuffers(size=8, limit=1)
    held = buffers.take()
    got: list[bytearray] = []
    waiter = threading.Thread(target=lambda: got.append(buffers.take()))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and got == []  # blocked: the one buffer is out
    buffers.give(held)
    waiter.join(timeout=10)
    assert got == [held] and buffers.made == 1


@pytest.mark.parametrize("size, limit", [(0, 1), (8, 0)])
def test_buffers_refuse_nonsense_sizes(size, limit):
    with pytest.raises(ValueError, match="expected both >= 1"):
        PartBuffers(size=size, limit=limit)


class FakeClient:
    """The S3 calls upload_hashed makes, recorded; part `fail_part` raises `error` (real uploads are tested
    against moto and SeaweedFS in test_store_contract.py)."""

    def __init__(self, fail_part: int | None = None, error: BaseException | None = None, checksums: str = ""):
        self.meta = SimpleNamespace(config=SimpleNamespace(request_checksum_calculation=checksums))
        self.fail_part, self.error = fail_part, error
        self.parts: dict[int, bytes] = {}
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def put_object(self, **kwargs):
        self.calls.append("put_object")
        self.parts[0] = bytes(kwargs["Body"])

    def create_multipart_upload(self, **kwargs):
        self.calls.append("create")
        self.created_with = kwargs
        return {"UploadId": "u1"}

    def upload_part(self, PartNumber, Body, **kwargs):  # noqa: N803 - boto3's names
        if PartNumber == self.fail_part:
            raise self.error
        with self._lock:
            self.parts[PartNumber] = bytes(Body)
        return {"ETag": f'"etag-{PartNumber}"'}  # no ChecksumCRC32: a server that does not echo it

    def complete_multipart_upload(self, MultipartUpload, **kwargs):  # noqa: N803
        self.calls.append("complete")
        self.completed = MultipartUpload["Parts"]

    def abort_multipart_upload(self, **kwargs):
        self.calls.append("abort")


def _file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = random.Random(size).randbytes(size)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("size", [3 * 1024, 3 * 1024 + 1, 2 * 1024 - 1])
def test_parts_in_order_hashed_once_and_buffers_back(tmp_path, size):
    path, data = _file(tmp_path, size)
    client, buffers = FakeClient(), PartBuffers(size=1024, limit=2)
    sha = upload_hashed(client, "b", "k", path, threshold=1024, buffers=buffers, concurrency=2)
    assert sha == hashlib.sha256(data).hexdigest()
    assert b"".join(client.parts[n] for n in sorted(client.parts)) == data
    assert [p["PartNumber"] for p in client.completed] == list(range(1, -(-size // 1024) + 1))
    assert buffers.in_use == 0 and buffers.made <= 2 and client.calls == ["create", "complete"]


def test_a_failed_part_stops_the_upload_and_aborts_it(tmp_path):
    path, _ = _file(tmp_path, 20 * 1024)
    client, buffers = FakeClient(fail_part=3, error=ConnectionResetError("reset by peer")), PartBuffers(1024, 2)
    with pytest.raises(ConnectionResetError, match="reset by peer"):
        upload_hashed(client, "b", "k", path, threshold=1024, buffers=buffers, concurrency=1)
    assert client.calls == ["create", "abort"]
    assert max(client.parts) < 6  # reading stopped soon after the failure: not all 20 parts went out
    assert buffers.in_use == 0


def test_a_read_error_gives_every_buffer_back(tmp_path):
    class FailingHandle:
        def __init__(self):
            self.reads = 0

        def readinto(self, view):
            self.reads += 1
            if self.reads == 2:
                raise OSError("Input/output error")
            view[:] = b"x" * len(view)
            return len(view)

    upload, buffers = _Multipart(FakeClient(), "b", "k", {}, "u1"), PartBuffers(1024, 2)
    with pytest.raises(OSError, match="Input/output error"):
        _send_parts(upload, FailingHandle(), 4 * 1024, hashlib.sha256(), buffers, concurrency=2)
    assert buffers.in_use == 0


def test_part_checksums_follow_the_clients_setting_and_tolerate_no_echo(tmp_path):
    path, data = _file(tmp_path, 2 * 1024)
    client = FakeClient(checksums="when_supported")
    upload_hashed(client, "b", "k", path, threshold=1024, buffers=PartBuffers(1024, 2), concurrency=2)
    assert client.created_with["ChecksumAlgorithm"] == "CRC32"
    assert [sorted(p) for p in client.completed] == [["ETag", "PartNumber"]] * 2


def test_a_file_beyond_10000_parts_gets_bigger_parts_of_its_own(tmp_path):
    path, data = _file(tmp_path, MAX_PARTS + 1)  # 10,001 one-byte parts would be too many
    client, buffers = FakeClient(), PartBuffers(size=1, limit=2)
    sha = upload_hashed(client, "b", "k", path, threshold=1, buffers=buffers, concurrency=2)
    assert sha == hashlib.sha256(data).hexdigest()
    assert list(client.parts) == [1] and client.parts[1] == data  # one 1 MiB part holds it all
    assert buffers.made == 0  # the store's buffers untouched
