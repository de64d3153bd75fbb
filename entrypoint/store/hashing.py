"""sha256 of files, streamed: the one definition behind base-model hashes and checkpoint manifests.

`HashingReader` hashes a file while something else reads it (the file store's copy), so a checkpoint's
bytes are read from disk once: for the store and for its manifest's sha256 together. S3 uploads do the
same with their part buffers (s3_upload.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["BLOCK", "HashingReader", "file_sha256", "weights_sha256"]

BLOCK = 1 << 20


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
