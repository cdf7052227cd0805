"""What a task needs of its run, as plain values: the loaded config and its data root.

`assets.resource.RefineryResource` (the Dagster resource the steps ask for) is one; a pool or Ray
worker makes a `WorkerRun` from the same settings instead, so a worker imports the library and what
its task needs, never Dagster (issue 50).
"""

from __future__ import annotations

from functools import cached_property, partial
from typing import Any, Callable, Protocol

from refinery.config import RefineryConfig, load_config
from refinery.storage import DataRoot, open_data_root

# (config path, S3 client settings or None): what a worker process needs to make its own run.
WorkerSettings = tuple[str, "dict[str, Any] | None"]


class Run(Protocol):
    """The run a task works for (the driver's Dagster resource or a worker's `WorkerRun`)."""

    @property
    def config(self) -> RefineryConfig: ...

    @property
    def root(self) -> DataRoot: ...

    def worker_settings(self) -> WorkerSettings: ...


def s3_client(settings: dict[str, Any]) -> Any:
    """A boto3 S3 client from dagster-aws `S3Resource`'s fields, built as that resource builds its own
    (a worker gets the same client without importing Dagster)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    session = boto3.session.Session(profile_name=settings.get("profile_name"))
    client = session.resource(
        "s3", region_name=settings.get("region_name"), use_ssl=settings.get("use_ssl", True),
        verify=settings.get("verify"), endpoint_url=settings.get("endpoint_url"),
        aws_access_key_id=settings.get("aws_access_key_id"),
        aws_secret_access_key=settings.get("aws_secret_access_key"),
        aws_session_token=settings.get("aws_session_token"),
        config=Config(retries={"max_attempts": settings.get("max_attempts", 5), "mode": "standard"}),
    ).meta.client
    if settings.get("use_unsigned_session"):
        client.meta.events.register("choose-signer.s3.*", lambda **_: UNSIGNED)
    return client


def run_root(cfg: RefineryConfig, s3_client_of: Callable[[], Any] | None) -> DataRoot:
    """The config's data root: an s3:// one with the client `s3_client_of()` makes when given."""
    url = cfg.resolve(cfg.data_root)
    if url.startswith("s3://") and s3_client_of is not None:
        return open_data_root(url, client=s3_client_of())
    return open_data_root(url)


class WorkerRun:
    """A worker process's run, made from the driver's `worker_settings()`."""

    def __init__(self, config_path: str, s3: dict[str, Any] | None = None):
        self.config_path = config_path
        self.s3 = s3

    @cached_property
    def config(self) -> RefineryConfig:
        return load_config(self.config_path)

    @cached_property
    def root(self) -> DataRoot:
        return run_root(self.config, partial(s3_client, self.s3) if self.s3 is not None else None)

    def worker_settings(self) -> WorkerSettings:
        return self.config_path, self.s3
