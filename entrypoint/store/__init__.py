"""Object storage for job state, checkpoints and exports: `open_store(uri)` picks the backend."""

from __future__ import annotations

from pathlib import Path

from entrypoint.store.base import (
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    PrefixedStore,
    Store,
    StoreError,
    TransientStoreError,
    check_key,
    join_key,
)
from entrypoint.store.file import FileStore

__all__ = [
    "FileStore",
    "InvalidKey",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "PrefixedStore",
    "Store",
    "StoreError",
    "TransientStoreError",
    "check_key",
    "get_tree",
    "join_key",
    "open_store",
    "put_tree",
]


def open_store(uri: str, **s3_options: str | None) -> Store:
    """`file://DIR` (relative DIR resolves against the working directory) or `s3://bucket[/prefix]`.

    `s3_options` (endpoint_url, region, addressing_style) come from the spec's `store:` section; the
    backend falls back to the standard AWS environment variables for anything left None.
    """
    if uri.startswith("file://"):
        return FileStore(uri[len("file://") :])
    if uri.startswith("s3://"):
        from entrypoint.store.s3 import S3Store  # boto3 is imported only when an s3:// store is used

        return S3Store.from_uri(uri, **s3_options)
    raise InvalidKey(f"store URI {uri!r}: expected file://DIR or s3://bucket/prefix")


def put_tree(store: Store, prefix: str, folder: Path) -> list[str]:
    """Upload every file under `folder` to `prefix/<relative path>`; returns the keys, sorted."""
    keys = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            key = join_key(prefix, path.relative_to(folder).as_posix())
            store.put_file(key, path)
            keys.append(key)
    return keys


def get_tree(store: Store, prefix: str, folder: Path) -> Path:
    """Download every object under `prefix` into `folder`, keeping relative paths; returns `folder`."""
    folder = Path(folder)
    for info in store.list(prefix):
        relative = info.key[len(prefix.rstrip("/")) + 1 :]
        store.get_file(info.key, folder / check_key(relative))
    return folder
