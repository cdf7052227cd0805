"""The `refinery` command. Each subcommand lives in its own module, which exposes
`register(subparsers)`; the module is imported only when listed here, and heavy imports (dagster,
torch) stay inside the command functions so `refinery --help` is instant.

A subcommand's parser sets `func(args) -> int` and `needs` (a `refinery.preflight.Needs`, or a
function of the parsed arguments giving one): `main` runs the preflight on `--config` with those
needs before the command, so every config mistake is reported at once, before any work. Every
command exits non-zero on error with a message that says what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap

from refinery.config import ConfigError

# Modules that each define `register(subparsers)`.
COMMAND_MODULES: list[str] = [
    "orchestration.demo",
    "refinery.scan",
    "refinery.lineage",
    "refinery.funnel_report",
    "refinery.validate",
    "refinery.init",
    "training.cli",
]

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
  refinery validate --config my.yaml                 # the curriculum contract, before training

`refinery COMMAND --help` describes each command. Exit status: 0 success, 1 a failed check,
2 a config or input problem (nothing was run), 3 training halted."""


class HelpFormatter(argparse.HelpFormatter):
    """Prose paragraphs wrap to the terminal; a paragraph with indented lines (examples) stays as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith(" ") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(out)


class HelpParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="refinery", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HelpParser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def config_path(args: argparse.Namespace) -> str | None:
    """`--config`, or the positional config some commands also take."""
    return getattr(args, "config", None) or getattr(args, "config_file", None)


def run_preflight(args: argparse.Namespace) -> None:
    """Raise PreflightError listing every problem of the command's config (none: return)."""
    from refinery import preflight

    needs = getattr(args, "needs", None)
    path = config_path(args)
    if needs is None or path is None:
        return
    preflight.require(path, needs(args) if callable(needs) else needs)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run_preflight(args)
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
