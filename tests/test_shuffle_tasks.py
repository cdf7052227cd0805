"""The shuffle and the lineage index as tasks: the same bytes whatever runs them, every entry once,
each key range within its share of the buffer, and a bad input refused before anything is published."""

from __future__ import annotations

import collections

import polars as pl
import pytest

from refinery.fanout import task_pool
from assets.resource import RefineryResource
from refinery import layout
from refinery import lineage_index as lin
from refinery.global_steps import shuffle as sh
from refinery.global_steps import tokenize as tk
from refinery.documents import input_shards
from refinery.tasks import in_process
from helpers.corpus import bucket_parts, make_corpus, tokenize_all

SHARD_TOKENS, BUFFER_MB = 1024, 1
# About 2.6 KB per key range at a 1 MiB buffer: the web bucket splits into dozens of ranges.
SMALL_RUN_FRACTION = 0.0025


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    c = make_corpus(tmp_path_factory.mktemp("shuffle-tasks"), docs_per_shard={"web/a": 150, "web/b": 100, "math/m": 40},
                    partitions={"workers": 2})
    tokenize_all(c)
    return c


def two_workers(c):
    """The asset's fan-out: a pool of `partitions.workers` (2) spawned processes, each with its own data root."""
    return task_pool(RefineryResource(config_path=str(c.root.root.parent / "refinery.yaml")))


def run_shuffle(c, bucket: str, run_tasks=None, seed: int = 3):
    fields = tk.series_fields(c.cfg, tk.read_tokenizer(c.root, c.cfg.tokenizer.eod_token))
    return sh.shuffle_bucket(c.root, seed, bucket, bucket_parts(c, bucket), fields, SHARD_TOKENS, BUFFER_MB,
                             run_tasks=run_tasks)


def final_files(c, bucket: str) -> dict[str, bytes]:
    return {key: c.root.read_bytes(key) for key in c.root.list(layout.bucket_shards_prefix(tk.FINAL, bucket))}


def entry_multiset(c, stage: str, bucket: str) -> collections.Counter:
    """(doc_id, window, tokens) of every entry of a bucket's final shards or tokenized series."""
    parts = bucket_parts(c, bucket) if stage == tk.TOKENIZED else [None]
    tables = [c.root.read_parquet(layout.bucket_entries_key(stage, bucket, part)) for part in parts]
    return collections.Counter(pl.concat(tables).select("doc_id", "window", "tokens").rows())


def staging_left(c) -> list:
    staging = c.root.root / ".staging"
    return [p for p in staging.rglob("*")] if staging.exists() else []


def test_bytes_are_the_same_across_reruns_and_worker_counts(corpus, monkeypatch):
    monkeypatch.setattr(sh, "RUN_FRACTION", SMALL_RUN_FRACTION)
    one = run_shuffle(corpus, "web")
    first = final_files(corpus, "web")
    assert one.runs > 10 and one.tasks == len(bucket_parts(corpus, "web")) + one.runs
    run_shuffle(corpus, "web")
    assert final_files(corpus, "web") == first
    with two_workers(corpus) as run_tasks:
        two = run_shuffle(corpus, "web", run_tasks)
    assert (two.runs, two.tasks) == (one.runs, one.tasks)
    assert final_files(corpus, "web") == first
    assert staging_left(corpus) == []


def test_every_entry_lands_exactly_once_with_many_ranges_and_two_workers(corpus, monkeypatch):
    monkeypatch.setattr(sh, "RUN_FRACTION", SMALL_RUN_FRACTION)
    with two_workers(corpus) as run_tasks:
        result = run_shuffle(corpus, "web", run_tasks)
    final = entry_multiset(corpus, tk.FINAL, "web")
    assert final == entry_multiset(corpus, tk.TOKENIZED, "web")
    assert max(final.values()) == 1 and sum(final.values()) == result.index["entries"]
    table = corpus.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web"))
    assert table["entry"].to_list() == list(range(table.height))
    # Shards are numbered range-major; inside each, entries and offsets count from 0.
    shards = result.index["shards"]
    assert table["shard"].unique().sort().to_list() == list(range(len(shards)))
    per_shard = table.group_by("shard", maintain_order=True).agg(pl.len().alias("n"), pl.col("tokens").sum().alias("t"))
    assert per_shard["n"].to_list() == [s["entries"] for s in shards]
    assert per_shard["t"].to_list() == [s["tokens"] for s in shards]
    assert all(s["tokens"] <= SHARD_TOKENS or s["entries"] == 1 for s in shards)


def test_the_final_order_is_the_key_order_whatever_the_ranges(corpus, monkeypatch):
    one = run_shuffle(corpus, "web")
    order_one = corpus.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web")).select("doc_id", "window").rows()
    monkeypatch.setattr(sh, "RUN_FRACTION", SMALL_RUN_FRACTION)
    many = run_shuffle(corpus, "web")
    order_many = corpus.root.read_parquet(layout.bucket_entries_key(tk.FINAL, "web")).select("doc_id", "window").rows()
    assert one.runs == 1 and many.runs > 10
    assert order_many == order_one


