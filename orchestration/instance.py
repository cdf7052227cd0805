"""Which Dagster instance a config's runs go to: one per data root, under $DAGSTER_HOME.

Dagster knows an asset by its key and partition (`heuristic_filtered[web-b0]`), not by the folder it
was written to. Two configs with different data roots in one instance would each read the other's
materializations as their own: `--changed` would plan a new, empty data root as done, and the UI
would mix two corpora. So `$DAGSTER_HOME` (default .dagster_home) holds one instance directory per
data root, named after the root's last path part and a hash of its full address:
`.dagster_home/out-3f2a9c1e0b`. `refinery demo` records there, `make ui CONFIG=...` serves it
(`python -m orchestration.instance CONFIG` prints it), and a data root moved or copied elsewhere
starts an empty history, as its bytes are no longer where Dagster saw them written. A dagster.yaml
in $DAGSTER_HOME itself is copied into each new instance directory; on Postgres (which keeps runs
and events in the database, not the folder) each data root needs its own database for the same
separation (docs/automation.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from refinery.config import RefineryConfig, load_config

DEFAULT_BASE = ".dagster_home"
# A fresh instance directory's dagster.yaml when $DAGSTER_HOME has none of its own: local SQLite
# storage, no telemetry banner.
FRESH_INSTANCE_YAML = "telemetry:\n  enabled: false\n"


def data_root_identity(cfg: RefineryConfig) -> str:
    """The data root's full address: an absolute local path, or the `s3://` URL."""
    root = cfg.resolve(cfg.data_root)
    return root if "://" in root else os.path.realpath(root)


def instance_dir(cfg: RefineryConfig, base: str | None = None) -> Path:
    """The instance directory of the config's data root under `base` ($DAGSTER_HOME when None)."""
    base = base or os.environ.get("DAGSTER_HOME") or DEFAULT_BASE
    identity = data_root_identity(cfg)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", identity.rstrip("/").rsplit("/", 1)[-1]) or "root"
    return Path(base).absolute() / f"{name}-{hashlib.sha256(identity.encode()).hexdigest()[:10]}"


def prepare_instance_dir(cfg: RefineryConfig, base: str | None = None) -> Path:
    """The config's instance directory, created when missing with a copy of `base`'s dagster.yaml
    (a Postgres deployment's storage, run coordinator and launcher carry over), or a fresh local one."""
    home = instance_dir(cfg, base)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shared = home.parent / "dagster.yaml"
        (home / "dagster.yaml").write_text(shared.read_text() if shared.is_file() else FRESH_INSTANCE_YAML)
    return home


def main(argv: list[str]) -> int:
    """Print the instance directory of the config named, under BASE ($DAGSTER_HOME when not given),
    creating it: the Makefile's `ui` target serves it."""
    if len(argv) not in (1, 2):
        print("usage: python -m orchestration.instance CONFIG [BASE]", file=sys.stderr)
        return 2
    print(prepare_instance_dir(load_config(argv[0]), argv[1] if len(argv) == 2 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
