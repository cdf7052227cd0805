"""The `refinery` command. Each subcommand lives in its own module, which exposes
`register(subparsers)`; the module is imported only when listed here, and heavy imports (dagster,
torch) stay inside the command functions so `refinery --help` is instant.

Every command exits non-zero on error with a message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from refinery.config import ConfigError

# Modules that each define `register(subparsers)`; a registered parser sets `func(args) -> int`.
COMMAND_MODULES: list[str] = [
    "orchestration.demo",
    "refinery.scan",
    "refinery.lineage",
    "refinery.funnel_report",
    "refinery.validate",
    "refinery.init",
    "training.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refinery", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as err:
        print(f"refinery {args.command}: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"refinery {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
