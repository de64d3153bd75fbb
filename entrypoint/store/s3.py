"""`s3://` store: boto3 against AWS S3 or any S3-compatible server (MinIO, Ceph RGW, R2, moto).

Credentials come only from boto3's default chain (environment, shared config, instance or pod role); no
function here accepts a key. botocore errors are translated where each call is made:

    404 / NoSuchKey                                   -> ObjectNotFound
    412 PreconditionFailed                            -> ObjectExists
    429, 5xx, throttling codes, connection errors     -> TransientStoreError (after botocore's own retries)
    NoSuchBucket, refused credentials, 403, no creds  -> StoreUnusable (exit 2), saying what to check first
    anything else (bad config ...)                    -> StoreError

Every message names the full `s3://bucket/key` involved.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from entrypoint.store.base import (
    UPLOAD_FILES_AT_ONCE,
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    StoreError,
    StoreUnusable,
    TransientStoreError,
    check_key,
    join_key,
)
from entrypoint.store.s3_download import download_hashed
from entrypoint.store.s3_upload import PartBuffers, expect_continue, upload_hashed

__all__ = ["ADDRESSING_STYLES", "S3Store"]

MiB = 1 << 20
DEFAULT_PART_SIZE = 16 * MiB  # S3 allows 10,000 parts: objects up to 156 GiB, 64 requests per GiB
DEFAULT_MAX_CONCURRENCY = 8  # parallel part transfers per file (boto3's own default is 10)
# Part buffers per part thread: 16 x 16 MiB by default, kept once made. They bound the parts in flight over
# all the files a commit sends at once (16, where 4 files x 8 threads could send 32): a cap on the memory a
# training process keeps, chosen over the last bit of throughput on a high-latency link (not measured).
UPLOAD_BUFFERS_PER_THREAD = 2
DEFAULT_MAX_ATTEMPTS = 8  # requests in all, the first included; "standard" mode waits rand*2^n s, <= 20 s
CONFLICT_RETRIES = 3  # a 409 on a conditional write means a concurrent write was in flight: ask again
ADDRESSING_STYLES = ("auto", "virtual", "path")
ADDRESSING_STYLE_ENV = "RENTUNE_S3_ADDRESSING_STYLE"
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{2,254}$")  # S3 names are 3-63; some servers allow more

_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_EXISTS_CODES = {"412", "PreconditionFailed"}
_CONFLICT_CODE = "ConditionalRequestConflict"
_TRANSIENT_CODES = {  # the S3 ones of botocore.retries.standard's throttling/transient codes, S3's 5xx codes
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
}
# Failures of the connection or of reading a response body (after s3_download's own tries of a part).
_TRANSIENT_EXCEPTIONS = (
    BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
)
_VENDOR_ERRORS = (ClientError, BotoCoreError, Boto3Error)


def _error_code(err: ClientError) -> tuple[str, int]:
    code = str(err.response.get("Error", {}).get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


# The codes S3 and its peers answer when they refuse the request's credentials, with what each means.
_REFUSED_CREDENTIALS = {
    "InvalidAccessKeyId": "the server knows no such access key",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is malformed",
    "TokenRefreshRequired": "the session token must be refreshed",
}
_CHECK_CREDENTIALS = (
    "Check first AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, and AWS_SESSION_TOKEN for "
    "temporary keys) in this environment, then that the endpoint is the server those keys belong to"
)


def _translate(err: Exception, op: str, where: str) -> StoreError:
    """The store's own error for a boto3/botocore failure of `op` on `where` (s3://bucket/key)."""
    if isinstance(err, ClientError):
        code, status = _error_code(err)
        message = f"{where}: {op} failed: {code or status} {err}"
        if code in _NOT_FOUND_CODES:
            return ObjectNotFound(message)
        if code in _EXISTS_CODES or status == 412:
            return ObjectExists(message)
        if code in _TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientStoreError(message)
        bucket = where.removeprefix("s3://").split("/", 1)[0]
        if code == "NoSuchBucket":
            return StoreUnusable(
                f"{where}: {op} failed: the bucket {bucket!r} does not exist on this server (NoSuchBucket). Check "
                "first the bucket in store.uri (or --store), then the endpoint (store.endpoint_url, --endpoint-url "
                f"or AWS_ENDPOINT_URL); to create it: aws s3 mb s3://{bucket}"
            )
        if code in _REFUSED_CREDENTIALS:
            return StoreUnusable(
                f"{where}: {op} failed: your credentials were refused: {_REFUSED_CREDENTIALS[code]} ({code}). "
                f"{_CHECK_CREDENTIALS}"
            )
        if status == 403 and code in ("", "403", "Forbidden"):  # a HEAD's answer has no body, hence no reason
            return StoreUnusable(
                f"{where}: {op} failed: 403 Forbidden with no reason given (a HEAD request's answer carries none): "
                f"your credentials were refused, or they may not {op} here. {_CHECK_CREDENTIALS}; then that their "
                f"policy allows s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket on {bucket!r}"
            )
        if status == 403:
            return StoreUnusable(
                f"{where}: {op} failed: access denied ({code or status}): the credentials were accepted, but may "
                f"not {op} here. Check first that their policy allows s3:GetObject, s3:PutObject, s3:DeleteObject "
                f"and s3:ListBucket on {bucket!r} (S3 also answers 403 for a missing key without s3:ListBucket)"
            )
        return StoreError(message)
    if isinstance(err, NoCredentialsError):
        return StoreUnusable(f"{where}: {op} failed: no credentials found. {_CHECK_CREDENTIALS}, or an instance role")
    if isinstance(err, _TRANSIENT_EXCEPTIONS):
        return TransientStoreError(f"{where}: {op} failed: {err}")
    return StoreError(f"{where}: {op} failed: {type(err).__name__}: {err}")


