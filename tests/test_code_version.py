"""An asset's code version covers every file of the stage it runs: a package (the heuristic rule
families, the readers) hashes each of its modules, so editing one marks the asset stale."""

import importlib
import sys

import pytest

from assets.provenance import code_version


@pytest.fixture
def write_module(tmp_path, monkeypatch):
    """Write files under a fresh import root; `load(name)` imports one of them (forgotten after)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = []

    def write(files: dict[str, str]):
        for rel, text in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)

    def load(name: str):
        loaded.append(name)
        return importlib.import_module(name)

    yield write, load
    for name in loaded:
        sys.modules.pop(name, None)


def test_editing_one_module_of_a_package_changes_its_code_version(write_module):
    write, load = write_module
    write({"probe_rules/__init__.py": '"""Rules."""\n', "probe_rules/gopher.py": "THRESHOLD = 3\n"})
    before = code_version(load("probe_rules"))
    write({"probe_rules/gopher.py": "THRESHOLD = 4\n"})
    assert code_version(load("probe_rules")) != before
    write({"probe_rules/gopher.py": "THRESHOLD = 3\n"})
    assert code_version(load("probe_rules")) == before


def test_a_plain_module_hashes_its_own_source_only(write_module):
    write, load = write_module
    write({"probe_single.py": "X = 1\n", "probe_other.py": "Y = 1\n"})
    before = code_version(load("probe_single"))
    write({"probe_other.py": "Y = 2\n"})
    assert code_version(load("probe_single")) == before
