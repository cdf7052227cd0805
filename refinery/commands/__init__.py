"""The library's `refinery` subcommands, a module each (scan, funnel, why, validate, init, compare,
ablations; their report helpers are refinery/reports/), and here what every subcommand shares: the
help layout, the preflight before the command, and the exit codes for a config or input problem.

A subcommand's module exposes `register(subparsers)`, whose parser sets `func(args) -> int` and
`needs` (a `refinery.preflight.Needs`, or a function of the parsed arguments giving one). `run`
checks `--config` against those needs before the command, so every config mistake is reported at
once, before any work, and hands the command the config it loaded (`args.loaded_config`, so the
YAML is parsed once). The full command line is assembled in orchestration/cli.py; `python -m
training` assembles only `train` from the same pieces.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from refinery.config import ConfigError, RefineryConfig


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

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        # argparse measures a subcommand's name at its parent's indent but prints it one level
        # deeper, so a name of nine characters (`ablations`) would push its help to the next line.
        if action.help is not argparse.SUPPRESS:
            lengths = [len(self._format_action_invocation(sub)) + self._current_indent
                       for sub in self._iter_indented_subactions(action)]
            self._action_max_length = max([self._action_max_length, *lengths])


class HelpParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser(modules, prog: str = "refinery", description: str | None = None,
                 epilog: str | None = None) -> argparse.ArgumentParser:
    """A parser with one subcommand per module (each module's `register(subparsers)`)."""
    parser = HelpParser(prog=prog, description=description, epilog=epilog)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=HelpParser)
    for module in modules:
        module.register(sub)
    return parser


def config_path(args: argparse.Namespace) -> str | None:
    """`--config`, or the positional config some commands also take."""
    return getattr(args, "config", None) or getattr(args, "config_file", None)


def run_preflight(args: argparse.Namespace) -> RefineryConfig | None:
    """The command's config, loaded and checked; raise PreflightError listing every problem of it.
    None when the command declares no needs or was given no config."""
    from refinery import preflight

    needs = getattr(args, "needs", None)
    path = config_path(args)
    if needs is None or path is None:
        return None
    return preflight.require(path, needs(args) if callable(needs) else needs)


def _causes(err: BaseException) -> list[BaseException]:
    """`err` and what it wraps: its cause and context chain, and a Dagster step failure's user exception."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "user_exception", None)]
    return out


def input_problem(err: BaseException) -> str | None:
    """The message of an input problem behind `err`, however deep a run wrapped it (None: not one):
    a config problem, a table without its source's column, a damaged table under the data root, an
    S3 data root without credentials."""
    from refinery.stages.readers.tables import InputColumnError
    from refinery.storage.damaged import DamagedTableError

    chain = _causes(err)
    for e in chain:
        if isinstance(e, (ConfigError, InputColumnError, DamagedTableError)):
            return str(e)
    for e in chain:
        if type(e).__module__.startswith("botocore") and type(e).__name__ in ("NoCredentialsError",
                                                                                "PartialCredentialsError"):
            storage = next((str(c) for c in chain if type(c).__name__ == "S3StorageError"), "")
            where = f" ({storage.split(' failed:')[0]})" if storage else ""
            return (f"no S3 credentials: {e}{where}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                    f"AWS_PROFILE) in the environment for the s3:// data root, then re-run")
    return None


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse `argv`, run the preflight, then the command; a config or input problem exits 2."""
    args = parser.parse_args(argv)
    try:
        # A command may read the config the preflight loaded (`args.loaded_config`) instead of
        # parsing the YAML again.
        args.loaded_config = run_preflight(args)
        return int(args.func(args) or 0)
    except ConfigError as err:
        print(f"refinery {args.command}: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"refinery {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        problem = input_problem(err)
        if problem is None:
            raise
        print(f"refinery {args.command}: {problem}", file=sys.stderr)
        return 2
