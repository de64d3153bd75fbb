"""Credentials in URLs (jobspec/urls.py): what a spec refuses and what rentune redacts wherever it records a
URL it did not refuse (one from the environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobspec.load import SpecError
from jobspec.urls import credential_in, redact, redact_text
from tests.specs import load, tiny_job

CREDENTIALS = [
    ("http://user:SECRET9@mlflow:5000", "user[:password]@"),
    ("https://mlflow/?token=SECRET9", "the parameter 'token'"),
    ("https://mlflow/?a=1&api_key=SECRET9", "the parameter 'api_key'"),
    ("https://acct.blob.core.windows.net/c?sv=2022&sig=SECRET9", "the parameter 'sig'"),  # an Azure SAS
    ("https://mlflow/?pwd=SECRET9", "the parameter 'pwd'"),
    ("https://mlflow/?a=1;token=SECRET9", "the parameter 'token'"),  # ; separates query parameters too
    ("https://mlflow/#token=SECRET9", "the parameter 'token'"),  # the fragment (OAuth's implicit flow)
    ("https://mlflow/#access_token=SECRET9&x=1", "the parameter 'access_token'"),
    ("https://mlflow/api;token=SECRET9/runs", "the parameter 'token'"),  # a path parameter
    ("https://s3.example/b/k?X-Amz-Signature=SECRET9&X-Amz-Credential=SECRET9", "the parameter 'X-Amz-Signature'"),
    ("https://mlflow/?Pass%77ord=SECRET9", "the parameter 'Password'"),  # names are compared unquoted
]
CLEAN = ["https://mlflow:5000/", "s3://bucket/data/key=1/part.jsonl", "file:///tmp/mlruns", "http://h/?page=2#top"]


@pytest.mark.parametrize(("url", "found"), CREDENTIALS)
def test_credentials_are_found_wherever_a_url_carries_parameters_and_redacted(url, found):
    assert credential_in(url) == found
    redacted = redact(url)
    assert "SECRET9" not in redacted and "REDACTED" in redacted or found == "user[:password]@"
    assert "SECRET9" not in redacted and "user" not in redacted  # the names stay, the values go


@pytest.mark.parametrize("url", CLEAN)
def test_urls_without_credentials_pass_unchanged(url):
    assert credential_in(url) is None and redact(url) == url


def test_redact_text_hides_every_url_in_a_line_and_leaves_the_rest():
    line = "notices: cannot read http://u:s3cret@169.254.169.254/latest (refused); mlflow at file:///d?token=XYZ."
    assert redact_text(line) == (
        "notices: cannot read http://169.254.169.254/latest (refused); mlflow at file:///d?token=REDACTED"
    )
    assert redact_text("no url here: a=b?token=1") == "no url here: a=b?token=1"
    assert redact_text("malformed http://[::1 stays") == "malformed http://[::1 stays"


@pytest.mark.parametrize(
    "uri",
    ["https://m/?sig=T", "https://m/?pwd=T", "https://m/?a=1;token=T", "https://m/#token=T", "https://m/x;token=T"],
)
def test_a_spec_refuses_a_tracking_uri_with_a_credential_anywhere_and_never_repeats_it(uri):
    with pytest.raises(SpecError) as refused:
        load(tiny_job("j", Path("m"), tracking={"mlflow": {"tracking_uri": uri}}))
    assert "tracking" in str(refused.value) and "looks like a credential" in str(refused.value)
    assert "=T" not in str(refused.value)
