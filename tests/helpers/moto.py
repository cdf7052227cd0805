"""An in-process S3 (moto) for tests of S3 data roots that need no real server (conftest.py
registers the `moto_s3` fixture for every test module)."""

from __future__ import annotations

import pytest

# The secret key moto is given: tests assert it never shows in a repr or an error message.
SECRET = "moto-secret-Zq81vX0p"


@pytest.fixture
def moto_s3(monkeypatch):
    """Bucket `bkt` on moto, with credentials and region set through the environment only."""
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "motokey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    for name in ("REFINERY_S3_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        import boto3

        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bkt")
        yield
