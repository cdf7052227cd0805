"""The `refinery` command line: full help for the program and every subcommand, `--config` and the
positional config of `validate`, and `scan`'s list of what the drop policy removed."""

from __future__ import annotations

import json

import polars as pl
import pytest

from orchestration.cli import COMMAND_MODULES, build_parser, main
from refinery.layout import exclusions_key, hits_key, scan_report_key
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key
from refinery.reports.exclusions import dropped_documents, format_dropped
from refinery.storage import LocalDataRoot

from helpers.configs import write_config
from helpers.final_shards import config_dict

COMMANDS = ["demo", "scan", "lineage", "funnel", "why", "validate", "init", "compare", "ablations", "train"]
TWO_ROOTS = {"compare"}  # takes two data roots (or their configs) instead of --config


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_program_help_is_whole_and_lists_every_command(capsys):
    text = help_text(capsys)
    flat = " ".join(text.split())
    # The description used to stop at the module docstring's first line, mid-sentence.
    assert "Every command checks the whole config first and lists every problem it finds, each naming its field, " \
           "then exits 2 before any work starts." in flat
    assert "refinery demo --config my.yaml" in text and "Exit status: 0 success" in flat
    for command in COMMANDS:
        assert f"    {command} " in text, command
    assert list(COMMAND_MODULES) == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_line_gets_the_parser_of_its_own_command(command):
    """`refinery COMMAND ...` imports only COMMAND's module: the module listed must add that command."""
    parser = build_parser([command])
    assert list(parser._subparsers._group_actions[0].choices) == [command]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_paragraph_an_example_and_config(capsys, command):
    text = help_text(capsys, command)
    usage, description = text.split("\n\n")[:2]
    assert usage.startswith(f"usage: refinery {command}")
    assert len(" ".join(description.split())) > 250 and description.rstrip().endswith("."), description
    epilog = text.split("\nexample")[-1]
    assert epilog != text and f"\n  refinery {command} " in epilog
    assert ("ROOT_A ROOT_B" if command in TWO_ROOTS else "--config CONFIG") in text
    assert all(len(line) <= 120 for line in text.splitlines()), "prose wraps; only example lines run long"


def test_validate_takes_the_config_by_flag_or_by_position(tmp_path, capsys):
    path = write_config(tmp_path, config_dict(tmp_path))
    outputs = []
    for argv in (["--config", str(path)], [str(path)]):
        assert main(["validate", *argv, "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and outputs[0]["ok"]
    assert main(["validate"]) == 2
    assert "give the config, e.g. `refinery validate --config configs/demo.yaml`" in capsys.readouterr().err
    # Both forms run the preflight: a bad config is refused the same way.
    bad = config_dict(tmp_path)
    bad["contamination"] = {"anneal_phase": "cool"}
    write_config(tmp_path, bad)
    for argv in (["--config", str(path)], [str(path)]):
        assert main(["validate", *argv]) == 2
        assert "  contamination.anneal_phase: no phase 'cool'; use one of ['main', 'anneal']" in capsys.readouterr().err


def test_parsers_are_built_from_the_listed_modules():
    parser = build_parser()
    args = parser.parse_args(["validate", "c.yaml"])
    assert (args.config, args.config_file) == (None, "c.yaml")


def drop_fixture(root: LocalDataRoot) -> None:
    """What contamination_scan leaves after two scans under the drop policy: an earlier drop of
    p0/3, the latest of p0/1 and p1/0 (found by the latest scan, whose hits name them)."""
    root.write_json(exclusions_key("anneal"), ["p0/1", "p0/3", "p1/0"])
    root.write_json(scan_report_key("anneal"), {"dropped": ["p0/1", "p1/0"], "passed": True})
    root.write_parquet(hits_key("anneal"), pl.DataFrame({
        "doc_id": ["p0/1", "p1/0", "p1/0"], "url": ["u", "v", "v"], "bucket": ["web", "math", "math"],
        "eval_set": ["ev", "ev", "other"], "eval_id": ["7", "9", "1"], "ngram": ["a", "b", "c"], "matched_ngrams": [1, 2, 1]}))
    for partition, rows in {"p0": [("p0/0", "https://a.example/0"), ("p0/1", "https://a.example/1"), ("p0/3", None)],
                            "p1": [("p1/0", "https://b.example/0")]}.items():
        root.write_parquet(documents_key(CLEAN_STAGE, partition), pl.DataFrame(
            {"doc_id": [d for d, _ in rows], "url": [u for _, u in rows], "text": ["x"] * len(rows)}))


def test_scan_lists_what_the_drop_policy_removed(tmp_path):
    root = LocalDataRoot(tmp_path)
    assert dropped_documents(root, "anneal") == []
    assert format_dropped("anneal", []) == ["drop policy: no document removed from phase anneal"]
    drop_fixture(root)
    dropped = dropped_documents(root, "anneal")
    assert dropped == [
        {"doc_id": "p0/1", "url": "https://a.example/1", "latest": True, "eval_item": "ev/7"},
        {"doc_id": "p0/3", "url": None, "latest": False, "eval_item": None},
        {"doc_id": "p1/0", "url": "https://b.example/0", "latest": True, "eval_item": "ev/9"},
    ]
    assert format_dropped("anneal", dropped) == [
        "drop policy: 3 document(s) removed from phase anneal, 2 by the latest contamination_scan (marked *):",
        "  * p0/1  https://a.example/1  ev/7",
        "    p0/3  -",
        "  * p1/0  https://b.example/0  ev/9",
    ]
