"""The data root's contract, and the atomic-write and hashing helpers every writer shares.

Every write goes to a temporary name and is renamed (or uploaded) into place only when complete, so
a crash never leaves a partial file under a final name. A temporary is created with mode 0666 less
the umask (`create_temporary`), so a published file has the mode a plain open() would give it. Keys are POSIX-style paths relative to the
root (`documents/raw_documents/web-cc0.parquet`); refinery/layout.py names every key.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    import polars as pl


PARQUET_COMPRESSION = "zstd"
TEMPORARY_SUFFIX = ".tmp"  # a file being written is `.<final name>.<random>.tmp` beside its final name


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def dumps_json(obj: Any) -> bytes:
    """Deterministic JSON: sorted keys, fixed separators, trailing newline."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False, default=str) + "\n").encode()


def write_parquet_file(df: pl.DataFrame, path: str | os.PathLike) -> None:
    # Statistics and one row group per file keep the bytes a pure function of the rows.
    df.write_parquet(path, compression=PARQUET_COMPRESSION, statistics=True, row_group_size=max(1, df.height))


def create_temporary(folder: str | os.PathLike, prefix: str, suffix: str = TEMPORARY_SUFFIX) -> tuple[int, Path]:
    """A new file `<prefix><random><suffix>` in `folder`, created exclusively; returns its open
    descriptor (read-write) and path. Created with mode 0666 less the process's umask, as open()
    creates files, because the rename keeps the temporary's mode: tempfile.mkstemp's 0600 would
    publish every file readable by its owner only."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = Path(folder) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free temporary name {prefix}*{suffix} after 100 tries")


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it into place only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_path = create_temporary(final.parent, f".{final.name}.")
    os.close(fd)
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


class DataRoot(ABC):
    """Where a run's outputs live. Subclasses: `LocalDataRoot` (local.py) and `S3DataRoot` (s3.py)."""

    url: str

    @abstractmethod
    @contextmanager
    def writer(self, key: str) -> Iterator[Path]:
        """A local temp file to fill; published under `key` atomically when the block exits cleanly."""

    @abstractmethod
    def local_path(self, key: str) -> Path:
        """A local, readable path holding `key` (the file itself, or a cached copy of a remote one)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder), sorted, temporary files excluded."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def sizes(self, prefix: str) -> dict[str, int]:
        """Bytes of each key under `prefix` (a folder; "" for the whole root), as `list` names them."""
        return {key: self.local_path(key).stat().st_size for key in self.list(prefix)}

    def display(self, key: str) -> str:
        """How to show `key` to a person (a path or URL)."""
        return f"{self.url.rstrip('/')}/{key}"

    def remove_leftover_temporaries(self, keys: Iterable[str]) -> int:
        """Delete what killed writers of `keys` left under a temporary name (a process killed
        mid-write never reaches its cleanup); returns how many. Call it once the keys are written
        and nothing else writes them. A root whose temporaries live outside it has none."""
        return 0

    # ---- typed helpers, shared by every implementation ------------------------------------------

    def write_bytes(self, key: str, data: bytes) -> str:
        with self.writer(key) as tmp:
            tmp.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    def read_bytes(self, key: str) -> bytes:
        return self.local_path(key).read_bytes()

    def write_json(self, key: str, obj: Any) -> str:
        return self.write_bytes(key, dumps_json(obj))

    def read_json(self, key: str) -> Any:
        return json.loads(self.read_bytes(key))

    def write_parquet(self, key: str, df: pl.DataFrame) -> str:
        """Write `df` and return the sha256 of the bytes written."""
        buf = io.BytesIO()
        write_parquet_file(df, buf)
        return self.write_bytes(key, buf.getvalue())

    def read_parquet(self, key: str, columns: list[str] | None = None) -> pl.DataFrame:
        import polars as pl  # here, so that a reader of JSON and shards alone (a lineage query) does not import it

        from refinery.storage.damaged import reading_table

        path = self.local_path(key)
        with reading_table(path):
            return pl.read_parquet(path, columns=columns)

    def sha256(self, key: str) -> str:
        return sha256_file(self.local_path(key))
