"""sha256 of files, streamed: the one definition behind base-model hashes and checkpoint manifests.

`HashingReader` hashes a file while something else reads it (the file store's copy), so a checkpoint's
bytes are read from disk once: for the store and for its manifest's sha256 together. S3 uploads do the
same with their part buffers (s3_upload.py).

`files_sha256_memo` hashes many files a few at a time (hashlib releases the GIL on large buffers) and keeps
what it read in a node-local memo, so that the next process on the node (a resume, the fresh recheck and
parity processes, every torchrun rank) reads a 140 GB base model's bytes again only where a file changed.
A file is taken as unchanged when its size, mtime, ctime, inode and device are what they were when it was
hashed: any write changes mtime and ctime, a replaced file has another inode, and ctime cannot be set back
from user space (git's index trusts the same fields). As in git ("racy" entries), a file whose ctime lies
within RACY_NS of when its hashing began is hashed again next time: the kernel's timestamps are coarse (a
few ms), so a write right after the read could leave the same signature. A fetched model's memo comes
from its download, whose every byte this process wrote and hashed as it arrived (store/models.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["BLOCK", "HashingReader", "file_sha256", "file_signature", "files_sha256_memo", "remember", "weights_sha256"]

BLOCK = 1 << 20
RACY_NS = 2_000_000_000  # a file changed this close before its hashing began is hashed again next time


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_sha256(file_hashes: dict[str, str]) -> str:
    """The base model's sha256 from its weight files' (relative path -> sha256): sha256 of the lines
    `"<path>\t<sha256>\n"` in sorted path order. What BINDING.json and MODEL_MANIFEST.json record."""
    return hashlib.sha256("".join(f"{name}\t{sha}\n" for name, sha in sorted(file_hashes.items())).encode()).hexdigest()


class HashingReader:
    """A read-only, forward-only view of an open binary file that hashes every byte read through it.

    It offers `read` and nothing else on purpose: whoever reads it reads forward, once, in order.
    `sha256()` is complete once `read` has returned b"".
    """

    def __init__(self, handle):
        self._handle = handle
        self._digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._handle.read(n)
        self._digest.update(data)
        return data

    def sha256(self) -> str:
        return self._digest.hexdigest()


def file_signature(path: Path) -> list[int]:
    """What changes whenever a file's bytes may have: size, mtime and ctime (ns), inode, device."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _read_memo(memo: Path) -> dict:
    try:
        entries = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: hash everything again
    return entries if isinstance(entries, dict) else {}


def remember(memo: Path, hashes: dict[Path, str], started_ns: int | None) -> None:
    """Record `hashes` (file -> sha256 of its bytes now) in the memo file `memo`, with each file's signature.
    `started_ns`: time.time_ns() when their reading began (entries written within RACY_NS before it are not
    trusted), or None for files this process wrote itself and hashed as it wrote them. Written whole to a
    temporary file and renamed: a reader sees the old memo or the new one."""
    entries = _read_memo(memo)
    for path, sha256 in hashes.items():
        entries[str(Path(path).absolute())] = {
            "signature": file_signature(path),
            "sha256": sha256,
            "started_ns": started_ns,
        }
    memo.parent.mkdir(parents=True, exist_ok=True)
    partial = memo.with_name(f".{memo.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(entries, sort_keys=True))
    os.replace(partial, memo)


def _trusted(entry: object, signature: list[int]) -> bool:
    """A memo entry stands for the file now: same signature, and not written within RACY_NS of its hashing."""
    if not (isinstance(entry, dict) and entry.get("signature") == signature and isinstance(entry.get("sha256"), str)):
        return False
    started = entry.get("started_ns")
    return started is None or (isinstance(started, int) and signature[2] < started - RACY_NS)


def files_sha256_memo(paths: list[Path], memo: Path | None, threads: int = 4) -> dict[Path, str]:
    """sha256 of each file in `paths`, `threads` files at a time, read only when `memo` (a memo file, or None:
    read every file) has no entry whose signature matches the file's now; new hashes are added to the memo."""
    entries = _read_memo(memo) if memo is not None else {}
    known, unknown = {}, []
    for path in paths:
        if _trusted(entries.get(str(Path(path).absolute())), file_signature(path)):
            known[path] = entries[str(Path(path).absolute())]["sha256"]
        else:
            unknown.append(path)
    if unknown:
        started_ns = time.time_ns()
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(unknown))), thread_name_prefix="hash") as pool:
            fresh = dict(zip(unknown, pool.map(file_sha256, unknown), strict=True))
        if memo is not None:
            with contextlib.suppress(OSError):  # a read-only cache: the hashes stand, the next process reads again
                remember(memo, fresh, started_ns)
        known.update(fresh)
    return {path: known[path] for path in paths}
