"""Object storage for job state, checkpoints and exports: `open_store(uri)` picks the backend."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

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
    "StoreUnusable",
    "TransientStoreError",
    "check_conditional_writes",
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


def check_conditional_writes(store: Store, prefix: str) -> None:
    """Refuse a store that does not honour put-if-absent (S3's `If-None-Match: *`): write a scratch key
    under `prefix` twice; the second write must be refused. Raises StoreUnusable naming the endpoint.

    Run at every job and worker start, never cached: the endpoint behind a URI can change between runs
    (another proxy, another gateway), and one lost conditional write can overwrite a frozen spec."""
    key = join_key(prefix, f"conditional-write-check-{uuid.uuid4().hex}")
    endpoint = getattr(store, "endpoint", store.uri)
    try:
        store.put_if_absent(key, b"first\n")
        try:
            store.put_if_absent(key, b"second\n")
        except ObjectExists:
            return
        raise StoreUnusable(
            f"{endpoint}: the store does not honour conditional writes: a second write to {store.uri}/{key} "
            "with If-None-Match: * was accepted instead of refused (HTTP 412). rentune relies on them so that "
            "a job's frozen spec, its attempt claims, the test seal and checkpoint manifests are never "
            "overwritten by another process. Use a server that supports them (AWS S3, MinIO, SeaweedFS, "
            "Cloudflare R2, ...) or a proxy that forwards the If-None-Match header."
        )
    finally:
        with contextlib.suppress(StoreError):  # a leftover scratch key is harmless
            store.delete(key)


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
