"""Peak memory and time of building a phase manifest with a quality cutoff, at growing synthetic
inventories (issue 24, item 4).

Each size runs in its own process: two buckets of N entries each (index.json and entries.parquet as
shuffled_shards writes them, row groups of 65,536 entries, no shard files: tests/helpers/final_shards.py),
then `validate_data_root` and `build_phase_manifest` for the anneal phase (top quarter by
quality_score). Reported: wall time of validation + manifest, peak RSS of the process over its RSS
before the build, and bytes per entry. Which code runs is whatever `refinery` resolves to, so the
same script measures a checkout of an older commit through PYTHONPATH:

    PYTHONPATH=.:tests .venv/bin/python bench/manifest_memory.py --sizes 250000 1000000 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROW_GROUP = 65_536  # shuffled_shards' entry-table row group (refinery/global_steps/tokenize.py ENTRY_ROW_GROUP)


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_inventory(root, entries: int) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    from helpers.final_shards import write_final_index

    for seed, bucket in enumerate(("web", "math")):
        rng = np.random.default_rng(seed)
        # every fifth document has two windows (document_entries), so this many documents give `entries`
        docs_n = entries * 5 // 6
        scores = rng.random(docs_n).round(4)  # ties at the cutoff, as real scores have
        docs = [(f"{bucket}-0/{i:09d}", int(t), None if i % 97 == 3 else float(s))
                for i, (t, s) in enumerate(zip(rng.integers(40, 600, docs_n), scores))]
        write_final_index(root, bucket, docs, per_shard=4096)
        index = root.read_json(f"shards/final/{bucket}/index.json")
        path = root.local_path(index["entries_table"]["key"])
        pq.write_table(pq.read_table(path), path, row_group_size=ROW_GROUP, compression="zstd")


def measure(folder: Path, entries: int) -> dict:
    """In a process that did nothing else, so ru_maxrss is the build's peak."""
    from helpers.final_shards import config_dict
    from refinery.config import parse_config
    from refinery.curriculum import build_phase_manifest, validate_data_root
    from refinery.storage import LocalDataRoot

    root = LocalDataRoot(folder / "root")
    cfg = parse_config(config_dict(folder))
    before = current_rss()
    t0 = time.perf_counter()
    report, inventory, selections = validate_data_root(cfg, root)
    manifest = build_phase_manifest(cfg, root, "anneal", report, inventory, selections)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    web = manifest.buckets["web"]
    return {"entries_per_bucket": entries, "wall_s": round(wall, 3), "rss_before_mb": round(before / 2**20, 1),
            "peak_rss_mb": round(peak / 2**20, 1), "peak_over_before_mb": round((peak - before) / 2**20, 1),
            "bytes_per_entry": round((peak - before) / (2 * entries), 1),
            "kept_web": [web.entries, web.tokens, web.quality_cutoff]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000, 2_000_000])
    parser.add_argument("--write", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        from refinery.storage import LocalDataRoot

        write_inventory(LocalDataRoot(Path(args.write[0]) / "root"), int(args.write[1]))
        return
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), int(args.measure[1]))))
        return
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, __file__, "--write", tmp, str(n)], check=True)
            out = subprocess.run([sys.executable, __file__, "--measure", tmp, str(n)], check=True,
                                 capture_output=True, text=True)
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
