"""The token shard format, defined once: the writer (tokenized/shuffled shards) and the trainer's
reader both use this module.

A shard is three files sharing a prefix:

- `<prefix>.bin`: every entry's tokens back to back, uint16 (vocab <= 65,536) or uint32.
- `<prefix>.idx`: a 16-byte header (magic `RFSH`, version u16, dtype code u16, entry count u64),
  then int64 token offsets (count + 1, the last one a sentinel equal to the token total), then a
  u32 overlap-prefix length per entry: how many leading tokens repeat the previous window of the
  same document and must be masked out of the loss (seed 003's layout).
- `<prefix>.entries.parquet`: one row per entry: doc_id, window (0-based), n_windows.

An entry is a whole document or one window of a long one; a document's last entry ends with EOD.
The `.idx` is published last, so a reader that finds it finds a complete shard.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from refinery.shard_header import HEADER, MAGIC, TOKEN_TYPES, VERSION, ShardFormatError, parse_header
from refinery.storage import atomic_path, create_temporary, sha256_file, write_parquet_file

if TYPE_CHECKING:
    import polars as pl

# The header and its checks live in refinery/shard_header.py (standard library only, for queries).
DTYPES = {code: np.dtype(name) for code, (name, _) in TOKEN_TYPES.items()}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
OVERLAP_DTYPE = np.dtype(np.uint32)
# The entry sidecar's columns and their polars types by name: `ENTRIES_SCHEMA` is built from them on
# first use (the module's `__getattr__`), so reading a shard's index and tokens (a lineage query)
# does not import polars.
ENTRIES_TYPES = {"doc_id": "String", "window": "Int32", "n_windows": "Int32"}
SHARD_SUFFIXES = (".bin", ".idx", ".entries.parquet")


@functools.cache
def entries_schema() -> dict[str, pl.DataType]:
    """The entry sidecar's polars schema; one dict, as a constant would be."""
    import polars as pl

    return {column: getattr(pl, dtype)() for column, dtype in ENTRIES_TYPES.items()}


def __getattr__(name: str) -> dict[str, pl.DataType]:
    """`ENTRIES_SCHEMA`, built on first use."""
    if name == "ENTRIES_SCHEMA":
        return entries_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def token_dtype(vocab_size: int) -> np.dtype:
    return DTYPES[1] if vocab_size <= np.iinfo(np.uint16).max + 1 else DTYPES[2]


def split_windows(n_tokens: int, window: int, overlap: int) -> list[tuple[int, int, int]]:
    """(start, end, overlap_prefix) of each window of a document of `n_tokens` tokens.

    A document that fits is one entry. A longer one is cut into windows of at most `window`
    tokens, each later window starting `overlap` tokens before the previous one ended, so the model
    keeps local context across the cut; those `overlap` tokens are masked from the loss.
    """
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    if overlap < 0 or 2 * overlap > window:
        raise ValueError(f"overlap {overlap} must be between 0 and half the window ({window // 2})")
    if n_tokens <= window:
        return [(0, n_tokens, 0)]
    out = [(0, window, 0)]
    step = window - overlap
    start = step
    while start + overlap < n_tokens:
        end = min(start + window, n_tokens)
        out.append((start, end, overlap))
        if end == n_tokens:
            break
        start += step
    return out


def shard_files(prefix: str | os.PathLike) -> dict[str, Path]:
    p = str(prefix)
    return {suffix: Path(p + suffix) for suffix in SHARD_SUFFIXES}


def shard_hashes(prefix: str | os.PathLike) -> dict[str, str]:
    """sha256 of each of the shard's files, keyed by suffix."""
    return {suffix: sha256_file(path) for suffix, path in shard_files(prefix).items()}


