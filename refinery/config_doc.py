"""docs/config.md, generated from the config schema: `python -m refinery.config_doc > docs/config.md`.

Every section of `RefineryConfig` becomes a heading with its docstring and a table of its fields:
type, default and description. A field's description is its `Field(description=...)`, else the
comment on its line in the schema (refinery/config/), else the comment lines right above it, so
the schema stays the one place the reference is written. tests/test_config_doc.py fails when the
file is stale.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from refinery.config import RefineryConfig

HEADER = """# Config reference

Generated from the schema in `refinery/config/` by `python -m refinery.config_doc > docs/config.md`
(`tests/test_config_doc.py` fails when this file is stale). One YAML file declares a run;
`configs/demo.yaml` is the demo's and `refinery init DIR` writes one for a folder of your own files.
Unknown keys are refused, and relative paths resolve against the config file's folder. Numbers must be finite (no `.nan` or `.inf`), heuristic fractions lie in [0, 1] and counts are never negative, text holds no control characters, and the YAML may nest at most 64 levels deep and its aliases add at most 100,000 nodes.

A path such as `sources[]` is a list of the section below it; `stages.heuristic.languages.<key>`
is a mapping whose keys you choose (here, language codes).
"""

_FIELD_LINE = re.compile(r"^    (\w+): [^#]*?(?:#\s*(.*))?$")
_COMMENT_LINE = re.compile(r"^    #\s?(.*)$")


def source_comments(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, else the comment block right above it."""
    out: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        comment = _COMMENT_LINE.match(line)
        if comment:
            # A `# ---- group ----` line heads a group of fields; it describes none of them.
            above = [] if comment.group(1).startswith("----") else [*above, comment.group(1).strip()]
            continue
        field = _FIELD_LINE.match(line)
        if field and field.group(1) in cls.model_fields:
            text = field.group(2) or " ".join(above)
            if text:
                out[field.group(1)] = text.strip()
        above = []
    return out


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The sections an annotation holds (itself, or inside a list, dict or union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models(arg)]


def type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(annotation))}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def default_text(info: Any) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`".replace("|", "\\|")


def child_path(path: str, name: str, annotation: Any) -> str:
    """Where a field's section is documented: `a.b[]` for a list of them, `a.b.<key>` for a mapping."""
    origins = {get_origin(a) for a in (annotation, *get_args(annotation))}
    suffix = "[]" if list in origins else ".<key>" if dict in origins else ""
    return f"{path}.{name}{suffix}".lstrip(".")


def sections(model: type[BaseModel], path: str = "") -> list[tuple[str, type[BaseModel]]]:
    """(path, section) for `model` and every section under it, depth first in field order."""
    out = [(path, model)]
    for name, info in model.model_fields.items():
        if not info.exclude:
            for sub in _models(info.annotation):
                out += sections(sub, child_path(path, name, info.annotation))
    return out


def sentence(text: str) -> str:
    """A comment as a sentence: capitalised, ending in a full stop."""
    text = text.strip()
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith((".", ")")) else ".")


def _cell(text: str) -> str:
    """Table-safe text: pipes escaped, and angle brackets outside code spans (Markdown reads `<stage>` as HTML)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def render() -> str:
    parts = [HEADER]
    for path, model in sections(RefineryConfig):
        parts.append(f"## `{path}`" if path else "## Top level")
        doc = model.__dict__.get("__doc__")  # its own docstring, not one inherited from BaseModel
        if doc:
            parts.append("\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")))
        comments = source_comments(model)
        rows = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            if info.exclude:
                continue
            description = sentence(info.description or comments.get(name, ""))
            if _models(info.annotation):
                description = f"{description} See `{child_path(path, name, info.annotation)}` below.".strip()
            rows.append(f"| `{name}` | {type_name(info.annotation)} | {default_text(info)} | {_cell(description)} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
