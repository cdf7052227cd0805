"""The data root on S3 (`s3://bucket/prefix`).

Writes fill a local temp file and upload it to the final key only after the block exits cleanly:
an S3 PUT (and a completed multipart upload) is atomic per object, so a crash or an exception never
leaves a partial object under a final key. Reads go through a bounded local cache keyed by key and
ETag, so a re-published object is fetched again and an unchanged one is not.

Credentials never pass through this module: boto3 reads them from the environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, profiles, instance roles), or the caller hands in a
ready client (the Dagster layer builds one with dagster-aws's `S3Resource`). The endpoint comes from
REFINERY_S3_ENDPOINT or AWS_ENDPOINT_URL. Nothing here formats a credential into a message.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from refinery.storage.base import TEMPORARY_SUFFIX, DataRoot, create_temporary

ENDPOINT_ENV_VARS = ("REFINERY_S3_ENDPOINT", "AWS_ENDPOINT_URL")
CACHE_DIR_ENV = "REFINERY_CACHE_DIR"
# Big enough for the demo's whole corpus and a few training shards, small enough for a laptop disk.
DEFAULT_CACHE_BYTES = 8 << 30


class S3StorageError(OSError):
    """An S3 call failed; the message names the operation, the object and the endpoint, never a credential."""


def cache_base_dir() -> Path:
    """Where remote data roots keep local copies: $REFINERY_CACHE_DIR, else the temp folder."""
    return Path(os.environ.get(CACHE_DIR_ENV) or os.path.join(tempfile.gettempdir(), "refinery-s3-cache"))


def endpoint_from_env() -> str | None:
    for name in ENDPOINT_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def region_from_env() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def make_s3_client(endpoint_url: str | None = None, region_name: str | None = None, max_attempts: int = 3) -> Any:
    """A boto3 client with credentials from boto3's own chain, and short timeouts so an outage fails fast."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url or endpoint_from_env(),
        region_name=region_name or region_from_env(),
        config=config,
    )


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix")."""
    if not url.startswith("s3://"):
        raise ValueError(f"{url!r} is not an s3:// URL; write it as s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket; write it as s3://bucket/prefix")
    return bucket, prefix.strip("/")


def _is_missing(error: Exception) -> bool:
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


class LocalFileCache:
    """Files under `directory/<key>`, each tagged with the ETag it was fetched at, bounded by LRU eviction.

    Keys keep their relative layout so a shard's `.bin`, `.idx` and `.entries.parquet` stay siblings.
    The ETag of each file sits in `directory/.etags/<key>`, so a later process reuses what an earlier
    one fetched and counts it against the bound. Pinned keys are never evicted.
    """

    def __init__(self, directory: str | os.PathLike, max_bytes: int):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._etags: OrderedDict[str, str] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._pinned: set[str] = set()
        self._lock = threading.Lock()
        self._load_index()

    def _etag_file(self, key: str) -> Path:
        return self.directory / ".etags" / key

    def _load_index(self) -> None:
        tags = self.directory / ".etags"
        found = []
        for tag in tags.rglob("*") if tags.is_dir() else ():
            data = self.directory / tag.relative_to(tags)
            if tag.is_file() and data.is_file():
                found.append((data.stat().st_mtime_ns, tag.relative_to(tags).as_posix(), tag.read_text(), data.stat().st_size))
        for _, key, etag, size in sorted(found):
            self._etags[key] = etag
            self._sizes[key] = size

    def path(self, key: str) -> Path:
        return self.directory / key

    def get(self, key: str, etag: str) -> Path | None:
        with self._lock:
            if self._etags.get(key) != etag or not self.path(key).exists():
                return None
            self._etags.move_to_end(key)
            return self.path(key)

    def put(self, key: str, etag: str, filled: Path) -> Path:
        """Move the complete local file `filled` into the cache under `key`, then evict down to the bound."""
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._etag_file(key).parent.mkdir(parents=True, exist_ok=True)
        size = filled.stat().st_size
        with self._lock:
            self._etag_file(key).unlink(missing_ok=True)
            os.replace(filled, final)
            self._etag_file(key).write_text(etag)
            self._etags[key] = etag
            self._etags.move_to_end(key)
            self._sizes[key] = size
            self._evict(keep=key)
        return final

    def pin(self, keys: list[str]) -> None:
        with self._lock:
            self._pinned.update(keys)

    def unpin(self, keys: list[str]) -> None:
        with self._lock:
            self._pinned.difference_update(keys)
            self._evict(keep="")

    def cached_keys(self) -> list[str]:
        with self._lock:
            return list(self._etags)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def _evict(self, keep: str) -> None:
        total = sum(self._sizes.values())
        for key in list(self._etags):
            if total <= self.max_bytes:
                return
            if key == keep or key in self._pinned:
                continue
            self._etag_file(key).unlink(missing_ok=True)
            self.path(key).unlink(missing_ok=True)
            total -= self._sizes.pop(key)
            del self._etags[key]


