"""Fixtures for integration tests: one moto S3 server per session, a fresh bucket per test."""

from __future__ import annotations

import os

import pytest

from entrypoint.store.file import FileStore
from entrypoint.store.s3 import S3Store
from tests.s3server import MotoServer, create_bucket

MiB = 1 << 20
TEST_PART_SIZE = 5 * MiB  # S3's minimum part size: a 12 MiB file goes up and down in 3 parts

# moto accepts any credentials; the config files point nowhere so a developer's ~/.aws cannot leak in.
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


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto server on 127.0.0.1; fake AWS credentials in the environment meanwhile
    (restored when the session ends)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in TEST_ENV.items():
            mp.setenv(name, value)
        for name in CLEARED_ENV:
            mp.delenv(name, raising=False)
        with MotoServer() as server:
            yield server.endpoint_url


@pytest.fixture
def s3_store(s3_server) -> S3Store:
    """An S3Store under a prefix of a fresh bucket, with 5 MiB parts so multipart stays fast."""
    bucket = create_bucket(s3_server)
    return S3Store.from_uri(
        f"s3://{bucket}/store-root",
        endpoint_url=s3_server,
        addressing_style="path",
        multipart_threshold=TEST_PART_SIZE,
        multipart_chunksize=TEST_PART_SIZE,
        max_concurrency=4,
    )


@pytest.fixture
def file_store(tmp_path) -> FileStore:
    """A FileStore in `tmp_path/store` (the rest of tmp_path is free for local files)."""
    return FileStore(tmp_path / "store")
