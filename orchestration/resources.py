"""The only place resources are built.

`RefineryResource` is what every asset asks for: the loaded config and the data root. Which data
root (a local folder or `s3://...`) comes from the config; S3 credentials come only from the
environment (through dagster-aws's `S3Resource` and `EnvVar`), never from the config file.
"""

from __future__ import annotations

import os
from functools import cached_property

import dagster as dg

from refinery.config import RefineryConfig, load_config
from refinery.storage import DataRoot, open_data_root

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.yaml")


def config_path_from_env() -> str:
    return os.environ.get("REFINERY_CONFIG", DEFAULT_CONFIG)


class RefineryResource(dg.ConfigurableResource):
    """The run's config file and, through it, the data root every asset reads and writes."""

    config_path: str

    @cached_property
    def config(self) -> RefineryConfig:
        return load_config(self.config_path)

    @cached_property
    def root(self) -> DataRoot:
        return open_data_root(self.config.resolve(self.config.data_root))


def build_resources(config_path: str) -> dict[str, object]:
    return {"refinery": RefineryResource(config_path=config_path)}
