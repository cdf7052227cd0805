"""`RefineryResource`, what every asset asks for: the run's loaded config and its data root.

The class lives with the assets that use it; orchestration/resources.py is where instances are
built (the config path from the environment, S3 credentials only through `EnvVar`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Optional

import dagster as dg
from dagster_aws.s3 import S3Resource

from refinery.config import RefineryConfig, load_config
from refinery.run_context import run_root
from refinery.storage import DataRoot


class RefineryResource(dg.ConfigurableResource):
    """The run's config file and, through it, the data root every asset reads and writes."""

    config_path: str
    # Only an s3:// data root uses it; a local root leaves it unset.
    s3: Optional[S3Resource] = None

    @cached_property
    def config(self) -> RefineryConfig:
        return load_config(self.config_path)

    @cached_property
    def root(self) -> DataRoot:
        return run_root(self.config, self.s3.get_client if self.s3 is not None else None)

    def worker_settings(self) -> tuple[str, dict[str, Any] | None]:
        """What a spawned worker process needs to make an equal resource of its own (a resource does
        not pickle, and its clients and caches must not cross processes)."""
        return self.config_path, (self.s3.model_dump() if self.s3 is not None else None)

    @classmethod
    def from_worker_settings(cls, config_path: str, s3: dict[str, Any] | None) -> "RefineryResource":
        return cls(config_path=config_path, s3=S3Resource(**s3) if s3 is not None else None)
