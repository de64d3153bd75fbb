"""The Store protocol every backend implements, its errors and the key rules they all enforce.

Keys are relative POSIX paths such as `jobs/quickstart/phases/data/result.json`. A key with `..`, an
absolute path, a backslash or an empty segment is refused before any backend sees it, so a hostile spec
or a listing from a shared bucket can never make rentune read or write outside its root.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from entrypoint.errors import InvalidInput

__all__ = [
    "InvalidKey",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "PrefixedStore",
    "Store",
    "StoreError",
    "StoreUnusable",
    "TMP_PREFIX",
    "TransientStoreError",
    "check_key",
    "join_key",
]


TMP_PREFIX = ".tmp-"  # local temp files during atomic writes; never a valid object name


# Files a checkpoint commit uploads at once (each large one also in parts): S3Store sizes its connection
# pool for it.
UPLOAD_FILES_AT_ONCE = 4


class StoreError(Exception):
    """Any failure of a store operation that is not one of the specific kinds below."""


class ObjectNotFound(StoreError, FileNotFoundError):
    """The key does not exist."""


class ObjectExists(StoreError, FileExistsError):
    """`put_if_absent` lost: the key already exists (S3: 412 Precondition Failed)."""


class TransientStoreError(StoreError):
    """A failure worth retrying later (throttling, 5xx, connection reset) after the client's own retries."""


class InvalidKey(StoreError, InvalidInput):
    """A key that could escape the store root or is malformed."""


class StoreUnusable(StoreError, InvalidInput):
    """The store as configured cannot hold a job: a bad URI or setting, a path rentune cannot write, a
    server that does not honour conditional writes, a missing bucket, refused credentials or denied access
    (exit 2; the message says what to check first)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store it was listed from
    size: int


def check_key(key: str) -> str:
    """Return `key` if it is a safe relative key, else raise `InvalidKey`."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise InvalidKey(f"refused object key {key!r}: expected a relative path")
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidKey(f"refused object key {key!r}: empty, '.' or '..' segment")
    if parts[-1].startswith(TMP_PREFIX):
        raise InvalidKey(f"refused object key {key!r}: names starting with {TMP_PREFIX!r} are temporary files")
    return key


def join_key(*parts: str) -> str:
    """Join key segments with '/', dropping empty ones, and check the result."""
    return check_key("/".join(p.strip("/") for p in parts if p.strip("/")))


@runtime_checkable
class Store(Protocol):
    """Object storage as rentune uses it. `file://` and `s3://` behave the same.

    Every method takes keys relative to the store's root and raises `InvalidKey` for unsafe ones.
    """

    uri: str

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write `data` at `key`, replacing any object there (atomically: readers see old or new)."""

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Write `data` at `key` only if no object exists there; raise `ObjectExists` otherwise."""

    def get_bytes(self, key: str) -> bytes:
        """Read the object at `key`; raise `ObjectNotFound` if absent."""

    def put_file(self, key: str, path: Path) -> str:
        """Upload a local file (streamed; large files in parts) and return the sha256 of the bytes sent,
        hashed from the same read that uploads them."""

    def get_file(self, key: str, path: Path) -> str:
        """Download to `path` (streamed, written to a temp file then renamed) and return the sha256 of the
        bytes written; `ObjectNotFound` if absent. Not fsynced: what callers download is checked against a
        record and fetched again when lost."""

    def head(self, key: str) -> ObjectInfo | None:
        """Size of the object at `key`, or None if absent."""

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects under `prefix` (a directory-like key or ''), recursively, keys relative to the root."""

    def delete(self, key: str) -> None:
        """Remove the object at `key`; absent keys are not an error."""


class PrefixedStore:
    """A view of `inner` confined to `prefix`: every key is joined under it and listings are relative."""

    def __init__(self, inner: Store, prefix: str):
        self.inner = inner
        self.prefix = join_key(prefix)
        self.uri = f"{inner.uri.rstrip('/')}/{self.prefix}"
        self.endpoint = getattr(inner, "endpoint", inner.uri)

    def _k(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def put_bytes(self, key: str, data: bytes) -> None:
        self.inner.put_bytes(self._k(key), data)

    def put_if_absent(self, key: str, data: bytes) -> None:
        self.inner.put_if_absent(self._k(key), data)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(self._k(key))

    def put_file(self, key: str, path: Path) -> str:
        return self.inner.put_file(self._k(key), path)

    def get_file(self, key: str, path: Path) -> str:
        return self.inner.get_file(self._k(key), path)

    def head(self, key: str) -> ObjectInfo | None:
        info = self.inner.head(self._k(key))
        return None if info is None else ObjectInfo(key=key, size=info.size)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._k(prefix) if prefix else self.prefix
        mine = self.prefix + "/"
        for info in self.inner.list(full):
            if not info.key.startswith(mine):
                raise InvalidKey(f"listing {full!r} returned {info.key!r}, which is outside {mine!r}")
            yield ObjectInfo(key=check_key(info.key[len(mine) :]), size=info.size)

    def delete(self, key: str) -> None:
        self.inner.delete(self._k(key))
