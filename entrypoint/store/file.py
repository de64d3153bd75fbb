"""`file://` store: a local directory. Writes go to a temp file in the same folder, then `os.replace`.

Opening a store writes nothing: the directory is created by the first write, so `rentune status` on a
path that does not exist leaves none behind. A write the file system refuses (read-only, no permission,
a file where a folder should be) is `StoreUnusable` naming the store and the key.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from entrypoint.store.base import (
    TMP_PREFIX,
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    StoreError,
    StoreUnusable,
    check_key,
)
from entrypoint.store.hashing import BLOCK, HashingReader

# Failures that no retry or later run fixes: the directory is not writable as configured.
_UNUSABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR}

__all__ = ["FileStore"]


class FileStore:
    """Objects are files under `root`; a key's '/' segments are directories."""

    def __init__(self, root: str | Path):
        if not str(root).strip():
            raise StoreUnusable("store URI file:// names no directory: expected file://DIR, e.g. file://./runs")
        self.root = Path(root).resolve()
        self.uri = self.endpoint = f"file://{self.root}"
        if self.root.exists() and not self.root.is_dir():
            raise StoreUnusable(f"{self.uri}: is a file; expected a directory (or a path that does not exist yet)")

    def _refused(self, key: str, exc: OSError) -> StoreError:
        kind = StoreUnusable if exc.errno in _UNUSABLE else StoreError
        return kind(f"{self.uri}: cannot write {key}: {exc.strerror or exc} ({exc.filename or self.root})")

    def _path(self, key: str) -> Path:
        path = (self.root / check_key(key)).resolve()
        if not path.is_relative_to(self.root):  # a symlink inside the root pointing out of it
            raise InvalidKey(f"{key}: resolves outside the store root {self.root}")
        return path

    def _refuse_file_as_folder(self, key: str, path: Path) -> None:
        for parent in path.parents:
            if parent == self.root:
                return
            if parent.is_file():
                raise StoreError(f"{key}: cannot store under {parent.relative_to(self.root)}, which is an object")

    def _write_atomically(self, path: Path, write, sync: bool = True) -> str:
        for attempt in range(3):  # a concurrent delete may remove the folder once it is empty
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX, suffix="-" + path.name)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
                out.flush()
                if sync:
                    os.fsync(out.fileno())
            return tmp
        except BaseException:
            os.unlink(tmp)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._refuse_file_as_folder(key, path)
        try:
            tmp = self._write_atomically(path, lambda out: out.write(data))
            os.replace(tmp, path)
        except OSError as exc:
            raise self._refused(key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._refuse_file_as_folder(key, path)
        try:
            tmp = self._write_atomically(path, lambda out: out.write(data))
        except OSError as exc:
            raise self._refused(key, exc) from exc
        try:
            os.link(tmp, path)  # atomic create-if-absent on POSIX: fails with EEXIST
        except FileExistsError:
            raise ObjectExists(key) from None
        except OSError as exc:
            raise self._refused(key, exc) from exc
        finally:
            os.unlink(tmp)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def put_file(self, key: str, path: Path) -> str:
        dest = self._path(key)
        self._refuse_file_as_folder(key, dest)
        with open(path, "rb") as src:  # a missing local file is the caller's FileNotFoundError
            reader = HashingReader(src)
            try:
                tmp = self._write_atomically(dest, lambda out: shutil.copyfileobj(reader, out, BLOCK))
                os.replace(tmp, dest)
            except OSError as exc:
                raise self._refused(key, exc) from exc
        return reader.sha256()

    def get_file(self, key: str, path: Path) -> str:
        """Copied and hashed in one pass; not fsynced (a downloaded copy is scratch: see S3Store.get_file)."""
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(key)
        path = Path(path)
        with open(src, "rb") as inp:
            reader = HashingReader(inp)
            tmp = self._write_atomically(path, lambda out: shutil.copyfileobj(reader, out, BLOCK), sync=False)
        os.replace(tmp, path)
        return reader.sha256()

    def head(self, key: str):
        path = self._path(key)
        return ObjectInfo(key=key, size=path.stat().st_size) if path.is_file() else None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            yield ObjectInfo(key=prefix, size=base.stat().st_size)
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith(TMP_PREFIX):
                yield ObjectInfo(key=path.relative_to(self.root).as_posix(), size=path.stat().st_size)

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            return  # a "folder" is not an object; S3 ignores such a delete too
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._refused(key, exc) from exc
        for parent in path.parents:  # like S3, a "folder" exists only while it holds objects
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:  # not empty, or already gone
                break
