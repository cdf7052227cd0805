"""In-process Dagster materializations for the asset tests: the assets that one assets/ module builds
for a config, run with the resources orchestration/resources.py builds from it, or one asset's
partition picked out of the whole workspace; and the in-memory instance the graph tests run them on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import dagster as dg

from assets.partitions import Partitions
from orchestration.definitions import build_definitions as build_workspace
from orchestration.resources import build_resources
from refinery.config import load_config


def module_assets(module: ModuleType, config_path: Path | str) -> dict[str, dg.AssetsDefinition]:
    """The assets `module.build_definitions` makes for the config, by name."""
    cfg = load_config(config_path)
    defs = module.build_definitions(cfg, Partitions.from_config(cfg))
    return {a.key.to_user_string(): a for a in defs.assets}


def materialize(assets: list[dg.AssetsDefinition], config_path: Path | str, partition_key: str | None = None,
                raise_on_error: bool = True) -> dg.ExecuteInProcessResult:
    """`dg.materialize` on an ephemeral instance with the config's resources."""
    return dg.materialize(assets, resources=build_resources(str(config_path)), partition_key=partition_key,
                          raise_on_error=raise_on_error)


@contextmanager
def in_memory_instance(folder: Path) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance that keeps runs, events and partitions in memory and its artifacts under
    `folder`. `instance_for_test` keeps them in SQLite files on disk instead: a database per run, its
    schema created on the run's first event and a commit per event cost more than the assets
    themselves on the sample graph (about 50 s of the 85 s up to the contamination scans)."""
    folder.mkdir(parents=True, exist_ok=True)
    with dg.DagsterInstance.ephemeral(tempdir=str(folder)) as instance:
        yield instance


def materialize_in_workspace(config_path: Path | str, instance: dg.DagsterInstance, asset: str, partition_key: str,
                             run_config: dict | None = None) -> dg.ExecuteInProcessResult:
    """One partition of one asset of the whole workspace (with its checks) on `instance`; a failure
    comes back in the result instead of raising."""
    defs = build_workspace(str(config_path))
    assets = list(defs.assets) + list(defs.asset_checks or [])
    return dg.materialize(assets, selection=[dg.AssetKey(asset)], partition_key=partition_key, instance=instance,
                          resources=defs.resources, run_config=run_config, raise_on_error=False)
