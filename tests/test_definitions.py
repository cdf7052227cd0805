"""The Dagster layer loads, and the pure layers stay free of it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_workspace_definitions_validate(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("package", ["training", "refinery", "refinery.stages"])
def test_pure_packages_do_not_import_dagster(package):
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts)
        for p in (REPO / package.replace(".", "/")).glob("*.py")
        if p.name != "__init__.py" and p.stem not in {"cli", "demo"}
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{package} pulled in dagster: {out.stdout}{out.stderr}"


def test_each_assets_code_version_carries_the_config_it_reads_and_no_other():
    """CONFIG_READ names every asset of the demo's graph, no more, besides the ablation assets (the
    demo declares no `ablations`; tests/test_ablation_assets.py and test_ablation_schedules.py build them); a value an asset reads changes its
    version, a value it does not read (or where the work and the trainer run) leaves it, and the
    config's fingerprint."""
    import yaml

    from assets.provenance import CONFIG_READ, config_versioned
    from orchestration.definitions import build_definitions
    from refinery.config import parse_config

    defs = build_definitions(str(REPO / "configs" / "demo.yaml"))
    graph = defs.resolve_asset_graph()
    from orchestration.automation import ABLATIONS, SCHEDULE_ABLATIONS

    ablation_assets = {*ABLATIONS, *SCHEDULE_ABLATIONS}
    assert {k.to_user_string() for k in graph.materializable_asset_keys} == set(CONFIG_READ) - ablation_assets
    data = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    base = parse_config(data, str(REPO / "configs"))
    moved = {**data, "partitions": {"workers": 4}, "execution": {"engine": "ray", "address": "host-cluster"},
             "training": {**data.get("training", {}), "launch": "ray", "ray_cpus": 8}}
    assert parse_config(moved, str(REPO / "configs")).fingerprint() == base.fingerprint()
    edited = parse_config({**moved, "stages": {**data.get("stages", {}), "pii": {"email": False}}}, str(REPO / "configs"))
    changed = {name for name in CONFIG_READ
               if config_versioned(base)(_spec(name)).code_version != config_versioned(edited)(_spec(name)).code_version}
    assert changed == {"pii_redacted", "ablation_variants"}  # a variant redacts the documents it lets back in


def _spec(name: str):
    import dagster as dg

    return dg.AssetSpec(name, code_version="code")


def test_the_readmes_asset_groups_are_the_ones_the_ui_shows():
    """README.md's graph table lists each group of the demo's definitions once, with exactly its assets
    (a backticked name in a row that is an asset's name)."""
    import re

    from orchestration.definitions import build_definitions

    graph = build_definitions(str(REPO / "configs" / "demo.yaml")).resolve_asset_graph()
    groups: dict[str, set[str]] = {}
    for key in graph.get_all_asset_keys():
        groups.setdefault(graph.get(key).group_name, set()).add(key.to_user_string())
    assets = set().union(*groups.values())
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| group | assets |"):].split("\n\n")[0].splitlines()[2:]
    listed = {}
    for row in table:
        group, cell = (c.strip() for c in row.strip("|").split("|", 1))
        assert group not in listed, f"README lists group {group} twice"
        listed[group] = set(re.findall(r"`([a-z_]+)`", cell)) & assets
    assert listed == groups
