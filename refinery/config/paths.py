"""Every place a config names a file, in one list, and a config moved to another folder.

A relative path in a config starts at the config file's folder (`RefineryConfig.resolve`). A bench,
a test or a packed GPU run that writes a config somewhere else rewrites those paths with
`rebase_paths`; the preflight checks the single-file fields of `FILE_FIELDS`. A new path field goes
here, so that neither can miss it (tests/test_config_paths.py walks the schema for fields that look
like paths).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

# Fields holding one file each, by their keys from the config's root.
FILE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("tokenizer", "path"),
    ("stages", "language", "model_path"),
    ("stages", "difficulty", "model_path"),
    ("stages", "quality", "labelled_set"),
)

# The labelled pages a config without stages.quality.labelled_set trains the quality classifier on
# (stages.quality.shipped_labelled_pages), relative to the checkout, each with the label every page of
# it takes (None: the page's own `label`). Built once from Debian packages (their README.md files).
CHECKOUT = Path(__file__).resolve().parents[2]
SHIPPED_LABELLED_SETS: tuple[tuple[str, str | None], ...] = (
    ("data/labelled/labelled.jsonl.gz", None),
    ("data/multilingual/clean.jsonl.gz", "high"),
    ("data/multilingual/spam.jsonl.gz", "spam"),
)


def dotted(keys: tuple[str, ...]) -> str:
    return ".".join(keys)


def rebase_paths(data: dict, base: str | os.PathLike, to: str | os.PathLike | None = None,
                 sources: Callable[[Path], str] | None = None) -> dict:
    """A copy of the raw config `data` (as read from YAML) whose relative paths, written against
    `base`, are absolute, or relative to `to` when given. URLs and absolute paths stay as they are.
    `sources` rewrites the sources' globs instead (an absolute path in, the new path out), for a
    caller that moves the inputs too."""
    out = copy.deepcopy(data)
    base = Path(base).resolve()

    def moved(path: Any) -> Any:
        if not isinstance(path, str) or "://" in path or os.path.isabs(path):
            return path
        absolute = os.path.normpath(base / path)
        return os.path.relpath(absolute, to) if to is not None else str(absolute)

    for src in _items(out, "sources"):
        if isinstance(src, dict) and isinstance(src.get("path"), str):
            src["path"] = sources(Path(os.path.normpath(base / src["path"]))) if sources else moved(src["path"])
    for ev in _items(out, "contamination", "eval_sets"):
        if isinstance(ev, dict):
            ev["path"] = moved(ev.get("path"))
    ablations = out.get("ablations")
    if isinstance(ablations, dict) and isinstance(ablations.get("eval_sets"), list):
        ablations["eval_sets"] = [moved(p) for p in ablations["eval_sets"]]
    for keys in FILE_FIELDS:
        section = _section(out, keys[:-1])
        if section is not None and section.get(keys[-1]) is not None:
            section[keys[-1]] = moved(section[keys[-1]])
    return out


def _section(data: Any, keys: tuple[str, ...]) -> dict | None:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else None


def _items(data: Any, *keys: str) -> list:
    parent = _section(data, keys[:-1])
    value = parent.get(keys[-1]) if parent is not None else None
    return value if isinstance(value, list) else []
