"""The floors hold: refinery/ is the pure library, training/ stands on it alone, assets/ only wires
Dagster over both, orchestration/ assembles everything (docs/architecture.md).

Every import counts: top-level, inside functions, `importlib.import_module("...")` and
`__import__("...")` with a literal name, `python -m MODULE` launches written as a literal
`"-m", "MODULE"` pair, and any string that is a project module's dotted name (a list of modules
to preload is imports all the same). A violation or an import cycle between the project's modules fails with the
file and line that makes it. Imports under `if TYPE_CHECKING:` count for both: one never runs, but a
cycle it closes is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("refinery", "training", "assets", "orchestration")
# What each floor may import from the project's packages (its own package always).
ALLOWED = {
    "refinery": set(),
    "training": {"refinery"},
    "assets": {"refinery", "training"},
    "orchestration": {"refinery", "training", "assets"},
}
# Third-party packages a floor may never import.
FORBIDDEN_THIRD_PARTY = {"refinery": {"dagster"}, "training": {"dagster"}}
# Inside refinery/, the three packages of the data's work and what each may import of the others:
# per-document stages (with stats/base, the floor) stand alone, the trained models apply to documents
# through the stages' Stage, and the global steps run over the whole corpus, scoring with the models.
STAGE_PACKAGES = {
    "refinery.stages": set(),
    "refinery.models": {"refinery.stages"},
    "refinery.global_steps": {"refinery.stages", "refinery.models"},
}


def stage_package_violation(module: str, name: str) -> bool:
    """Whether `module` importing `name` crosses STAGE_PACKAGES the wrong way."""
    here = next((p for p in STAGE_PACKAGES if module == p or module.startswith(p + ".")), None)
    there = next((p for p in STAGE_PACKAGES if name == p or name.startswith(p + ".")), None)
    return here is not None and there is not None and there != here and there not in STAGE_PACKAGES[here]


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = REPO) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a project module (`a.b.C` -> `a.b`)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported name, line) for every import the module makes, wherever it is made."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in modules else base, node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                found.append((str(node.args[0].value), node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                and node.value in modules:
            found.append((node.value, node.lineno))  # an import string: a preload list, a lazy import
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
            for flag, target in zip(items, items[1:]):
                if (isinstance(flag, ast.Constant) and flag.value == "-m"
                        and isinstance(target, ast.Constant) and isinstance(target.value, str)):
                    found.append((target.value, node.lineno))
    return list(dict.fromkeys(found))  # a string seen as a call's argument and as a constant counts once


def dependency_graph(root: Path = REPO) -> tuple[dict[str, set[str]], list[str]]:
    modules = project_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    violations = []
    for module, path in modules.items():
        floor = module.split(".")[0]
        where = path.relative_to(root)
        for name, line in imports_of(module, path, modules):
            top = name.split(".")[0]
            if top in FORBIDDEN_THIRD_PARTY.get(floor, set()) or top.startswith("dagster_") and floor in FORBIDDEN_THIRD_PARTY:
                violations.append(f"{where}:{line}: {floor}/ imports {name}")
            if top not in PACKAGES:
                continue
            if top != floor and top not in ALLOWED[floor]:
                violations.append(f"{where}:{line}: {floor}/ imports {name}")
            if stage_package_violation(module, name):
                violations.append(f"{where}:{line}: {module} imports {name} (STAGE_PACKAGES)")
            target = resolve(name, modules)
            if target is not None and target != module:
                graph[module].add(target)
    return graph, violations


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_floor_imports_only_the_floors_below_it():
    _, violations = dependency_graph()
    assert not violations, "imports that break the floors (docs/architecture.md):\n" + "\n".join(violations)


def test_no_import_cycles_between_modules():
    graph, _ = dependency_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("source, expected", [
    ("import assets.funnel\n", ["assets.funnel"]),
    ("def f():\n    from orchestration import resources\n", ["orchestration.resources"]),
    ("import importlib\nimportlib.import_module('training.cli')\n", ["training.cli"]),
    ("cmd = ['python', '-m', 'orchestration.cli', 'train']\n", ["orchestration.cli"]),
    ("PRELOAD = ['assets.funnel', 'polars']\n", ["assets.funnel"]),
    ("from .base import Stage\n", ["refinery.stages.base"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from refinery.curriculum.manifests import PhaseManifest\n",
     ["refinery.curriculum.manifests"]),
])
def test_the_scanner_sees_every_kind_of_import(tmp_path, source, expected):
    """The checker itself: each way of importing is found (a checker that misses one passes anything)."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    modules = project_modules()
    names = [resolve(name, modules) or name for name, _ in imports_of("refinery.stages.probe", path, modules)]
    assert [n for n in names if n.split(".")[0] in PACKAGES] == expected


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_a_type_only_import_closes_a_cycle(tmp_path):
    """A cycle closed by an import under `if TYPE_CHECKING:` is a cycle (refinery/curriculum/ had one:
    schedule.py naming PhaseManifest for a type)."""
    (tmp_path / "refinery").mkdir()
    (tmp_path / "refinery/schedule.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from refinery.manifests import PhaseManifest\n")
    (tmp_path / "refinery/manifests.py").write_text("from refinery.schedule import Schedule\n")
    graph, violations = dependency_graph(tmp_path)
    assert not violations and cycles(graph) == [["refinery.manifests", "refinery.schedule"]]


@pytest.mark.parametrize("module, name, broken", [
    ("refinery.stages.pii", "refinery.global_steps.tokenize", True),
    ("refinery.stages.heuristic.filter", "refinery.models.quality", True),
    ("refinery.models.quality", "refinery.global_steps.dedup_compute", True),
    ("refinery.global_steps.tokenize", "refinery.models.difficulty", False),
    ("refinery.models.quality", "refinery.stages.base", False),
    ("refinery.stages.base", "refinery.stages.stats", False),
])
def test_the_stage_packages_import_in_one_direction(module, name, broken):
    assert stage_package_violation(module, name) is broken


def command_modules(modules: dict[str, Path]) -> set[str]:
    """The command modules of the library: refinery/commands/ (orchestration/ is above assets/ anyway;
    assets/pipes_train.py is the `train` command run under Dagster Pipes, so it builds training/cli.py's parser)."""
    return {m for m in modules if m == "refinery.commands" or m.startswith("refinery.commands.")}


def command_imports(module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """`path:line: imports M` for each command module `module` imports."""
    commands = command_modules(modules)
    return [f"{path.name}:{line}: imports {target}" for name, line in imports_of(module, path, modules)
            if (target := resolve(name, modules)) in commands]


def test_assets_import_no_command_module():
    """Report helpers live in refinery/reports/, which commands and assets both import; an asset that
    needs a command's module has found a helper that belongs there."""
    modules = project_modules()
    found = [hit for module, path in modules.items() if module.split(".")[0] == "assets"
             for hit in command_imports(module, path, modules)]
    assert not found, "assets/ imports command modules:\n" + "\n".join(found)


@pytest.mark.parametrize("source", ["from refinery.commands.scan import run_scan\n",
                                    "def f():\n    from refinery import commands\n",
                                    "import refinery.commands.validate\n"])
def test_an_asset_importing_a_command_is_found(tmp_path, source):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert len(command_imports("assets.probe", path, project_modules())) == 1
