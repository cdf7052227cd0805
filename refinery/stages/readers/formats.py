"""The input formats, each registered once: the file names `refinery init` takes for it, which
inputs a source's glob matches stand for (a DatasetDict's directory for its splits), how preflight
finds the columns a source reads before any run (a table's schema), how `refinery init` samples its
fields, and the reader ingest runs on each input (this package's modules, named here and imported
when first called). Input discovery (refinery/documents/inputs.py), ingest
(refinery/stages/ingest.py), preflight (refinery/preflight.py) and init
(refinery/commands/init_sources.py) look a source's format up here and nowhere else, so a format
added here is found, read, checked and detected by all of them.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from refinery.config import ExtractConfig, SourceConfig

# Every record of one input into the result: (path, source, extract, result, record_timeout_s). The
# result is a records.py `ReadResult`, not named here: input discovery (refinery/documents/inputs.py)
# imports this registry, and records.py imports the document tables, even for a type.
Reader = Callable[[str, "SourceConfig", "ExtractConfig", Any, "float | None"], None]
# (file, column names) of each table an input holds.
Schemas = Callable[[str], list[tuple[str, list[str]]]]
# An input's field names and its first records, at most the count given.
Sampler = Callable[[str, int], tuple[list[str], list[dict]]]
# The inputs a source's glob matches stand for, given the source's folder (None for a URL).
Expander = Callable[[list[str], "str | None"], list[str]]

# A DatasetDict saved with `save_to_disk`: its directory holds this index of its splits.
HF_DATASET_DICT = "dataset_dict.json"


class _Named:
    """A reader function named "module:function", imported on its first call: a preflight or a
    lineage query looks formats up without importing the readers (and polars, pyarrow, FastWARC
    behind them)."""

    def __init__(self, name: str):
        self.name = name
        self._function: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        if self._function is None:
            module, function = self.name.split(":")
            self._function = getattr(importlib.import_module(module), function)
        return self._function(*args)

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class InputFormat:
    name: str  # a source's `format:`
    read: Reader
    extensions: tuple[str, ...] = ()  # the (lower-case) endings of its files' names
    # A folder format: a directory holding one of these files is one input (a save_to_disk dataset).
    folder_marks: tuple[str, ...] = ()
    # Its tables' columns, which preflight holds to the source's text_field and id_field; None when
    # each record carries its own fields (nothing to check before reading).
    schemas: Schemas | None = None
    sample: Sampler | None = None  # for `refinery init` to find the text, URL and id fields; None: no fields
    # The inputs among a source's glob matches (a match may stand for several); None: each match is one.
    expand: Expander | None = None

    @property
    def is_folder(self) -> bool:
        return bool(self.folder_marks)

    def inputs(self, matched: list[str], folder: str | None) -> list[str]:
        """The inputs that a source's glob matches `matched` stand for, in order; `folder` is the
        source's (a match that leaves it is kept as it is, to be refused by name, and not opened)."""
        return matched if self.expand is None else self.expand(matched, folder)


FORMATS: tuple[InputFormat, ...] = (
    InputFormat("warc", _Named("refinery.stages.readers.warc:read_warc"), (".warc.gz", ".warc")),
    InputFormat("jsonl", _Named("refinery.stages.readers.jsonl:read_jsonl"),
                (".jsonl.gz", ".jsonl", ".ndjson.gz", ".ndjson"),
                sample=_Named("refinery.stages.readers.jsonl:sample_jsonl")),
    InputFormat("parquet", _Named("refinery.stages.readers.tables:read_parquet"), (".parquet",),
                schemas=_Named("refinery.stages.readers.tables:parquet_schemas"),
                sample=_Named("refinery.stages.readers.tables:sample_parquet")),
    InputFormat("hf_dataset", _Named("refinery.stages.readers.tables:read_dataset"),
                folder_marks=("state.json", HF_DATASET_DICT),
                schemas=_Named("refinery.stages.readers.tables:dataset_schemas"),
                sample=_Named("refinery.stages.readers.tables:sample_dataset"),
                expand=_Named("refinery.stages.readers.tables:dataset_splits")),
)


def known_format(name: object) -> InputFormat | None:
    """The format named `name`, or None when none is (read when called: a test may register one)."""
    return next((fmt for fmt in FORMATS if fmt.name == name), None)


def input_format(name: str) -> InputFormat:
    """The format a (validated) source's `format:` names."""
    fmt = known_format(name)
    if fmt is None:
        raise ValueError(f"no input format {name!r}; known formats: {', '.join(f.name for f in FORMATS)}")
    return fmt


def format_of_path(path: str) -> InputFormat | None:
    """The format of one path by its name (a file) or its marks (a directory), or None when it is
    none Refinery reads."""
    if os.path.isdir(path):
        return next((f for f in FORMATS if any(os.path.isfile(os.path.join(path, m)) for m in f.folder_marks)), None)
    name = os.path.basename(path).lower()
    return next((f for f in FORMATS if f.extensions and name.endswith(f.extensions)), None)
