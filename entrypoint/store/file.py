"""`file://` store: a local directory. Writes go to a temp file in the same folder, then `os.replace`."""

from __future__ import annotations

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
    check_key,
)

__all__ = ["FileStore"]


class FileStore:
    """Objects are files under `root`; a key's '/' segments are directories."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = f"file://{self.root}"

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

    def _write_atomically(self, path: Path, write) -> str:
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
                os.fsync(out.fileno())
            return tmp
        except BaseException:
            os.unlink(tmp)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._refuse_file_as_folder(key, path)
        tmp = self._write_atomically(path, lambda out: out.write(data))
        os.replace(tmp, path)

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._refuse_file_as_folder(key, path)
        tmp = self._write_atomically(path, lambda out: out.write(data))
        try:
            os.link(tmp, path)  # atomic create-if-absent on POSIX: fails with EEXIST
        except FileExistsError:
            raise ObjectExists(key) from None
        finally:
            os.unlink(tmp)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def put_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        self._refuse_file_as_folder(key, dest)
        with open(path, "rb") as src:
            tmp = self._write_atomically(dest, lambda out: shutil.copyfileobj(src, out, 1 << 20))
        os.replace(tmp, dest)

    def get_file(self, key: str, path: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(key)
        path = Path(path)
        with open(src, "rb") as inp:
            tmp = self._write_atomically(path, lambda out: shutil.copyfileobj(inp, out, 1 << 20))
        os.replace(tmp, path)

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
        path.unlink(missing_ok=True)
        for parent in path.parents:  # like S3, a "folder" exists only while it holds objects
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:  # not empty, or already gone
                break