def _max_attempts_from_env() -> int:
    """$AWS_MAX_ATTEMPTS (the standard variable: requests in all, the first included), or our default."""
    value = os.environ.get("AWS_MAX_ATTEMPTS")
    if value is None:
        return DEFAULT_MAX_ATTEMPTS
    if not value.isdigit() or int(value) < 1:
        raise StoreUnusable(f"$AWS_MAX_ATTEMPTS={value!r}: expected a whole number of requests, 1 or more")
    return int(value)


def _make_client(endpoint_url: str | None, region: str | None, addressing_style: str | None, **config):
    """A boto3 S3 client. Anything left None falls back to the standard AWS environment variables."""
    session = boto3.session.Session()
    region = region or os.environ.get("AWS_REGION") or session.region_name or "us-east-1"
    style = addressing_style or os.environ.get(ADDRESSING_STYLE_ENV) or "auto"
    if style not in ADDRESSING_STYLES:
        source = "store.addressing_style" if addressing_style else f"${ADDRESSING_STYLE_ENV}"
        raise StoreUnusable(f"{source}={style!r}: expected one of {', '.join(ADDRESSING_STYLES)}")
    # botocore >= 1.36 sends CRC checksums on every upload by default and many S3-compatible servers reject
    # them; "when_required" restores the old behaviour. botocore reads the AWS_* variables itself, and an
    # explicit Config value would override them, so set one only where the variable is absent.
    for option in ("request_checksum_calculation", "response_checksum_validation"):
        if f"AWS_{option.upper()}" not in os.environ:
            config[option] = "when_required"
    # endpoint_url=None is boto3's own default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL still apply.
    return session.client(
        "s3",
        region_name=region,
        endpoint_url=endpoint_url,
        config=Config(region_name=region, s3={"addressing_style": style}, **config),
    )


