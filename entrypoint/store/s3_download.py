"""Downloading a file from S3 with its sha256, hashed while it downloads.

    HeadObject (the size) -> ranged GETs of `part_size`, `concurrency` threads at a time, read in 256 KiB
    chunks into a bounded queue -> the calling thread writes each chunk at its offset and hashes the file
    in order, a part as soon as it and every part before it are written, reading it back from the page
    cache (hashlib and os.preadv let go of the GIL)

When the last byte lands, at most the last part is left to hash; hashing the finished file, what boto3's
`download_file` followed by a hash does, reads all of it again after the download. Why not
`download_fileobj` with a stream that hashes: s3transfer writes a stream target in order through a bounded
window of parts scheduled from its own threads, which deadlocked here (its
GetObjectFirstChunkOnDoneCallback waiting on the window).

Each request is retried by botocore (the client's retry settings). A part whose body stops short, resets
or times out is asked for again from the byte it reached, up to ATTEMPTS times in all (s3transfer's own
number). Errors are botocore's own, for the caller to translate; the caller removes the file on any.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from botocore.exceptions import IncompleteReadError
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

__all__ = ["ATTEMPTS", "download_hashed"]

ATTEMPTS = 5  # tries of one part's body (s3transfer's num_download_attempts)
# Bytes read from a response body, and written, at a time: s3transfer's size. 1 MiB writes cost the
# kernel nine times the CPU of 256 KiB ones once its memory had been through a few checkpoints
# (bench/store.py on Linux 6.18: the page cache's larger folios to allocate, hence to compact for).
_READ = 256 << 10
_QUEUED = 128  # chunks read and not yet written, at most (32 MiB)
_HASH_BLOCK = 1 << 20


class _Stopped(Exception):
    """Another part failed: this one gives up."""


def download_hashed(client, bucket: str, key: str, fd: int, part_size: int, concurrency: int) -> str:
    """Download s3://bucket/key into the file open for reading and writing at `fd` (empty); returns its
    sha256. The part threads only read; this thread writes every chunk (one writer per file, as
    s3transfer's IO thread) and hashes each part once it and every part before it are written."""
    size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    parts = [(start, min(start + part_size, size)) for start in range(0, size, part_size)]
    digest, block = hashlib.sha256(), bytearray(_HASH_BLOCK)
    if not parts:
        return digest.hexdigest()
    chunks: queue.Queue = queue.Queue(maxsize=_QUEUED)  # (part, offset, bytes) or (part, None, error or None)
    stop = threading.Event()  # set when anything fails: the part threads stop at their next chunk

    def put(item) -> None:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def fetch(index: int, start: int, end: int) -> None:
        try:
            _fetch_part(client, bucket, key, start, end, lambda offset, data: put((index, offset, data)))
            put((index, None, None))
        except _Stopped:
            pass
        except BaseException as err:  # noqa: BLE001 - handed to the writer, which raises it
            with contextlib.suppress(_Stopped):
                put((index, None, err))

    with ThreadPoolExecutor(max_workers=min(concurrency, len(parts)), thread_name_prefix="s3-get") as pool:
        try:
            for index, (start, end) in enumerate(parts):
                pool.submit(fetch, index, start, end)
            finished, hashed = [False] * len(parts), 0
            while hashed < len(parts):
                index, offset, data = chunks.get()
                if offset is not None:
                    _write_all(fd, data, offset)
                    continue
                if data is not None:
                    raise data
                finished[index] = True
                while hashed < len(parts) and finished[hashed]:
                    _hash_range(digest, fd, *parts[hashed], block)
                    hashed += 1
        finally:
            stop.set()
    return digest.hexdigest()


def _fetch_part(client, bucket: str, key: str, start: int, end: int, write) -> None:
    """Bytes [start, end) of the object handed to `write(offset, data)` in chunks, in order."""
    offset, attempt = start, 1
    while offset < end:
        try:
            body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end - 1}")["Body"]
            try:
                while offset < end:
                    chunk = body.read(min(_READ, end - offset))
                    if not chunk:  # the object is shorter than its HeadObject said (replaced meanwhile)
                        raise IncompleteReadError(actual_bytes=offset - start, expected_bytes=end - start)
                    write(offset, chunk)
                    offset += len(chunk)
            finally:
                body.close()
        except S3_RETRYABLE_DOWNLOAD_ERRORS:
            if attempt >= ATTEMPTS:
                raise
            attempt += 1


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _hash_range(digest, fd: int, start: int, end: int, block: bytearray) -> None:
    """Bytes [start, end) of `fd` into `digest`, read into `block` (reused: a fresh 8 MiB bytes object per
    read would be fresh pages, zeroed by the kernel, every time)."""
    view, offset = memoryview(block), start
    while offset < end:
        n = os.preadv(fd, [view[: min(len(block), end - offset)]], offset)
        if not n:
            raise OSError(f"the download's file ends at byte {offset}, before its part's end {end}")
        digest.update(view[:n])
        offset += n
