"""The token shard index's header, checked, and one entry of a shard looked up, with the standard
library alone.

refinery/shard_format.py defines the format (the writer, and the memory-mapped reader the trainer
and the stages use) on top of this module. A `refinery lineage` query reads one entry's bounds and a
few dozen tokens: with `struct` and file reads it answers without importing numpy (0.1-0.3 s of a
command line's start).
"""

from __future__ import annotations

import array
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"RFSH"
VERSION = 1
HEADER = struct.Struct("<4sHHQ")  # 16 bytes: magic, version, dtype code, entry count
# dtype code -> (numpy dtype name, `array` typecode of the same width)
TOKEN_TYPES = {1: ("uint16", "H"), 2: ("uint32", "I")}
OFFSET = struct.Struct("<q")  # int64 token offsets, count + 1 of them
OVERLAP = struct.Struct("<I")  # u32 overlap-prefix length per entry


class ShardFormatError(ValueError):
    """A shard that cannot be read as written. The message says which file and what is wrong."""


@dataclass(frozen=True)
class IndexHeader:
    code: int  # a key of TOKEN_TYPES
    count: int  # entries

    @property
    def offsets_at(self) -> int:
        return HEADER.size

    @property
    def overlaps_at(self) -> int:
        return HEADER.size + OFFSET.size * (self.count + 1)

    @property
    def size(self) -> int:
        """The index file's exact size in bytes."""
        return self.overlaps_at + OVERLAP.size * self.count


def parse_header(path: str | os.PathLike, head: bytes, size: int) -> IndexHeader:
    """The header of index file `path` from its first bytes `head` and its size; a file that is not
    a complete index of this version is refused by name."""
    if size < HEADER.size:
        raise ShardFormatError(f"{path}: truncated: {size} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, code, count = HEADER.unpack_from(head)
    if magic != MAGIC:
        raise ShardFormatError(f"{path}: bad magic {magic!r}, expected {MAGIC!r}; this is not a Refinery shard index")
    if version != VERSION:
        raise ShardFormatError(f"{path}: format version {version}, this reader supports {VERSION}")
    if code not in TOKEN_TYPES:
        raise ShardFormatError(f"{path}: unknown dtype code {code}")
    header = IndexHeader(code, count)
    if size != header.size:
        raise ShardFormatError(f"{path}: truncated or padded: {size} bytes, expected {header.size} for {count} entries")
    return header


@dataclass(frozen=True)
class EntrySpan:
    """The entry of a shard holding one token: its number, token bounds [start, end) and overlap prefix."""

    entry: int
    start: int
    end: int
    overlap: int
    code: int  # the shard's token dtype code


def locate_token(idx_path: str | os.PathLike, offset: int) -> tuple[int, EntrySpan | None]:
    """(the shard's tokens, the entry holding token `offset`, None when the offset is outside the
    shard) of the shard whose index is `idx_path`, by binary search over the offsets read from the
    file: about log2(entries) 8-byte reads, whatever the shard's size."""
    path = Path(idx_path)
    if not path.is_file():
        raise ShardFormatError(f"{path}: index file not found")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = parse_header(path, f.read(HEADER.size), size)

        def offset_of(i: int) -> int:
            f.seek(header.offsets_at + OFFSET.size * i)
            return OFFSET.unpack(f.read(OFFSET.size))[0]

        total = offset_of(header.count)
        if not 0 <= offset < total:
            return total, None
        lo, hi = 0, header.count  # the last entry whose start is <= offset
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if offset_of(mid) <= offset else (lo, mid)
        start, end = offset_of(lo), offset_of(lo + 1)
        f.seek(header.overlaps_at + OVERLAP.size * lo)
        overlap = OVERLAP.unpack(f.read(OVERLAP.size))[0]
    if not start <= offset < end or overlap > end - start:
        raise ShardFormatError(f"{path}: entry {lo} ({start}..{end}, overlap {overlap}) breaks the format's offsets")
    return total, EntrySpan(lo, start, end, overlap, header.code)


def read_tokens(bin_path: str | os.PathLike, code: int, lo: int, hi: int) -> list[int]:
    """Tokens [lo, hi) of a shard's .bin (native byte order, as the writer's numpy arrays wrote them)."""
    typecode = TOKEN_TYPES[code][1]
    tokens = array.array(typecode)
    with open(bin_path, "rb") as f:
        f.seek(lo * tokens.itemsize)
        data = f.read((hi - lo) * tokens.itemsize)
    if len(data) != (hi - lo) * tokens.itemsize:
        raise ShardFormatError(f"{bin_path}: shorter than its index says (tokens {lo}..{hi - 1} asked)")
    tokens.frombytes(data)
    return tokens.tolist()
