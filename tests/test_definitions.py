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
