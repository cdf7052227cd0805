"""bench/RESULTS.md opens with one table of every target (the spec's §10 and the issues'), each row
naming the bench script that measures it; the dated log stays below. A row whose bench is gone, a
bench that states a target in its docstring without a row, or a row without its date, machine,
command or verdict fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
TABLE_HEADING = "## Targets: where each stands"
COLUMNS = ["target", "figure now", "met", "measured", "machine", "command"]
VERDICTS = {"met", "not met", "partly", "not measured"}
# A bench states a target in its docstring as "Target: ..." or "Targets (issue N): ...".
STATES_TARGET = re.compile(r"\bTargets?\b(?: \([^)]*\))?:")
# A bench named by its script (`bench/minhash.py`) or as a module (`python -m bench.dedup_memory`).
BENCH = re.compile(r"\bbench/([a-z_0-9]+)\.py|-m bench\.([a-z_0-9]+)\b")


def benches_named(command: str) -> list[str]:
    return [script or module for script, module in BENCH.findall(command)]


def table_rows() -> list[dict[str, str]]:
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    start = lines.index(TABLE_HEADING)
    table = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, rule, *rows = table
    assert header == COLUMNS and set("".join(rule)) <= set("-: ")
    assert all(len(row) == len(COLUMNS) for row in rows), [row for row in rows if len(row) != len(COLUMNS)]
    return [dict(zip(COLUMNS, row)) for row in rows]


def benches_stating_a_target() -> set[str]:
    out = set()
    for path in (REPO / "bench").glob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if STATES_TARGET.search(doc):
            out.add(path.stem)
    return out


def test_the_table_opens_the_file_and_the_dated_log_follows_it():
    lines = RESULTS.read_text(encoding="utf-8").splitlines()
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == TABLE_HEADING
    assert len(headings) > 10  # the log, below the table


def test_every_row_names_a_bench_that_exists_and_says_when_where_and_whether():
    rows = table_rows()
    assert len(rows) >= 20
    for row in rows:
        named = benches_named(row["command"])
        assert named, row
        for stem in named:
            assert (REPO / "bench" / f"{stem}.py").is_file(), f"{row['target']}: bench/{stem}.py is gone"
        assert row["met"].strip("*") in VERDICTS, row
        assert re.search(r"20\d\d-\d\d-\d\d", row["measured"]), row
        assert row["machine"] and row["figure now"], row


def test_every_bench_that_states_a_target_has_a_row():
    named = {stem for row in table_rows() for stem in benches_named(row["command"])}
    assert benches_stating_a_target() <= named, sorted(benches_stating_a_target() - named)
    assert {"loader", "shuffle", "trainer_scale"} <= benches_stating_a_target()  # the pattern still finds them
