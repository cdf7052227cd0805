"""A phase's seq_len reaches the model through at most six files, and the schedule is built in one
place (issue 22; docs/architecture.md, "A phase's seq_len, from the YAML to the model").

A module names seq_len when its code reads or binds a name or attribute `seq_len` (or `seq_lens`,
`seq_len_at`, `mean_seq_len`: any identifier with seq_len as a word of it), takes or passes it as a
parameter or keyword, or uses such an identifier as a string (a dict key, a `getattr` name).
Comments and docstrings do not count, nor do `max_seq_len` (the shards' packing window) and
`original_seq_len` (YaRN's native length), which name other quantities. The scan covers refinery/
and training/; every module there that names seq_len is listed below with what it does with it, so
a new one fails here until it is placed, and the path itself stays at most six modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("refinery", "training", "synthetic")
PACKAGES = ("refinery", "training", "assets", "orchestration")  # where a schedule could be built
SEQ_LEN_WORD = re.compile(r"(?:^|_)seq_lens?(?:_|$)")
OTHER_QUANTITIES = {"max_seq_len", "original_seq_len"}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The value's path, in order: each module passes it on to the next, and the last hands the model
# tensors of that many positions.
PATH = {
    "refinery/config/curriculum.py": "declares it: PhaseConfig.seq_len, the YAML's field",
    "refinery/curriculum/schedule.py": "places each phase on the token axis (place_phases, for the config and "
                                       "for the manifests)",
    "refinery/curriculum/manifests.py": "pins it in the phase manifest, the trainer's contract",
    "training/schedule.py": "the trainer's phases, built once from the manifests; the rest of the trainer asks it "
                            "for tokens per step, the length jump and the RoPE scaling",
    "training/sampler.py": "plans every row as seq_len tokens of an entry set's stream",
    "training/data.py": "cuts the rows (trained and held-out) the model reads: (rows, seq_len) arrays",
}
# The destination: the model takes its length from its input's shape.
MODEL = {
    "training/rope.py": "position tables as long as the model's input (T, from the tensor's shape)",
}
# Modules that read it without passing it towards the model.
OFF_PATH = {
    "refinery/curriculum/contract.py": "checks it against the packed window and whole optimizer steps; the "
                                       "contract's numbers",
    "refinery/reports/contract.py": "prints and plots the contract",
    "refinery/curriculum/phase_fields.py": "declares which records carry it (the plan, the span, the manifest) "
                                           "and how a config and a manifest compare on it; the schedule and the "
                                           "manifests copy it by that declaration",
    "synthetic/curriculum.py": "writes synthetic curricula and their manifests for tests",
    "refinery/commands/init.py": "writes the YAML",
    "refinery/global_steps/tokenize.py": "packs shards as long as the longest phase",
    "training/token_lineage.py": "bounds a looked-up position by its step's seq_len",
    "refinery/config/ablations.py": "declares ablations.seq_len, the proxy runs' one phase length",
    "refinery/config/run.py": "refuses an ablations.tokens budget that is not whole proxy steps of it",
    "refinery/ablations/build.py": "writes ablations.seq_len into each variant's one-phase curriculum, which then "
                                   "takes the path above",
    "refinery/ablations/bpb.py": "cuts the evaluation documents into windows of the proxy's seq_len (forward only)",
    "training/proxy_run.py": "reads the variant's phase seq_len for the evaluation windows and records it",
    "refinery/ablations/bounded.py": "adds a row of the proxy's seq_len to each bucket's stored target (the sampler's slack)",
    "refinery/ablations/schedules.py": "scales each curriculum phase's seq_len to the proxy window for the schedule "
                                       "variants' tables, which then take the path above",
    "refinery/ablations/schedule_runs.py": "passes the derived table's proxy seq_len to its run's config",
    "refinery/ablations/schedule_report.py": "reports each schedule's share-weighted mean seq_len (its token-FLOPs)",
    "refinery/config/ablation_schedules.py": "refuses a phase patch whose seq_len the proxy window cannot scale",
}
MAX_PATH_FILES = 6


def seq_len_uses(source: str) -> list[tuple[int, str]]:
    """(line, identifier) for every place `source` names seq_len (see the module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.arg, ast.keyword)):
            names = [node.arg] if node.arg else []
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.rpartition(".")[2]]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and IDENTIFIER.fullmatch(node.value):
            names = [node.value]  # a whole-identifier string; docstrings and messages are sentences
        else:
            names = []
        line = getattr(node, "lineno", 0)
        found += [(line, n) for n in names if n not in OTHER_QUANTITIES and SEQ_LEN_WORD.search(n)]
    return found


def modules_naming_seq_len(root: Path) -> dict[str, list[tuple[int, str]]]:
    """Per module (path relative to `root`) under SCANNED, where it names seq_len."""
    out = {}
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            uses = seq_len_uses(path.read_text())
            if uses:
                out[path.relative_to(root).as_posix()] = uses
    return out