class S3Store:
    """Objects under `s3://bucket/prefix`; every key is checked and confined under the prefix.

    `client` is the boto3 client (thread-safe; one per store). Transfers of files above
    `multipart_threshold` go in `multipart_chunksize` parts, `max_concurrency` at a time; uploads read
    their parts into `part_buffers`, at most 2 x `max_concurrency` of them, kept once made (256 MiB with the
    defaults, only after a large upload needed them all). Each request is
    sent at most `max_attempts` times (the first included; default $AWS_MAX_ATTEMPTS, else 8) before its
    error is translated.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        multipart_threshold: int = DEFAULT_PART_SIZE,
        multipart_chunksize: int = DEFAULT_PART_SIZE,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_attempts: int | None = None,
    ):
        if not _BUCKET_RE.match(bucket):
            raise InvalidKey(f"S3 bucket name {bucket!r}: expected 3-255 of [A-Za-z0-9._-]")
        self.bucket = bucket
        # how another process reopens this store (torchrun ranks, the recheck process): flag -> value
        self.reopen_flags = {"--endpoint-url": endpoint_url, "--region": region, "--addressing-style": addressing_style}
        self.prefix = join_key(prefix) if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = _make_client(
            endpoint_url,
            region,
            addressing_style,
            # Config's "max_attempts" counts retries only; "total_max_attempts" counts the first request too.
            retries={"mode": "standard", "total_max_attempts": max_attempts or _max_attempts_from_env()},
            connect_timeout=10,
            read_timeout=60,
            # every part of the files a checkpoint commit uploads at once, plus small calls beside them
            max_pool_connections=UPLOAD_FILES_AT_ONCE * max_concurrency + 2,
        )
        self.endpoint = f"{self.client.meta.endpoint_url} (bucket {bucket})"
        self.multipart_threshold, self.max_concurrency = multipart_threshold, max_concurrency
        self.part_size = multipart_chunksize  # of downloads too
        # every upload of this store reads its parts into these (a file of over 10,000 parts gets its own)
        self.part_buffers = PartBuffers(multipart_chunksize, UPLOAD_BUFFERS_PER_THREAD * max_concurrency)
        self.client.meta.events.register("before-call.s3.UploadPart", expect_continue)

    @classmethod
    def from_uri(
        cls,
        uri: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        **options: int,
    ) -> S3Store:
        """`s3://bucket` or `s3://bucket/some/prefix`; `options` are the transfer and retry settings.

        Raises InvalidKey for a malformed URI or prefix, StoreUnusable for a bad addressing style.
        """
        if not uri.startswith("s3://"):
            raise InvalidKey(f"store URI {uri!r}: expected s3://bucket[/prefix]")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        return cls(
            bucket,
            prefix,
            endpoint_url=endpoint_url,
            region=region,
            addressing_style=addressing_style,
            **options,
        )

    # Keys: the store's prefix joined on the way in, checked and cut off on the way out.

    def _full(self, key: str) -> str:
        return join_key(self.prefix, check_key(key)) if self.prefix else check_key(key)

    def _where(self, full: str) -> str:
        return f"s3://{self.bucket}/{full}"

    def _relative(self, full: str) -> str:
        """The store-relative key of a listed object; InvalidKey if it is not a safe key under the prefix."""
        if not self.prefix:
            return check_key(full)
        if not full.startswith(self.prefix + "/"):
            raise InvalidKey(f"{self._where(full)}: listed key is outside the store prefix {self.prefix!r}")
        try:
            return check_key(full[len(self.prefix) + 1 :])
        except InvalidKey as err:
            raise InvalidKey(f"{self._where(full)}: refused listed key: {err}") from None

    def _search_prefix(self, prefix: str) -> str:
        """The S3 `Prefix` for a directory-like store prefix ('' = everything under the store)."""
        if prefix:
            return self._full(prefix)  # no trailing '/': an object exactly at `prefix` is included too
        return self.prefix + "/" if self.prefix else ""

    def _is_under(self, full: str, search: str, prefix: str) -> bool:
        # S3 matches raw string prefixes: for `jobs/a` it also returns `jobs/ab/...`, which is not under it.
        return not prefix or full == search or full.startswith(search + "/")

    # The Store protocol.

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._full(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        except _VENDOR_ERRORS as err:
            raise _translate(err, "put", self._where(full)) from err

    def put_if_absent(self, key: str, data: bytes) -> None:
        """PUT with `If-None-Match: *`. 412 -> ObjectExists; a 409 (a concurrent conditional write still in
        flight) is asked again a few times, and if it persists the other writer is taken to have won."""
        full = self._full(key)
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*")
                return
            except ClientError as err:
                code, status = _error_code(err)
                if code == _CONFLICT_CODE or status == 409:
                    if attempt < CONFLICT_RETRIES:
                        time.sleep(0.1 * 2**attempt)
                        continue
                    raise ObjectExists(f"{self._where(full)}: put_if_absent lost: {code} {err}") from err
                raise _translate(err, "put_if_absent", self._where(full)) from err
            except _VENDOR_ERRORS as err:
                raise _translate(err, "put_if_absent", self._where(full)) from err

    def get_bytes(self, key: str) -> bytes:
        full = self._full(key)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            with response["Body"] as body:
                return body.read()
        except _VENDOR_ERRORS as err:
            raise _translate(err, "get", self._where(full)) from err

    def put_file(self, key: str, path: Path) -> str:
        """Upload `path` (in parts from `multipart_threshold` bytes on) and return its sha256, computed from
        the same read that fills each part's buffer (s3_upload.upload_hashed). A missing local file raises
        FileNotFoundError."""
        full = self._full(key)
        try:
            return upload_hashed(
                self.client,
                self.bucket,
                full,
                path,
                threshold=self.multipart_threshold,
                buffers=self.part_buffers,
                concurrency=self.max_concurrency,
            )
        except _VENDOR_ERRORS as err:
            raise _translate(err, "upload", self._where(full)) from err

    def get_file(self, key: str, path: Path) -> str:
        """Download into `path` (a temp file beside it, renamed over it once whole) and return its sha256,
        computed while the parts download (s3_download.download_hashed). Not fsynced: a downloaded copy is
        scratch, checked by its caller against the sha256 returned here and fetched again by the next
        process if the machine loses it."""
        full = self._full(key)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix="-" + path.name)
        try:
            try:
                sha256 = download_hashed(self.client, self.bucket, full, fd, self.part_size, self.max_concurrency)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            return sha256
        except _VENDOR_ERRORS as err:
            raise _translate(err, "download", self._where(full)) from err
        finally:
            Path(tmp).unlink(missing_ok=True)  # already gone after a successful os.replace

    def head(self, key: str) -> ObjectInfo | None:
        full = self._full(key)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=full)
        except _VENDOR_ERRORS as err:
            translated = _translate(err, "head", self._where(full))
            if isinstance(translated, ObjectNotFound):
                return None
            raise translated from err
        return ObjectInfo(key=key, size=int(response["ContentLength"]))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects at or under `prefix`. A listed key that is not a safe key under the store raises
        InvalidKey: a hostile object name is refused, never mapped to some other key."""
        search = self._search_prefix(prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=search)
        try:
            for page in pages:
                for obj in page.get("Contents", ()):
                    full = obj["Key"]
                    if self._is_under(full, search, prefix):
                        yield ObjectInfo(key=self._relative(full), size=int(obj["Size"]))
        except _VENDOR_ERRORS as err:
            raise _translate(err, "list", self._where(search)) from err

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except _VENDOR_ERRORS as err:
            translated = _translate(err, "delete", self._where(full))
            if not isinstance(translated, ObjectNotFound):  # S3 answers 204 for absent keys; others may 404
                raise translated from err

    # Beyond the protocol.

    def abort_stale_uploads(self, prefix: str, older_than_s: float) -> int:
        """Abort multipart uploads at or under `prefix` ('' = the whole store) initiated more than
        `older_than_s` seconds ago; return how many were aborted. The server's `Initiated` time is compared
        with this node's clock, so leave a margin for skew larger than any upload takes.

        Interrupted uploads are invisible to `list` but their parts are billed until aborted. A listed
        upload key that is not a safe key under the store raises InvalidKey.
        """
        if older_than_s < 0:
            raise ValueError(f"older_than_s={older_than_s}: expected >= 0")
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than_s)
        search = self._search_prefix(prefix)
        pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=search)
        stale: list[tuple[str, str]] = []
        try:
            for page in pages:
                for upload in page.get("Uploads", ()):
                    full = upload["Key"]
                    if self._is_under(full, search, prefix):
                        self._relative(full)
                        if upload["Initiated"] < cutoff:
                            stale.append((full, upload["UploadId"]))
        except _VENDOR_ERRORS as err:
            raise _translate(err, "list uploads", self._where(search)) from err
        aborted = 0
        for full, upload_id in stale:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
                aborted += 1
            except ClientError as err:
                if _error_code(err)[0] != "NoSuchUpload":  # completed or aborted meanwhile
                    raise _translate(err, "abort upload", self._where(full)) from err
            except _VENDOR_ERRORS as err:
                raise _translate(err, "abort upload", self._where(full)) from err
        return aborted
