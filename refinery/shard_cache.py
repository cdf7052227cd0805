"""The trainer's local tier for token shards on a remote data root (beside the shard format it reads)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from refinery.shard_format import SHARD_SUFFIXES
from refinery.storage import DataRoot
from refinery.storage.s3 import DEFAULT_CACHE_BYTES, S3DataRoot


class ShardCache:
    """The trainer's local tier for token shards on a remote data root.

    `local_prefix(shard_key)` returns a local path prefix whose `.bin/.idx/.entries.parquet` are
    complete (fetching them if needed) and pins the shard until `release(shard_key)`.
    `prefetch([shard_keys])` fetches the next shards in a background thread. Shards not pinned are
    evicted least-recently-used once the cache exceeds `max_bytes`. On a local data root the shard
    files are read in place and nothing is copied or fetched. A forked loader worker gets its own
    fetch threads (a fork keeps none of its parent's).
    """

    def __init__(self, root: DataRoot, max_bytes: int = DEFAULT_CACHE_BYTES, threads: int = 1):
        self.root = root
        self.max_bytes = max_bytes
        if isinstance(root, S3DataRoot):
            root.cache.max_bytes = max_bytes
        self.remote = isinstance(root, S3DataRoot)
        self._threads = threads
        self._pid = -1
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()

    def _fetcher(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():  # first use, or first use in a forked worker
            self._pid, self._lock, self._pending = os.getpid(), threading.Lock(), {}
            self._executor = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="shard-prefetch")
        return self._executor

    def _fetch(self, shard_key: str) -> Path:
        paths = [self.root.local_path(shard_key + suffix) for suffix in SHARD_SUFFIXES]
        return Path(str(paths[0])[: -len(SHARD_SUFFIXES[0])])

    def _future(self, shard_key: str) -> Future:
        executor = self._fetcher()
        with self._lock:
            fut = self._pending.get(shard_key)
            if fut is None or (fut.done() and fut.exception() is not None):
                fut = executor.submit(self._fetch, shard_key)
                self._pending[shard_key] = fut
            return fut

    def prefetch(self, shard_keys: list[str]) -> None:
        if not self.remote:
            return
        for key in shard_keys:
            self._future(key)

    def local_prefix(self, shard_key: str) -> Path:
        if not self.remote:
            return self._fetch(shard_key)
        self._pin(shard_key)
        try:
            prefix = self._future(shard_key).result()
            if not all(Path(str(prefix) + suffix).is_file() for suffix in SHARD_SUFFIXES):
                prefix = self._fetch(shard_key)  # evicted between prefetch and use; pinned now, so it stays
            return prefix
        except BaseException:
            self.release(shard_key)
            raise

    def _pin(self, shard_key: str) -> None:
        if self.remote:
            self.root.cache.pin([shard_key + s for s in SHARD_SUFFIXES])

    def release(self, shard_key: str) -> None:
        """The reader is done with the shard; it may be evicted (and is fetched again if asked for)."""
        if not self.remote:
            return
        self.root.cache.unpin([shard_key + s for s in SHARD_SUFFIXES])
        with self._lock:
            self._pending.pop(shard_key, None)

    def close(self) -> None:
        if self._executor is not None and self._pid == os.getpid():
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._executor, self._pid = None, -1

    def __enter__(self) -> "ShardCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
