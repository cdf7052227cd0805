"""DataRoot contract on a local folder and on S3 (moto, in-process), plus the shard cache tier."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest

from refinery.shard_format import SHARD_SUFFIXES, ShardReader, ShardWriter
from refinery.storage import LocalDataRoot, open_data_root
from refinery.shard_cache import ShardCache
from refinery.storage.s3 import S3DataRoot, S3StorageError, parse_s3_url

from helpers.moto import SECRET


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return LocalDataRoot(tmp_path / "root")
    request.getfixturevalue("moto_s3")
    return S3DataRoot("s3://bkt/run1", cache_dir=tmp_path / "cache")


def sample_frame() -> pl.DataFrame:
    return pl.DataFrame({"doc_id": ["a", "b", "c"], "n": [3, 1, 2]})


def test_round_trip_json_parquet_bytes(root):
    assert root.write_json("stats/x/p0.json", {"b": 1, "a": [1, 2]}) == root.sha256("stats/x/p0.json")
    assert root.read_json("stats/x/p0.json") == {"a": [1, 2], "b": 1}
    digest = root.write_parquet("documents/x/p0.parquet", sample_frame())
    assert root.read_parquet("documents/x/p0.parquet").equals(sample_frame())
    assert root.sha256("documents/x/p0.parquet") == digest
    assert root.read_parquet("documents/x/p0.parquet", columns=["n"]).columns == ["n"]
    root.write_bytes("blob/raw.bin", b"\x00\x01\x02")
    assert root.read_bytes("blob/raw.bin") == b"\x00\x01\x02"


def test_same_frame_gives_same_bytes(root):
    first = root.write_parquet("documents/x/a.parquet", sample_frame())
    second = root.write_parquet("documents/x/b.parquet", sample_frame())
    assert first == second


def test_list_exists_delete(root):
    for key in ["d/s/p1.parquet", "d/s/p0.parquet", "d/t/p0.parquet", "other/p.json"]:
        root.write_bytes(key, b"x")
    assert root.list("d") == ["d/s/p0.parquet", "d/s/p1.parquet", "d/t/p0.parquet"]
    assert root.list("d/s") == ["d/s/p0.parquet", "d/s/p1.parquet"]
    assert root.list("missing") == []
    assert root.exists("d/t/p0.parquet") and not root.exists("d/t/p9.parquet")
    root.delete("d/s")
    assert root.list("d") == ["d/t/p0.parquet"]
    root.delete("d/t/p0.parquet")
    assert not root.exists("d/t/p0.parquet")
    assert root.list("other") == ["other/p.json"]


def test_exception_inside_writer_leaves_no_object_and_keeps_the_old_one(root):
    root.write_bytes("documents/s/p0.parquet", b"complete")
    with pytest.raises(RuntimeError, match="boom"):
        with root.writer("documents/s/p0.parquet") as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        with root.writer("documents/s/p1.parquet") as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert root.read_bytes("documents/s/p0.parquet") == b"complete"
    assert root.list("documents") == ["documents/s/p0.parquet"]


def test_missing_key_is_file_not_found_with_a_hint(root):
    with pytest.raises(FileNotFoundError, match="materialize the asset"):
        root.local_path("documents/none/p0.parquet")


def test_keys_cannot_escape_the_root(root):
    with pytest.raises(ValueError):
        root.writer("../outside.json").__enter__()


def test_open_data_root_picks_the_implementation(tmp_path, moto_s3):
    assert isinstance(open_data_root(str(tmp_path)), LocalDataRoot)
    s3 = open_data_root("s3://bkt/pre/fix/", cache_dir=tmp_path / "c")
    assert isinstance(s3, S3DataRoot) and s3.url == "s3://bkt/pre/fix"
    assert parse_s3_url("s3://bkt") == ("bkt", "")
    with pytest.raises(ValueError, match="names no bucket"):
        parse_s3_url("s3:///x")


def test_s3_objects_live_under_the_prefix(moto_s3, tmp_path):
    import boto3

    S3DataRoot("s3://bkt/runA", cache_dir=tmp_path / "c").write_json("m/p.json", [1])
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="bkt")["Contents"]]
    assert keys == ["runA/m/p.json"]
    assert S3DataRoot("s3://bkt/runB", cache_dir=tmp_path / "c2").list("m") == []


def test_s3_reads_hit_the_cache_until_the_object_changes(moto_s3, tmp_path):
    writer = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "w")
    reader = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "r")
    writer.write_bytes("k.bin", b"one")
    first = reader.local_path("k.bin")
    assert first.read_bytes() == b"one"
    stamp = first.stat().st_mtime_ns
    assert reader.local_path("k.bin").stat().st_mtime_ns == stamp
    writer.write_bytes("k.bin", b"two!")
    assert reader.read_bytes("k.bin") == b"two!"
    # A new process finds what the last one fetched and does not download it again.
    again = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "r")
    assert again.cache.cached_keys() == ["k.bin"]
    assert again.cache.total_bytes() == 4


def test_s3_cache_is_bounded_lru(moto_s3, tmp_path):
    root = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "c", cache_bytes=250)
    for name in "abc":
        root.write_bytes(f"{name}.bin", name.encode() * 100)
    root.local_path("a.bin")
    assert root.cache.total_bytes() <= 250
    assert root.cache.cached_keys() == ["c.bin", "a.bin"]
    root.local_path("b.bin")
    assert root.cache.cached_keys() == ["a.bin", "b.bin"]
    assert not (tmp_path / "c" / "c.bin").exists()


def write_shard(root, key: str, n_entries: int, tmp_path) -> np.ndarray:
    rng = np.random.default_rng(len(key))
    local = tmp_path / "build" / key
    local.parent.mkdir(parents=True, exist_ok=True)
    w = ShardWriter(local, np.uint16)
    arrays = [rng.integers(0, 1000, size=50, dtype=np.uint16) for _ in range(n_entries)]
    for i, a in enumerate(arrays):
        w.add(a, f"d{i}")
    w.close()
    for suffix in SHARD_SUFFIXES:
        with root.writer(key + suffix) as tmp:
            shutil.copyfile(str(local) + suffix, tmp)
    return np.concatenate(arrays)


def test_shard_cache_prefetches_pins_and_evicts(moto_s3, tmp_path):
    root = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "writer-cache")
    tokens = {k: write_shard(root, k, 20, tmp_path) for k in ["shards/web/s0", "shards/web/s1", "shards/web/s2"]}
    reader_root = S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "trainer-cache")
    one_shard = sum(reader_root.client.head_object(Bucket="bkt", Key=f"r/shards/web/s0{s}")["ContentLength"]
                    for s in SHARD_SUFFIXES)
    with ShardCache(reader_root, max_bytes=int(one_shard * 1.5)) as cache:
        cache.prefetch(["shards/web/s0", "shards/web/s1"])
        prefix0 = cache.local_prefix("shards/web/s0")
        assert np.array_equal(ShardReader(prefix0).tokens, tokens["shards/web/s0"])
        prefix1 = cache.local_prefix("shards/web/s1")
        # s0 is still pinned, so it survives although two shards exceed the bound.
        assert np.array_equal(ShardReader(prefix0).tokens, tokens["shards/web/s0"])
        assert np.array_equal(ShardReader(prefix1).tokens, tokens["shards/web/s1"])
        cache.release("shards/web/s0")
        cache.release("shards/web/s1")
        prefix2 = cache.local_prefix("shards/web/s2")
        assert np.array_equal(ShardReader(prefix2).tokens, tokens["shards/web/s2"])
        assert reader_root.cache.total_bytes() <= int(one_shard * 1.5)
        cached = reader_root.cache.cached_keys()
        assert {"shards/web/s2" + s for s in SHARD_SUFFIXES} <= set(cached)
        assert not any(k.startswith("shards/web/s0") for k in cached)


def test_shard_cache_on_a_local_root_reads_in_place(tmp_path):
    root = LocalDataRoot(tmp_path / "root")
    tokens = write_shard(root, "shards/web/s0", 5, tmp_path)
    with ShardCache(root) as cache:
        prefix = cache.local_prefix("shards/web/s0")
        assert str(prefix) == str(root.local_path("shards/web/s0.bin"))[: -len(".bin")]
        assert np.array_equal(ShardReader(prefix).tokens, tokens)


def test_shard_cache_reports_a_missing_shard(moto_s3, tmp_path):
    with ShardCache(S3DataRoot("s3://bkt/r", cache_dir=tmp_path / "c")) as cache:
        with pytest.raises(FileNotFoundError, match="shards/web/nope.bin"):
            cache.local_prefix("shards/web/nope")


def test_credentials_never_reach_repr_or_errors(moto_s3, tmp_path):
    root = S3DataRoot("s3://no-such-bucket/x", cache_dir=tmp_path / "c")
    assert SECRET not in repr(root) and "motokey" not in repr(root)
    with pytest.raises(S3StorageError) as info:
        root.write_json("a.json", {})
    text = str(info.value)
    assert "s3://no-such-bucket/x/a.json" in text and "AWS_SECRET_ACCESS_KEY" in text
    assert SECRET not in text


def test_leftover_temporaries_of_named_keys_are_removed_and_nothing_else(tmp_path):
    """A writer killed mid-write (SIGKILL: no cleanup runs) leaves `.<name>.<random>.tmp`; once the
    key is written again, the step removes those of its keys, not other keys' files or temporaries."""
    root = LocalDataRoot(tmp_path)
    root.write_bytes("documents/x/a.parquet", b"a")
    root.write_bytes("stats/x/a.json", b"{}")
    root.write_bytes("documents/x/b.parquet", b"b")
    killed = [tmp_path / "documents/x/.a.parquet.k1_x.tmp", tmp_path / "stats/x/.a.json.zz9.tmp"]
    kept = [tmp_path / "documents/x/.b.parquet.q2.tmp", tmp_path / "documents/x/.a.parquetz.q3.tmp"]
    for path in killed + kept:
        path.write_bytes(b"partial")
    assert root.list("documents") == ["documents/x/a.parquet", "documents/x/b.parquet"]
    assert root.remove_leftover_temporaries(["documents/x/a.parquet", "stats/x/a.json", "documents/y/c.parquet"]) == 2
    assert [p.exists() for p in killed + kept] == [False, False, True, True]
    assert root.read_bytes("documents/x/a.parquet") == b"a" and root.read_bytes("stats/x/a.json") == b"{}"
