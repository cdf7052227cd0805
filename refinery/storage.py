"""The data root: one place every asset reads and writes, locally or on S3.

Every write goes to a temporary name and is renamed (or uploaded) into place only when complete, so
a crash never leaves a partial file under a final name. Keys are POSIX-style paths relative to the
root (`documents/raw_documents/web-cc0.parquet`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import polars as pl

PARQUET_COMPRESSION = "zstd"


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


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it into place only if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


class DataRoot(ABC):
    """Where a run's outputs live. Subclasses: `LocalDataRoot`, and `S3DataRoot` in storage_s3."""

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

    def display(self, key: str) -> str:
        """How to show `key` to a person (a path or URL)."""
        return f"{self.url.rstrip('/')}/{key}"

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
        return pl.read_parquet(self.local_path(key), columns=columns)

    def sha256(self, key: str) -> str:
        return sha256_file(self.local_path(key))


class LocalDataRoot(DataRoot):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root not in p.parents and p != self.root:
            raise ValueError(f"key {key!r} escapes the data root {self.root}")
        return p

    @contextmanager
    def writer(self, key: str) -> Iterator[Path]:
        with atomic_path(self._path(key)) as tmp:
            yield tmp

    def local_path(self, key: str) -> Path:
        p = self._path(key)
        if not p.exists():
            raise FileNotFoundError(f"{p}: not found in the data root; materialize the asset that writes it first")
        return p

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            str(p.relative_to(self.root)).replace(os.sep, "/")
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, key: str) -> None:
        p = self._path(key)
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

    def display(self, key: str) -> str:
        return str(self._path(key))


def open_data_root(url: str, **s3_options: Any) -> DataRoot:
    """`s3://bucket/prefix` opens an S3 root; anything else is a local folder."""
    if url.startswith("s3://"):
        from refinery.storage_s3 import S3DataRoot

        return S3DataRoot(url, **s3_options)
    return LocalDataRoot(url)
