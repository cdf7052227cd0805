"""Stage stats files and the small config that `refinery funnel` and the funnel_report asset are
tested on."""

from __future__ import annotations

from collections import Counter

from helpers.configs import write_config
from refinery.stages.stats import BucketCounts, StageStats


def write_funnel_config(tmp_path, **extra) -> str:
    """A web-only WARC config over an empty in/ (buckets web and code), `extra` sections on top."""
    (tmp_path / "in").mkdir(exist_ok=True)
    config = {
        "data_root": "out",
        "buckets": ["web", "code"],
        "sources": [{"name": "web", "path": "in/*.warc.gz", "format": "warc", "bucket": "web"}],
        **extra,
    }
    return str(write_config(tmp_path, config))


def stats(stage, buckets, dropped=None):
    """buckets: {bucket: (docs_in, docs_out, bytes_in, bytes_out)}"""
    by_bucket = {b: BucketCounts(*c) for b, c in buckets.items()}
    total = [sum(c[i] for c in buckets.values()) for i in range(4)]
    return StageStats(stage, *total, wall_s=0.5, dropped=Counter(dropped or {}), by_bucket=by_bucket)
