"""The data root: one place every asset reads and writes, locally (local.py) or on S3 (s3.py).

`open_data_root(url)` picks the implementation; base.py holds the contract and the atomic-write and
hashing helpers, which this package re-exports as its public API.
"""

from __future__ import annotations

from typing import Any

from refinery.storage.base import (
    PARQUET_COMPRESSION,
    DataRoot,
    atomic_path,
    create_temporary,
    dumps_json,
    sha256_file,
    write_parquet_file,
)
from refinery.storage.local import LocalDataRoot

__all__ = [
    "PARQUET_COMPRESSION", "DataRoot", "LocalDataRoot", "atomic_path", "create_temporary", "dumps_json", "open_data_root",
    "sha256_file", "write_parquet_file",
]


def open_data_root(url: str, **s3_options: Any) -> DataRoot:
    """`s3://bucket/prefix` opens an S3 root; anything else is a local folder."""
    if url.startswith("s3://"):
        from refinery.storage.s3 import S3DataRoot

        return S3DataRoot(url, **s3_options)
    return LocalDataRoot(url)
