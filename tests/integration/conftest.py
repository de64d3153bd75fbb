"""Fixtures for integration tests: one moto S3 server and one SeaweedFS server per session (each started
when first asked for), a fresh bucket per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from entrypoint.store.file import FileStore
from entrypoint.store.s3 import S3Store
from tests.s3server import MotoServer, SeaweedServer, create_bucket

MiB = 1 << 20
TEST_PART_SIZE = 5 * MiB  # S3's minimum part size: a 12 MiB file goes up and down in 3 parts

# moto accepts any credentials and SeaweedFS is configured with these; the config files point nowhere so a
# developer's ~/.aws cannot leak in.
TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
CLEARED_ENV = (
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REQUEST_CHECKSUM_CALCULATION",
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "RENTUNE_S3_ADDRESSING_STYLE",
)


@contextmanager
def _test_env() -> Iterator[None]:
    """TEST_ENV set and CLEARED_ENV unset in the environment meanwhile (then restored)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in TEST_ENV.items():
            mp.setenv(name, value)
        for name in CLEARED_ENV:
            mp.delenv(name, raising=False)
        yield


def _store_in_fresh_bucket(endpoint: str) -> S3Store:
    bucket = create_bucket(endpoint)
    return S3Store.from_uri(
        f"s3://{bucket}/store-root",
        endpoint_url=endpoint,
        addressing_style="path",
        multipart_threshold=TEST_PART_SIZE,
        multipart_chunksize=TEST_PART_SIZE,
        max_concurrency=4,
    )


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto server on 127.0.0.1; fake AWS credentials in the environment meanwhile
    (restored when the session ends)."""
    with _test_env(), MotoServer() as server:
        yield server.endpoint_url


@pytest.fixture
def s3_store(s3_server) -> S3Store:
    """An S3Store under a prefix of a fresh bucket on moto, with 5 MiB parts so multipart stays fast."""
    return _store_in_fresh_bucket(s3_server)


@pytest.fixture(scope="session")
def seaweed_server():
    """The S3 endpoint URL of a SeaweedFS server (`weed server -s3`) on 127.0.0.1; the same fake AWS
    credentials in the environment meanwhile (restored when the session ends), which it accepts."""
    with _test_env(), SeaweedServer() as server:
        yield server.endpoint_url


@pytest.fixture
def seaweed_store(seaweed_server) -> S3Store:
    """An S3Store under a prefix of a fresh bucket on SeaweedFS, with 5 MiB parts so multipart stays fast."""
    return _store_in_fresh_bucket(seaweed_server)


@pytest.fixture
def file_store(tmp_path) -> FileStore:
    """A FileStore in `tmp_path/store` (the rest of tmp_path is free for local files)."""
    return FileStore(tmp_path / "store")