class ShardWriter:
    """Append entries, then `close()` to publish all three files atomically (.idx last).

    Tokens stream to a hidden temporary file beside the shard as they are added, so a writer holds
    only per-entry bookkeeping in memory, never the shard's tokens. Used as a context manager, an
    exception discards the temporary file and publishes nothing.
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"unsupported token dtype {self.dtype}; use uint16 or uint32")
        self._bin: BinaryIO | None = None
        self._bin_tmp: Path | None = None
        self._lengths: list[int] = []
        self._overlaps: list[int] = []
        self._doc_ids: list[str] = []
        self._windows: list[int] = []
        self._n_windows: list[int] = []
        self._num_tokens = 0
        self.closed = False

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()

    def _token_file(self) -> BinaryIO:
        if self._bin is None:
            final = shard_files(self.prefix)[".bin"]
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, self._bin_tmp = create_temporary(final.parent, f".{final.name}.")
            self._bin = os.fdopen(fd, "wb")
        return self._bin

    def add(self, tokens: np.ndarray, doc_id: str, overlap: int = 0, window: int = 0, n_windows: int = 1) -> None:
        if self.closed:
            raise RuntimeError("shard already closed")
        if overlap > len(tokens):
            raise ValueError(f"overlap {overlap} longer than the entry ({len(tokens)} tokens)")
        self._token_file().write(np.ascontiguousarray(tokens, dtype=self.dtype).data)
        self._lengths.append(len(tokens))
        self._overlaps.append(overlap)
        self._doc_ids.append(doc_id)
        self._windows.append(window)
        self._n_windows.append(n_windows)
        self._num_tokens += len(tokens)

    @property
    def num_entries(self) -> int:
        return len(self._lengths)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def discard(self) -> None:
        """Drop what was added; nothing is published."""
        self.closed = True
        if self._bin is not None:
            self._bin.close()
        if self._bin_tmp is not None:
            self._bin_tmp.unlink(missing_ok=True)

    def close(self) -> dict[str, str]:
        """Write the files and return their sha256 by suffix."""
        import polars as pl

        if self.closed:
            raise RuntimeError("shard already closed")
        self.closed = True
        files = shard_files(self.prefix)
        bin_file = self._token_file()
        bin_file.close()
        os.replace(self._bin_tmp, files[".bin"])
        offsets = np.zeros(len(self._lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(self._lengths, dtype=np.int64), out=offsets[1:])
        entries = pl.DataFrame(
            {"doc_id": self._doc_ids, "window": self._windows, "n_windows": self._n_windows}, schema=entries_schema()
        )
        with atomic_path(files[".entries.parquet"]) as tmp:
            write_parquet_file(entries, tmp)
        with atomic_path(files[".idx"]) as tmp:
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(MAGIC, VERSION, DTYPE_CODES[self.dtype], len(self._lengths)))
                f.write(offsets.tobytes())
                f.write(np.asarray(self._overlaps, dtype=OVERLAP_DTYPE).tobytes())
        return shard_hashes(self.prefix)


@dataclass
class ShardIndex:
    dtype: np.dtype
    offsets: np.ndarray  # int64, entries + 1
    overlaps: np.ndarray  # uint32, entries

    @property
    def num_entries(self) -> int:
        return len(self.overlaps)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


def read_index(path: str | os.PathLike) -> ShardIndex:
    path = Path(path)
    if not path.is_file():
        raise ShardFormatError(f"{path}: index file not found")
    size = path.stat().st_size
    if size < HEADER.size:
        parse_header(path, b"", size)  # refuses it as truncated
    # Memory-mapped, not read: the offsets and overlaps stay in the page cache, which every process
    # of a node reading the shard shares.
    raw = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)  # plain views index faster (the map is their base)
    header = parse_header(path, raw[:HEADER.size].tobytes(), len(raw))
    count, code = header.count, header.code
    offsets = raw[header.offsets_at:header.overlaps_at].view(np.int64)
    overlaps = raw[header.overlaps_at:].view(OVERLAP_DTYPE)
    if offsets[0] != 0:
        raise ShardFormatError(f"{path}: first offset is {offsets[0]}, expected 0")
    lengths = np.diff(offsets)
    if count and lengths.min() < 0:
        bad = int(np.argmax(lengths < 0))
        raise ShardFormatError(f"{path}: offsets not monotone at entry {bad} ({offsets[bad]} -> {offsets[bad + 1]})")
    if count and (overlaps > lengths).any():
        bad = int(np.argmax(overlaps > lengths))
        raise ShardFormatError(f"{path}: entry {bad} has an overlap prefix longer than the entry")
    return ShardIndex(dtype=DTYPES[code], offsets=offsets, overlaps=overlaps)


class ShardReader:
    """A memory-mapped shard. `tokens` is the whole .bin; slice it with `offsets`."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = Path(prefix)
        files = shard_files(prefix)
        self.index = read_index(files[".idx"])
        bin_path = files[".bin"]
        if not bin_path.is_file():
            raise ShardFormatError(f"{bin_path}: token file not found")
        size = bin_path.stat().st_size
        expected = self.index.num_tokens * self.index.dtype.itemsize
        if size != expected:
            raise ShardFormatError(
                f"{bin_path}: {size} bytes, but the index promises {self.index.num_tokens} tokens ({expected} bytes)"
            )
        # A plain ndarray over the map (the map stays alive as its base): slicing an np.memmap runs
        # Python code per slice, which the trainer's gather does tens of times a row.
        self.tokens = (
            np.memmap(bin_path, dtype=self.index.dtype, mode="r").view(np.ndarray)
            if size
            else np.zeros(0, dtype=self.index.dtype)
        )
        self._entries_path = files[".entries.parquet"]
        self._entries: pl.DataFrame | None = None

    @property
    def offsets(self) -> np.ndarray:
        return self.index.offsets

    @property
    def overlaps(self) -> np.ndarray:
        return self.index.overlaps

    def __len__(self) -> int:
        return self.index.num_entries

    @property
    def num_tokens(self) -> int:
        return self.index.num_tokens

    def entry(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"{self.prefix}: entry {i} out of range (0..{len(self) - 1})")
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def entry_of_token(self, offset: int) -> int:
        """The entry holding token `offset` (binary search over the offsets)."""
        if not 0 <= offset < self.num_tokens:
            raise IndexError(f"{self.prefix}: token offset {offset} outside the shard (0..{self.num_tokens - 1})")
        return int(np.searchsorted(self.offsets, offset, side="right") - 1)

    @property
    def entries(self) -> pl.DataFrame:
        if self._entries is None:
            if not self._entries_path.is_file():
                raise ShardFormatError(f"{self._entries_path}: entry sidecar not found")
            import polars as pl

            self._entries = pl.read_parquet(self._entries_path)
            if self._entries.height != len(self):
                raise ShardFormatError(
                    f"{self._entries_path}: {self._entries.height} rows, but the index has {len(self)} entries"
                )
        return self._entries

    def verify(self, expected: dict[str, str]) -> None:
        """Raise unless each file's sha256 matches `expected` (suffix -> hex), e.g. from a manifest."""
        actual = shard_hashes(self.prefix)
        for suffix, want in expected.items():
            if actual.get(suffix) != want:
                raise ShardFormatError(
                    f"{self.prefix}{suffix}: content hash {actual.get(suffix, 'missing')[:12]}... does not match the "
                    f"manifest's {want[:12]}...; the shard changed after validation, rebuild the manifest"
                )
