"""An asset's code version covers every file of the stage it runs: a package (the heuristic rule
families, the readers) hashes each of its modules, so editing one marks the asset stale."""

import json
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


def test_a_code_version_keeps_its_parts_and_the_plan_names_the_ones_that_moved(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from assets import provenance
    from orchestration.changed import CODE_EDITED, _history, code_changes
    from refinery.stages import heuristic

    old = provenance.stage_code_version("heuristic_filtered", provenance.code_version(heuristic))
    parts = provenance.CODE_PARTS[old]
    assert "refinery.stages.heuristic/c4.py" in parts and "the registry's record of heuristic_filtered" in parts
    instance = SimpleNamespace(root_directory=str(tmp_path))
    _history(instance).mkdir()
    (_history(instance) / f"code-{old}.json").write_text(json.dumps(parts))

    real = provenance.module_parts
    monkeypatch.setattr(provenance, "module_parts", lambda m: {
        name: src + ("\n# edited" if name.endswith("/c4.py") else "") for name, src in real(m).items()})
    new = provenance.stage_code_version("heuristic_filtered", provenance.code_version(heuristic))
    assert new != old
    assert code_changes(instance, old, new) == f"{CODE_EDITED}: refinery.stages.heuristic/c4.py"
    assert code_changes(instance, "000000000000", new) == CODE_EDITED  # the old version's parts were never kept
