"""Data files in a bucket, fetched for the data phase: image files (and their JSONL or ImageFolder prefix)
named by `s3://bucket/key` URIs, downloaded once each into a local folder the phase removes when it ends.
The store settings of the spec (endpoint, region, addressing style) apply to every bucket; credentials
come from the environment, as for the job's own store."""

from __future__ import annotations

from pathlib import Path

from entrypoint.data.reading import DataError
from jobspec.schema import Store

__all__ = ["BucketFiles", "is_uri", "join_uri"]


def is_uri(location: str) -> bool:
    return location.startswith("s3://")


def join_uri(base: str, relative: str) -> str:
    """`relative` (a key path, as written in a JSONL row) under the prefix of the object `base`."""
    return f"{base.rsplit('/', 1)[0]}/{relative.removeprefix('./')}"


class BucketFiles:
    """Objects downloaded into `folder` as `<bucket>/<key>`; each URI fetched at most once."""

    def __init__(self, options: Store, folder: Path):
        self.options, self.folder = options, folder
        self._stores: dict = {}

    def _split(self, uri: str):
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket or not key:
            raise DataError(f"{uri}: expected s3://bucket/key")
        if bucket not in self._stores:
            from entrypoint.store.s3 import S3Store

            self._stores[bucket] = S3Store.from_uri(
                f"s3://{bucket}",
                endpoint_url=self.options.endpoint_url,
                region=self.options.region,
                addressing_style=self.options.addressing_style,
            )
        return self._stores[bucket], bucket, key

    def file(self, uri: str) -> Path | None:
        """The object at `uri` on local disk; None when the bucket has no such object."""
        from entrypoint.store import ObjectNotFound

        store, bucket, key = self._split(uri)
        local = self.folder / bucket / key
        if local.is_file():
            return local
        try:
            store.get_file(key, local)
        except ObjectNotFound:
            return None
        return local

    def prefix(self, uri: str) -> Path:
        """Every object under the prefix `uri`, downloaded with its relative path; the local folder.
        Raises DataError when the prefix holds nothing."""
        store, bucket, key = self._split(uri.rstrip("/"))
        keys = [info.key for info in store.list(key)]
        if not keys:
            raise DataError(f"{uri}: no objects under this prefix (an ImageFolder is <prefix>/<label>/<image>)")
        for name in keys:
            self.file(f"s3://{bucket}/{name}")
        return self.folder / bucket / key
