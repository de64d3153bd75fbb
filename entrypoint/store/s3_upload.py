"""Uploading a file to S3 with its sha256 from the same read: parts read once, in order, into reused buffers.

    open -> size < threshold?  read it, hash it, PUT it
         -> else               CreateMultipartUpload
                               read part 1 into a free buffer -> hash it -> UploadPart in a part thread
                               read part 2 ...                   (at most `concurrency` parts in flight)
                               CompleteMultipartUpload with every part's ETag
                               (any failure: AbortMultipartUpload, best effort, then the error)

Why not boto3's `upload_fileobj`: handed a stream that hashes as it is read (the only way to get the
hash from the upload's own read through it), s3transfer copies each part into a newly allocated 16 MiB
buffer, and the kernel maps and zeroes fresh pages for every one (about 38,000 page faults per 200 MB in
`bench/store.py`); handed a path, it reads the parts concurrently, so the hash would need a second read.
Here the parts land in buffers a `PartBuffers` keeps for the life of the store, and a buffer goes to
botocore as it is (a bytearray), which sends it and signs it without copying it again (with rentune's
checksum setting; botocore's default, `when_supported`, copies each part over HTTPS to add a trailer). botocore asks the
server's go-ahead (`Expect: 100-continue`) only for bodies it can read like a file, so `expect_continue`
(registered by the store on its client) asks it for every part: a throttled or refused part is answered
before its 16 MiB are sent, as with boto3's own uploads.

Each request is retried by botocore (the client's retry settings); a part's body is a buffer, so a retry
sends the same bytes again. Errors are botocore's own, for the caller to translate.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_PARTS", "PartBuffers", "expect_continue", "part_size_for", "upload_hashed"]

MAX_PARTS = 10_000  # S3's limit on the parts of one multipart upload
MiB = 1 << 20


def part_size_for(size: int, part_size: int) -> int:
    """`part_size`, or the smallest whole number of MiB that keeps a `size`-byte file within MAX_PARTS."""
    if size <= part_size * MAX_PARTS:
        return part_size
    return -(-size // (MAX_PARTS * MiB)) * MiB


class PartBuffers:
    """Up to `limit` bytearrays of `size` bytes, made when first needed and then handed out again and again.

    `take` blocks while all `limit` are out; `give` returns one. A buffer once made is kept (at most
    `limit` x `size` bytes for the life of the owner): reusing memory the process already has is what
    spares the page faults of a fresh allocation per part.
    """

    def __init__(self, size: int, limit: int):
        if size < 1 or limit < 1:
            raise ValueError(f"PartBuffers(size={size}, limit={limit}): expected both >= 1")
        self.size, self.limit = size, limit
        self.made = 0
        self._free: list[bytearray] = []
        self._ready = threading.Condition()

    def take(self) -> bytearray:
        with self._ready:
            while not self._free and self.made >= self.limit:
                self._ready.wait()
            if self._free:
                return self._free.pop()
            self.made += 1
        try:
            return bytearray(self.size)
        except BaseException:  # MemoryError: not made after all, or take() would wait for it forever
            with self._ready:
                self.made -= 1
                self._ready.notify()
            raise

    @property
    def in_use(self) -> int:
        """Buffers taken and not yet given back."""
        with self._ready:
            return self.made - len(self._free)

    def give(self, buffer: bytearray) -> None:
        with self._ready:
            self._free.append(buffer)
            self._ready.notify()


def expect_continue(params: dict, **_kwargs) -> None:
    """botocore 'before-call.s3.UploadPart' hook: send the headers first and the part only once the server
    says go on (it may answer 503 SlowDown or 403 at once instead)."""
    params["headers"]["Expect"] = "100-continue"


def _checksum_args(client) -> dict:
    """CRC32 part checksums where the client sends checksums by default (botocore's `when_supported`), as
    s3transfer does; a multipart upload created with them must list each part's checksum on completion."""
    if getattr(client.meta.config, "request_checksum_calculation", None) == "when_supported":
        return {"ChecksumAlgorithm": "CRC32"}
    return {}


def upload_hashed(
    client,
    bucket: str,
    key: str,
    path: Path,
    *,
    threshold: int,
    buffers: PartBuffers,
    concurrency: int,
) -> str:
    """Upload `path` to `bucket`/`key` and return the sha256 of the bytes sent, read from disk once.

    Files of `threshold` bytes or more go in parts of `buffers.size` bytes (larger, in parts of their
    own, when that would exceed MAX_PARTS), `concurrency` at a time. A missing file raises
    FileNotFoundError; a failed request raises botocore's error once the multipart upload is aborted.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < threshold:
            data = handle.read()
            digest.update(data)
            client.put_object(Bucket=bucket, Key=key, Body=data)
            return digest.hexdigest()
        if part_size_for(size, buffers.size) != buffers.size:  # beyond 10,000 parts: bigger, one-off buffers
            buffers = PartBuffers(part_size_for(size, buffers.size), concurrency)
        checksum = _checksum_args(client)
        upload = _Multipart(client, bucket, key, checksum)
        upload.upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, **checksum)["UploadId"]
        try:
            parts = _send_parts(upload, handle, size, digest, buffers, concurrency)
            client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload.upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            # Parts of an upload never completed are billed until aborted (the next attempt of the job aborts
            # any left). Best effort: the failure that got us here is the one to report.
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload.upload_id)
            raise
    return digest.hexdigest()


@dataclass
class _Multipart:
    """One multipart upload: where it goes and how each part is sent."""

    client: object
    bucket: str
    key: str
    checksum: dict  # {"ChecksumAlgorithm": "CRC32"} or {}
    upload_id: str = ""

    def send(self, number: int, body: bytearray) -> dict:
        """UploadPart; the entry CompleteMultipartUpload needs for it."""
        response = self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body, **self.checksum
        )
        part = {"PartNumber": number, "ETag": response["ETag"]}
        if "ChecksumCRC32" in response:  # as s3transfer: a server may take the checksum and not echo it
            part["ChecksumCRC32"] = response["ChecksumCRC32"]
        return part


def _send_parts(upload: _Multipart, handle, size: int, digest, buffers: PartBuffers, concurrency: int) -> list[dict]:
    """Read the `size` bytes of `handle` part by part into `buffers`, hashing each in order, while
    `concurrency` threads upload the parts read so far. Returns CompleteMultipartUpload's part list; once a
    part fails, no more are read or sent, and the first failure is raised when every thread has stopped."""
    failed = threading.Event()

    def send(number: int, buffer: bytearray, length: int) -> dict | None:
        try:
            if failed.is_set():
                return None  # skipped: the failure that set it is raised below
            return upload.send(number, buffer if length == len(buffer) else bytearray(memoryview(buffer)[:length]))
        except BaseException:
            failed.set()
            raise
        finally:
            buffers.give(buffer)

    sent: list[Future] = []
    count = -(-size // buffers.size)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="s3-part") as pool:
        try:
            for number in range(1, count + 1):
                buffer = buffers.take()
                try:
                    want = min(buffers.size, size - (number - 1) * buffers.size)
                    # a buffered file fills the view unless it ends first (it shrank: the size check says so)
                    length = 0 if failed.is_set() else handle.readinto(memoryview(buffer)[:want])
                    if not length:
                        buffers.give(buffer)
                        break
                    digest.update(memoryview(buffer)[:length])
                    sent.append(pool.submit(send, number, buffer, length))
                except BaseException:
                    buffers.give(buffer)  # never reached send(), which gives it back otherwise
                    raise
        except BaseException:
            failed.set()  # the parts queued behind the failure return at once; the pool waits for the rest
            raise
    errors = [future.exception() for future in sent if future.exception() is not None]
    if errors:
        raise errors[0]
    return [future.result() for future in sent]
