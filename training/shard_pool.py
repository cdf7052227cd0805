"""The trainer's view of a bucket's final shards, with memory and handles that do not grow with the
corpus.

- `ShardPool`: shards are opened when first read, through a bounded least-recently-used set of
  open readers (two memory maps and two file descriptors each: `.idx` and `.bin`), sized from the
  process's file limit. On a remote data root an open shard is pinned in the local `ShardCache` and
  released when it leaves the pool, so the local copy is bounded by the pool, not by the manifests;
  `prefetch` fetches the shards the read position reaches next.
- Integrity, lazily: a shard's files are checked against the manifest's sha256 the first time this
  process opens it, unless this node verified the same file before (a record keyed by the path,
  size and modification time, in `verified_dir()`); a mismatch is refused naming the file. Sizes and
  headers are checked at every open (`ShardReader`). Nothing is read at start.
- `BucketIndex`: per-entry lengths, offsets and overlap prefixes come from the shards' own `.idx`
  files through their memory maps (the page cache shares them between a node's ranks and workers);
  the shard of a global entry id is found by search over the manifest's per-shard entry counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from refinery.curriculum import ShardRef
from refinery.shard_cache import ShardCache
from refinery.shard_format import ShardFormatError, ShardReader, shard_files
from refinery.storage import atomic_path, sha256_file

# Readers open at once, at most; fewer when the file limit is low.
MAX_OPEN_SHARDS = 512
# Descriptors left to everything else in the process (sockets, logs, checkpoints, torch).
RESERVED_FDS = 64


def pool_capacity(limit: int | None = None) -> int:
    """How many shards one process keeps open: MAX_OPEN_SHARDS, or what the soft RLIMIT_NOFILE
    leaves after the descriptors already open and RESERVED_FDS, at four descriptors a shard (two
    maps, and a gather may still hold as many readers the pool has just let go); at least 2."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return MAX_OPEN_SHARDS
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 16
    return max(2, min(MAX_OPEN_SHARDS, (limit - in_use - RESERVED_FDS) // 4))


def verified_dir() -> Path:
    """Where this node records the shard files it has verified (REFINERY_VERIFIED_DIR overrides)."""
    return Path(os.environ.get("REFINERY_VERIFIED_DIR") or Path(tempfile.gettempdir()) / f"refinery-verified-{os.getuid()}")


class VerifiedRecord:
    """The node's record of verified files: one small file per path, holding the size, modification
    time and sha256 it was verified at. A file rewritten since (any size or mtime change) is
    hashed again; the record is a cache of work done, never a reason to accept a mismatch."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or verified_dir()

    def _entry(self, path: Path) -> Path:
        return self.directory / (hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32] + ".json")

    def check(self, path: Path, expected: str, fix: str = "the shard changed after validation, rebuild the manifest") -> None:
        """Raise ShardFormatError (saying `fix`) unless `path`'s content hashes to `expected`."""
        st = path.stat()
        stamp = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": expected}
        entry = self._entry(path)
        try:
            if json.loads(entry.read_text()) == stamp:
                return
        except (OSError, ValueError):
            pass
        actual = sha256_file(path)
        if actual != expected:
            raise ShardFormatError(
                f"{path}: content hash {actual[:12]}... does not match the manifest's {expected[:12]}...; {fix}"
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic_path(entry) as tmp:
                tmp.write_text(json.dumps(stamp))
        except OSError:  # an unwritable record costs a re-hash next time, nothing else
            pass


class ShardPool:
    """Open shard readers, at most `capacity`, least recently used evicted (thread-safe)."""

    def __init__(self, cache: ShardCache, capacity: int | None = None, record: VerifiedRecord | None = None):
        self.cache = cache
        self.capacity = capacity or pool_capacity()
        self.record = record or VerifiedRecord()
        self._open: OrderedDict[str, ShardReader] = OrderedDict()
        self._verified: set[str] = set()
        self._locks: tuple[int, threading.Lock] = (os.getpid(), threading.Lock())
        self.opens = 0  # readers opened so far (a reader evicted and read again counts twice)

    @property
    def _lock(self) -> threading.Lock:
        """A lock of this process: a forked worker must not inherit one held by a parent's thread."""
        if self._locks[0] != os.getpid():
            self._locks = (os.getpid(), threading.Lock())
        return self._locks[1]

    def reader(self, ref: ShardRef, bucket: str) -> ShardReader:
        with self._lock:
            got = self._open.get(ref.prefix)
            if got is not None:
                self._open.move_to_end(ref.prefix)
                return got
        reader = self._open_reader(ref, bucket)
        with self._lock:
            self._open[ref.prefix] = reader
            self.opens += 1
            while len(self._open) > self.capacity:
                # Views of an evicted reader keep its maps alive until they are dropped; the pool
                # only stops holding it.
                old, _ = self._open.popitem(last=False)
                self.cache.release(old)
        return reader

    def _open_reader(self, ref: ShardRef, bucket: str) -> ShardReader:
        prefix = self.cache.local_prefix(ref.prefix)
        try:
            if ref.prefix not in self._verified:
                files = shard_files(prefix)
                for suffix, want in sorted(ref.sha256.items()):
                    self.record.check(files[suffix], want)
                self._verified.add(ref.prefix)
            reader = ShardReader(prefix)
            if len(reader) != ref.entries or reader.num_tokens != ref.tokens:
                raise ShardFormatError(f"{prefix}.idx: {len(reader)} entries / {reader.num_tokens} tokens, the manifest "
                                       f"lists {ref.entries} / {ref.tokens}; rebuild phase_manifests")
            longest = int(np.diff(reader.offsets).max(initial=0))
            if longest >= 1 << 31:
                raise ValueError(f"bucket {bucket!r}: an entry of {longest} tokens; entries must be shorter than 2^31 "
                                 "tokens (tokenize splits documents into windows)")
            return reader
        except BaseException:
            self.cache.release(ref.prefix)
            raise

    def prefetch(self, refs: list[ShardRef]) -> None:
        """Fetch these shards in the background (a remote data root; nothing on a local one)."""
        self.cache.prefetch([r.prefix for r in refs if r.prefix not in self._open])

    def __len__(self) -> int:
        return len(self._open)


class BucketIndex:
    """Lookups over one bucket's global entry ids (shard 0's entries first), read from the shards."""

    def __init__(self, bucket: str, shards: list[ShardRef], pool: ShardPool):
        if not shards:
            raise ValueError(f"bucket {bucket!r}: the manifest lists no shards; rebuild phase_manifests")
        self.bucket, self.shards, self.pool = bucket, shards, pool
        self.first = np.zeros(len(shards) + 1, dtype=np.int64)  # global id of each shard's first entry
        np.cumsum([s.entries for s in shards], out=self.first[1:])

    @property
    def total_entries(self) -> int:
        return int(self.first[-1])

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def reader(self, shard: int) -> ShardReader:
        return self.pool.reader(self.shards[shard], self.bucket)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard position, entry within the shard) of each global entry id."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.total_entries):
            raise IndexError(f"bucket {self.bucket!r}: entry ids outside 0..{self.total_entries - 1}")
        shard = np.searchsorted(self.first, ids, side="right") - 1
        return shard, ids - self.first[shard]

    def table(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(shard position, first token within the shard, length, overlap prefix) of each id, int64,
        read from the shards' `.idx` maps one shard at a time."""
        shard, local = self.locate(ids)
        offset = np.empty(len(ids), dtype=np.int64)
        end = np.empty(len(ids), dtype=np.int64)
        overlap = np.empty(len(ids), dtype=np.int64)
        # Grouped by shard with one sort: the ids of a chunk come from a few shards of one block.
        order = np.argsort(shard, kind="stable")
        cuts = np.flatnonzero(np.diff(shard[order])) + 1
        for group in np.split(order, cuts) if len(order) else ():
            reader, k = self.reader(int(shard[group[0]])), local[group]
            offset[group] = reader.offsets[k]
            end[group] = reader.offsets[k + 1]
            overlap[group] = reader.overlaps[k]
        return shard, offset, end - offset, overlap

    def lengths(self, ids: np.ndarray) -> np.ndarray:
        return self.table(ids)[2]

    def prefetch_entries(self, lo: int, hi: int) -> None:
        """Fetch the shards holding global entries [lo, hi) in the background."""
        a, b = np.searchsorted(self.first, [lo, max(lo, hi - 1)], side="right") - 1
        self.pool.prefetch(self.shards[int(a):int(b) + 1])

    def shard_token(self, entry: int, token: int) -> tuple[str, int]:
        """(shard prefix key, token offset within the shard) of token `token` of global entry `entry`."""
        shard, offset, _, _ = self.table(np.array([entry]))
        return self.shards[int(shard[0])].prefix, int(offset[0]) + token