class S3DataRoot(DataRoot):
    """A DataRoot on `s3://bucket/prefix`. `client` is a boto3 S3 client; by default one is built from the environment."""

    def __init__(
        self,
        url: str,
        client: Any = None,
        cache_dir: str | os.PathLike | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        endpoint_url: str | None = None,
    ):
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.client = client if client is not None else make_s3_client(endpoint_url=endpoint_url)
        self.endpoint = str(getattr(getattr(self.client, "meta", None), "endpoint_url", "") or "aws")
        if cache_dir is None:
            cache_dir = cache_base_dir() / hashlib.sha256(f"{self.endpoint}|{self.url}".encode()).hexdigest()[:16]
        self.cache = LocalFileCache(cache_dir, cache_bytes)
        self._staging = Path(cache_dir) / ".staging"

    def __repr__(self) -> str:
        return f"S3DataRoot({self.url!r}, endpoint={self.endpoint!r})"

    def _object_key(self, key: str) -> str:
        key = key.strip("/")
        if not key or any(part in {"", ".", ".."} for part in key.split("/")):
            raise ValueError(f"key {key!r} is not a plain relative path inside {self.url}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, operation: str, key: str, fn: Callable[[], Any]) -> Any:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as e:
            if _is_missing(e):
                raise FileNotFoundError(
                    f"{self.display(key)}: not found in the data root; materialize the asset that writes it first"
                ) from None
            raise S3StorageError(self._failure(operation, key, e)) from None
        except (BotoCoreError, Boto3Error) as e:
            raise S3StorageError(self._failure(operation, key, e)) from None

    def _failure(self, operation: str, key: str, error: Exception) -> str:
        return (
            f"S3 {operation} of {self.display(key)} at endpoint {self.endpoint} failed: "
            f"{type(error).__name__}: {error}. Check that the S3 server is reachable and that "
            f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the environment are valid; then re-run."
        )

    @contextmanager
    def _staged(self, suffix: str = TEMPORARY_SUFFIX) -> Iterator[Path]:
        """A new empty file in the staging folder, gone on the way out: moved into the cache by a
        complete transfer, removed after a failed one."""
        self._staging.mkdir(parents=True, exist_ok=True)
        fd, tmp_path = create_temporary(self._staging, ".", suffix)
        os.close(fd)
        try:
            yield tmp_path
        finally:
            tmp_path.unlink(missing_ok=True)

    @contextmanager
    def writer(self, key: str) -> Iterator[Path]:
        object_key = self._object_key(key)
        with self._staged() as tmp_path:
            yield tmp_path
            self._call("upload", key, lambda: self.client.upload_file(str(tmp_path), self.bucket, object_key))
            etag = self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=object_key))["ETag"]
            self.cache.put(key, etag, tmp_path)

    def etag(self, key: str) -> str:
        object_key = self._object_key(key)
        return self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=object_key))["ETag"]

    def local_path(self, key: str) -> Path:
        etag = self.etag(key)
        cached = self.cache.get(key, etag)
        if cached is not None:
            return cached
        object_key = self._object_key(key)
        with self._staged(".part") as tmp_path:
            self._call(
                "download", key, lambda: self.client.download_file(self.bucket, object_key, str(tmp_path))
            )
            return self.cache.put(key, etag, tmp_path)

    def exists(self, key: str) -> bool:
        try:
            self.etag(key)
        except FileNotFoundError:
            return False
        return True

    def _list_objects(self, prefix: str) -> dict[str, int]:
        """Object key -> size of every object under `prefix`, from the listing."""
        base = self._object_key(prefix) + "/" if prefix.strip("/") else (f"{self.prefix}/" if self.prefix else "")

        def pages() -> dict[str, int]:
            found = {}
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                found.update((obj["Key"], obj["Size"]) for obj in page.get("Contents", []))
            return found

        return self._call("list", prefix, pages)

    def list(self, prefix: str) -> list[str]:
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str) -> dict[str, int]:
        """From the listing itself: no object is downloaded or asked for one at a time."""
        cut = len(self.prefix) + 1 if self.prefix else 0
        return {k[cut:]: n for k, n in self._list_objects(prefix).items() if not k.rsplit("/", 1)[-1].startswith(".")}

    def delete(self, key: str) -> None:
        """Delete the object `key`, or every object under it when it names a folder."""
        targets = [self._object_key(key)] + list(self._list_objects(key))
        for start in range(0, len(targets), 1000):
            batch = [{"Key": k} for k in targets[start:start + 1000]]
            self._call(
                "delete", key,
                lambda batch=batch: self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}),
            )
