"""The `refinery` command: every subcommand, each from its own module.

Each command's module exposes `register(subparsers)` (refinery/commands/__init__.py says what it sets), and
keeps heavy imports (dagster, torch) inside its command function so `refinery --help` is instant.
A command line that names its command imports that command's module only: a `refinery lineage`
query does not pay for the imports of scan, demo, validate and the rest.
Every command exits non-zero on error with a message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from refinery import commands

# Command name -> the module whose `register(subparsers)` adds it, in the order `refinery --help`
# lists them.
COMMAND_MODULES = {
    "demo": "orchestration.demo",
    "scan": "refinery.commands.scan",
    "lineage": "orchestration.lineage",
    "funnel": "refinery.commands.funnel",
    "why": "refinery.commands.why",
    "validate": "refinery.commands.validate",
    "init": "refinery.commands.init",
    "compare": "refinery.commands.compare",
    "ablations": "refinery.commands.ablations",
    "train": "training.cli",
}

DESCRIPTION = """\
Refinery turns raw web crawl and curated corpora into a clean, deduplicated, curriculum-ordered token
stream and trains on it. The pipeline is a Dagster asset graph; these commands run it on a config
(`refinery demo`), report on what it made (funnel, validate, scan, lineage) and train from its phase
manifests (train). Every command checks the whole config first and lists every problem it finds,
each naming its field, then exits 2 before any work starts."""

EPILOG = """\
examples:
  refinery demo                                      # the whole graph on the bundled sample
  refinery init ~/corpus --config my.yaml            # a commented config for your own files
  refinery demo --config my.yaml                     # the same on your own config
  refinery funnel --config my.yaml                   # retention per stage after a run
  refinery why --config my.yaml https://a.example/x  # which stage removed that page, and why
  refinery validate --config my.yaml                 # the curriculum contract, before training
  refinery compare out/local out/ray                 # which outputs of two runs differ
  refinery ablations --config my.yaml                # what each stage buys a proxy model, in bits per byte

`refinery COMMAND --help` describes each command. Exit status: 0 success, 1 a failed check,
2 a config or input problem (nothing was run), 3 training halted, 4 a step of the graph failed or
found its pool slot held past the wait (`refinery demo`: one line per failed step, naming its log)."""


def build_parser(names: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of the commands named (every command when None), importing only their modules."""
    modules = [importlib.import_module(COMMAND_MODULES[name]) for name in (COMMAND_MODULES if names is None else names)]
    return commands.build_parser(modules, description=DESCRIPTION, epilog=EPILOG)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The program takes no option but --help before its command, so a command line that runs a
    # command starts with its name; anything else (help, a mistyped command) gets every command.
    named = argv[:1] if argv and argv[0] in COMMAND_MODULES else None
    return commands.run(build_parser(named), argv)


if __name__ == "__main__":
    sys.exit(main())
