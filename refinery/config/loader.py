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
        elif e["type"] == "finite_number":
            msg = f"{e.get('input')!r} is not a finite number; give a number (YAML's .nan and .inf are refused)"
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


# Limits on the YAML before any Python object is built from it. The schema's deepest field is 7
# levels down (stages.heuristic.languages.<lang>.gopher_repetition.top_n_grams[i][j]); a nest of
# thousands exhausts the composer's recursion. Aliases make a node stand for a whole subtree, so a
# small file can expand to a huge one (aliased lists inside lists grow with the square of the file:
# a 220 KB config took `validate` past 4 GB); a config's own reuse (`<<: *defaults`) adds a few
# hundred nodes.
MAX_YAML_DEPTH = 64
MAX_ALIAS_EXPANSION = 100_000


class YamlLimitError(yaml.YAMLError):
    """A YAML document over one of the limits above; the message says which and where."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts, while it composes the node graph (before any object is built), how
    deep the document nests and how many nodes its aliases add, and refuses recursive aliases."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in its expanded subtree, once composed
        self._alias_nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise YamlLimitError(f"the alias *{event.anchor} at line {event.start_mark.line + 1} refers to a "
                                     f"node that contains it (a recursive alias); write the value out instead")
            self._alias_nodes += self._sizes[id(node)]
            if self._alias_nodes > MAX_ALIAS_EXPANSION:
                raise YamlLimitError(f"aliases expand to more than {MAX_ALIAS_EXPANSION:,} nodes (the alias "
                                     f"*{event.anchor} at line {event.start_mark.line + 1} passed the limit); "
                                     f"write the repeated values out or reuse fewer of them")
            return node
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise YamlLimitError(f"nested more than {MAX_YAML_DEPTH} levels deep at line {mark.line + 1}; "
                                 f"a config's deepest field is 7 levels down")
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes.get(id(child), 1) for child in children)
        return node


def parse_yaml(text: str) -> Any:
    """YAML text as Python objects, refused (YamlLimitError) past the depth and alias limits."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike) -> Any:
    """The config file's YAML, unvalidated; ConfigError when it is missing, not YAML, or over the
    depth and alias limits."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found; pass --config PATH (the demo uses configs/demo.yaml)")
    try:
        return parse_yaml(p.read_text())
    except YamlLimitError as err:
        raise ConfigError(f"{p}: refused before reading it: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from None


def load_config(path: str | os.PathLike) -> RefineryConfig:
    p = Path(path)
    return parse_config(read_yaml(p), base_dir=str(p.resolve().parent), origin=str(p))
