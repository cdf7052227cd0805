"""Tables under the data root that their reader cannot read: named, in one line.

A Parquet or Arrow file cut short, with bytes changed, or not a table at all makes pyarrow or polars
raise an error that does not say which file it read. `reading_table(path)` turns such an error
(any from pyarrow or polars, or an OSError other than a missing file, which keeps its own meaning)
into `DamagedTableError` naming the file and what the reader found; `named_batches` does the same
for a reader's batches as they are drawn. `refinery` commands print it as one line and exit 2
(refinery/commands/__init__.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

# Modules whose exceptions are a reader's verdict on the bytes it read.
_TABLE_READERS = ("pyarrow", "polars")


class DamagedTableError(ValueError):
    """A table that cannot be read as one; the message names the file and says what to do."""


def _damage(path: str | os.PathLike, err: BaseException) -> DamagedTableError | None:
    if isinstance(err, (DamagedTableError, FileNotFoundError)):
        return None
    if not (isinstance(err, OSError) or type(err).__module__.split(".")[0] in _TABLE_READERS):
        return None
    lines = str(err).strip().splitlines()
    found = lines[0] if lines else type(err).__name__
    return DamagedTableError(f"{path}: not a readable table ({found}); it changed after it was written: "
                             f"materialize the asset that writes it again")


@contextmanager
def reading_table(path: str | os.PathLike) -> Iterator[None]:
    """Raise DamagedTableError naming `path` for a reader's error on its bytes inside the block."""
    try:
        yield
    except Exception as err:
        damaged = _damage(path, err)
        if damaged is None:
            raise
        raise damaged from None


def named_batches(batches: Iterator[Any], path: str | os.PathLike) -> Iterator[Any]:
    """`batches` (a lazy reader of the table at `path`), with its errors named as `reading_table`'s."""
    with reading_table(path):
        yield from batches
