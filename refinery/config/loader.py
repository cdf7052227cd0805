"""Reading the YAML and turning schema errors into `field: message` lines: `load_config` is the
only entry point; it raises `ConfigError` whose message names the field, what is wrong, and how to
fix it. It checks the schema and the cross-references only and runs no user code (custom filters
are imported and built by refinery/preflight.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from refinery.config.run import RefineryConfig


class ConfigError(ValueError):
    """A config that cannot run. The message names the field and the fix; `problems` lists each
    problem on its own (`field: what is wrong and how to fix it`) when there are several."""

    def __init__(self, message: str, problems: list[str] | None = None, locations: list[tuple] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else [message]
        self.locations = list(locations or [])  # pydantic's `loc` of each schema error, when the schema failed


# Pydantic error types of a value that should have been text; a YAML boolean there was meant as a word.
_TEXT_ERRORS = {"string_type", "literal_error", "string_pattern_mismatch", "enum"}


def field_path(loc: tuple | list) -> str:
    """("sources", 2, "path") -> "sources[2].path"."""
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[")


def _validation_problems(err: ValidationError) -> list[str]:
    """One `field: message` line per problem."""
    lines = []
    for e in err.errors():
        loc = field_path(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against configs/demo.yaml"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in _TEXT_ERRORS and isinstance(e.get("input"), bool):
            word = "'no'" if e["input"] is False else "'yes'"
            msg = (f"{e['input']!r} is not text: YAML reads an unquoted no, off, yes or on as a boolean; quote the word "
                   f"you meant, e.g. {word} ({msg})")
        if not loc:  # a whole-config check: its lines name their fields already
            lines.extend(msg.splitlines())
        else:
            lines.append(f"{loc}: {msg}")
    return lines


def parse_config(data: dict, base_dir: str = ".", origin: str = "<config>") -> RefineryConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return RefineryConfig.model_validate({**data, "base_dir": base_dir})
    except ValidationError as err:
        problems = _validation_problems(err)
        raise ConfigError(f"{origin}: invalid config\n" + "\n".join(f"  {p}" for p in problems), problems,
                          [e["loc"] for e in err.errors()]) from None


def read_yaml(path: str | os.PathLike) -> Any:
    """The config file's YAML, unvalidated; ConfigError when it is missing or not YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pass --config PATH (the demo uses configs/demo.yaml)")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from None


def load_config(path: str | os.PathLike) -> RefineryConfig:
    p = Path(path)
    return parse_config(read_yaml(p), base_dir=str(p.resolve().parent), origin=str(p))