@pytest.mark.parametrize("source, expected", [
    ("x = phase.seq_len", ["seq_len"]),
    ("f(seq_len=4)", ["seq_len"]),
    ("def f(seq_len): pass", ["seq_len"]),
    ("seq_len = 4", ["seq_len"]),
    ("from m import seq_len_at", ["seq_len_at"]),
    ("y = schedule.seq_len_at(3)", ["seq_len_at"]),
    ("n = contract['mean_seq_len']", ["mean_seq_len"]),
    ("getattr(m, 'seq_len')", ["seq_len"]),
    ("def f(seq_lens): return seq_lens", ["seq_lens", "seq_lens"]),
    ("class C:\n    seq_len: int", ["seq_len"]),
    ('"""Rows of seq_len tokens."""\n# the seq_len\nx = 1', []),
    ("raise ValueError(f'{where}.seq_len is too long')", []),
    ("w = cfg.shards.max_seq_len", []),
    ("r = RopeScaling(2.0, original_seq_len=8)", []),
    ("flex(q, k, seq_lengths=(T, T))", []),
])
def test_the_scanner_sees_every_way_to_name_seq_len(source, expected):
    assert sorted(n for _, n in seq_len_uses(source)) == sorted(expected)


def test_a_new_module_that_names_seq_len_is_found(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "refinery").mkdir()
    (tmp_path / "training" / "loader.py").write_text('"""Chunks of seq_len rows."""\nCHUNK = 1\n')
    (tmp_path / "training" / "trainer.py").write_text("def step(batch):\n    return batch.seq_len * 2\n")
    assert modules_naming_seq_len(tmp_path) == {"training/trainer.py": [(2, "seq_len")]}


def test_every_module_that_names_seq_len_is_placed_on_the_path_or_off_it():
    found = modules_naming_seq_len(REPO)
    placed = {**PATH, **MODEL, **OFF_PATH}
    unplaced = {m: uses for m, uses in found.items() if m not in placed}
    assert not unplaced, (
        "these modules now name seq_len: take what they need from training/schedule.py's StepSchedule "
        "(step_tokens, length_changes_at, rope_scalings, describe) or from the tensors' shape instead, or place "
        f"them here with what they do with it: {unplaced}")
    stale = sorted(set(placed) - set(found))
    assert not stale, f"these modules no longer name seq_len; take them off the lists: {stale}"


def test_seq_len_reaches_the_model_through_at_most_six_files():
    assert not set(PATH) & (set(MODEL) | set(OFF_PATH))
    assert len(PATH) <= MAX_PATH_FILES, f"seq_len's path is {len(PATH)} files: {list(PATH)}"
    # The trainer's run of a step (loader, batches, loop, accounting, validation, length jump) reads
    # no seq_len; it asks the step schedule. A regression here would also show in the test above.
    found = modules_naming_seq_len(REPO)
    for module in ("training/loader.py", "training/batches.py", "training/trainer.py", "training/accounting.py",
                   "training/validation.py", "training/length_jump.py", "training/model.py", "training/attention.py"):
        assert module not in found, (module, found.get(module))


class _CallSites(ast.NodeVisitor):
    """The enclosing function's name ("<module>" outside any) of every call of `callee`, by name or attribute."""

    def __init__(self, callee: str):
        self.callee, self.within, self.found = callee, ["<module>"], []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.within.append(node.name)
        self.generic_visit(node)
        self.within.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) == self.callee:
            self.found.append(self.within[-1])
        self.generic_visit(node)


def call_sites(callee: str, packages: tuple[str, ...] = PACKAGES) -> set[tuple[str, str]]:
    """(module, enclosing function) of every call of `callee` in `packages`."""
    out = set()
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            visitor = _CallSites(callee)
            visitor.visit(ast.parse(path.read_text()))
            out |= {(path.relative_to(REPO).as_posix(), fn) for fn in visitor.found}
    return out


def test_the_call_site_scan_names_the_enclosing_function():
    visitor = _CallSites("Schedule")
    visitor.visit(ast.parse("def place():\n    return m.Schedule(1)\nx = Schedule(2)\n"))
    assert visitor.found == ["place", "<module>"]


def test_the_schedule_is_built_in_one_place():
    """Phase spans are made in `place_phases` alone; the config's schedule and the manifests' both
    come from it, and the trainer's from the manifests alone, in `StepSchedule.build`."""
    builder = {("refinery/curriculum/schedule.py", "place_phases")}
    assert call_sites("Schedule") == builder and call_sites("PhaseSpan") == builder
    # schedule_of: a schedule variant's derived table placed the same way, to plan its bucket tokens
    assert call_sites("place_phases") == {("refinery/curriculum/schedule.py", "build_schedule"),
                                          ("refinery/curriculum/manifests.py", "schedule_from_manifests"),
                                          ("refinery/ablations/schedules.py", "schedule_of")}
    assert call_sites("build_schedule", ("training",)) == set()
    assert call_sites("schedule_from_manifests") == {("training/schedule.py", "build")}
    assert call_sites("StepSchedule") == set()  # only StepSchedule.build makes one, as cls(...)