def test_each_range_stays_within_its_share_of_the_buffer(corpus, monkeypatch):
    monkeypatch.setattr(sh, "RUN_FRACTION", SMALL_RUN_FRACTION)
    result = run_shuffle(corpus, "web")
    itemsize = tk.token_dtype(tk.read_tokenizer(corpus.root, corpus.cfg.tokenizer.eod_token).get_vocab_size()).itemsize
    share = SMALL_RUN_FRACTION * BUFFER_MB * 1024 * 1024
    assert result.runs == sh.plan_runs(result.index["tokens"], itemsize, BUFFER_MB * 1024 * 1024)
    # A range's expected tokens fill the share; with records and doc ids, and the spread of a random
    # split, the largest range held stays within 4 shares (RUN_FRACTION's headroom in the full buffer).
    assert 0 < result.largest_range_bytes <= 4 * share
    assert result.index["tokens"] * itemsize > 10 * share  # the bound is not trivially met by a small bucket


def _break_fields(c, part):
    key = layout.shard_index_key(tk.TOKENIZED, "web", part)
    index = c.root.read_json(key)
    c.root.write_json(key, {**index, "window": index["window"] + 1})


def _drop_series(c, part):
    c.root.delete(layout.shard_index_key(tk.TOKENIZED, "web", part))


def _drop_an_entry_row(c, part):
    key = layout.bucket_entries_key(tk.TOKENIZED, "web", part)
    table = c.root.read_parquet(key)
    c.root.write_parquet(key, table.slice(1))


@pytest.mark.parametrize("damage, message", [
    (_break_fields, r"tokenized with another window than the current tokenizer and config; materialize "
                    r"tokenized_shards for input file 'web-b'"),
    (_drop_series, r"no shard index for bucket 'web'; materialize tokenized_shards for input file 'web-b'"),
    (_drop_an_entry_row, r"rows of shard 0 do not match .*; rebuild tokenized_shards for input file 'web-b'"),
])
def test_a_bad_input_is_refused_by_name_and_the_previous_shards_stay(tmp_path, damage, message):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 30, "web/b": 20, "math/m": 5}, partitions={"workers": 2})
    tokenize_all(c)
    run_shuffle(c, "web")
    before = final_files(c, "web")
    damage(c, bucket_parts(c, "web")[1])
    with pytest.raises(sh.ShuffleError, match=message), two_workers(c) as run_tasks:
        run_shuffle(c, "web", run_tasks)
    assert final_files(c, "web") == before
    assert staging_left(c) == []


def test_lineage_index_is_the_same_bytes_from_one_process_and_from_two_workers(tmp_path):
    c = make_corpus(tmp_path, docs_per_shard={"web/a": 60, "web/b": 40, "math/m": 30}, partitions={"workers": 2})
    tokenize_all(c)
    for bucket in c.cfg.buckets:
        run_shuffle(c, bucket)
    one = lin.build_lineage_index(c.root, c.cfg, run_tasks=in_process(c.root))
    files = {key: c.root.read_bytes(key) for key in c.root.list("lineage")}
    with two_workers(c) as run_tasks:
        two = lin.build_lineage_index(c.root, c.cfg, run_tasks=run_tasks)
    assert {key: c.root.read_bytes(key) for key in c.root.list("lineage")} == files
    assert one["sha256"] == two["sha256"]
    final_shards = sum(len(c.root.read_json(layout.shard_index_key(tk.FINAL, b))["shards"]) for b in c.cfg.buckets)
    assert one["tasks"] == two["tasks"] == len(input_shards(c.cfg)) + final_shards


def _item_and_root(root, item, cache):
    return item, str(root.url)


def test_tasks_that_meet_in_a_folder_of_this_machine_stay_here_under_the_ray_engine(tmp_path, monkeypatch):
    """The shuffle under an S3 root stages in this machine's temp folder: its tasks run in the local
    pool whatever the engine, never as Ray tasks."""
    from refinery import ray_engine
    from helpers.configs import write_config

    def no_ray(*args, **kwargs):
        raise AssertionError("a task that needs this machine's folder was sent to Ray")

    monkeypatch.setattr(ray_engine, "map_tasks", no_ray)
    config = write_config(tmp_path, {"data_root": "out", "buckets": ["web"],
                                     "sources": [{"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"}],
                                     "execution": {"engine": "ray", "address": "127.0.0.1:6379"}})
    refinery = RefineryResource(config_path=str(config))
    with task_pool(refinery, on_this_machine=True) as run_tasks:
        assert run_tasks(_item_and_root, [3, 1, 2]) == [(i, str(tmp_path / "out")) for i in (3, 1, 2)]
    with task_pool(refinery) as run_tasks, pytest.raises(AssertionError, match="sent to Ray"):
        run_tasks(_item_and_root, [1])
