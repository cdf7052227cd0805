"""The only place resources are built.

`RefineryResource` (assets/resource.py) is what every asset asks for: the loaded config and the data
root. Which data root (a local folder or `s3://...`) comes from the config; S3 credentials come only
from the environment (through dagster-aws's `S3Resource` and `EnvVar`), never from the config file.
"""

from __future__ import annotations

import os

import dagster as dg
from dagster_aws.s3 import S3Resource

from assets.resource import RefineryResource
from refinery.config import load_config

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.yaml")


def config_path_from_env() -> str:
    return os.environ.get("REFINERY_CONFIG", DEFAULT_CONFIG)


def s3_resource_from_env() -> S3Resource:
    """dagster-aws's S3Resource with every setting taken from the environment.

    Credentials are passed as `EnvVar`s, so Dagster shows the variable's name, never its value; when
    they are unset boto3's own chain (profile, instance role, IRSA on Kubernetes) supplies them.
    """
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    settings: dict[str, object] = {"region_name": region}
    from_env = (
        ("REFINERY_S3_ENDPOINT", "endpoint_url"),
        ("AWS_ENDPOINT_URL", "endpoint_url"),
        ("AWS_ACCESS_KEY_ID", "aws_access_key_id"),
        ("AWS_SECRET_ACCESS_KEY", "aws_secret_access_key"),
        ("AWS_SESSION_TOKEN", "aws_session_token"),
    )
    for name, field in from_env:
        if os.environ.get(name) and field not in settings:
            settings[field] = dg.EnvVar(name)
    return S3Resource(**settings)


def build_resources(config_path: str) -> dict[str, object]:
    cfg = load_config(config_path)
    s3 = s3_resource_from_env() if cfg.resolve(cfg.data_root).startswith("s3://") else None
    return {"refinery": RefineryResource(config_path=config_path, s3=s3)}
