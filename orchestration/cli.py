"""The `refinery` command: every subcommand, imported explicitly.

Each command's module exposes `register(subparsers)` (refinery/commands.py says what it sets), and
keeps heavy imports (dagster, torch) inside its command function so `refinery --help` is instant.
Every command exits non-zero on error with a message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import sys

from orchestration import demo, lineage
from refinery import commands, funnel_report, init, scan, validate, why
from training import cli as train

# Each defines `register(subparsers)`, in the order `refinery --help` lists them.
COMMAND_MODULES = (demo, scan, lineage, funnel_report, why, validate, init, train)

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

`refinery COMMAND --help` describes each command. Exit status: 0 success, 1 a failed check,
2 a config or input problem (nothing was run), 3 training halted."""


def build_parser() -> argparse.ArgumentParser:
    return commands.build_parser(COMMAND_MODULES, description=DESCRIPTION, epilog=EPILOG)


def main(argv: list[str] | None = None) -> int:
    return commands.run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
