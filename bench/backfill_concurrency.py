"""Backfill wall time on a real multi-process instance at 1 and at 2 concurrent runs.

    python -m bench.backfill_concurrency --repeats 3

The same backfill as tests/test_postgres_backfill.py (the sample's three whole web files through raw_documents
... dedup_signatures, 2 exact-dedup hash ranges, 4 LSH bands, near_dup_clusters: one run per
partition, multiprocess executor) on Postgres with `dagster-daemon run` and the QueuedRunCoordinator
at max_concurrent_runs 1 and 2. Settings alternate within each repeat so both see the same load;
every backfill gets a fresh data root and a fresh daemon. The wall time runs from the first
submission to the last run's end, groups waited for one after another, as `BackfillDriver.backfill`
does. Prints one JSON line per backfill and the medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from helpers.pg_instance import (  # noqa: E402
    RUN_CONFIG, BackfillDriver, LocalInstance, PostgresServer, backfill_selection, max_overlap, sample_config,
)


def one_backfill(workdir: Path, postgres: PostgresServer, name: str, max_concurrent_runs: int) -> dict:
    import dagster as dg

    from orchestration.definitions import build_definitions

    config = sample_config(workdir, name)
    defs = build_definitions(config)
    local = LocalInstance(home=workdir / f"home_{name}", postgres_url=postgres.url, config_path=config,
                          max_concurrent_runs=max_concurrent_runs)
    try:
        local.start()
        instance = local.instance()
        driver = BackfillDriver(local, instance, run_config=RUN_CONFIG)
        try:
            start = time.perf_counter()
            runs = driver.backfill(defs, backfill_selection(defs), timeout_s=900)
            wall = time.perf_counter() - start
        finally:
            driver.close()
        failed = [r.run_id for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
        if failed:
            raise RuntimeError(f"{len(failed)} run(s) failed: {failed}")
        return {"max_concurrent_runs": max_concurrent_runs, "runs": len(runs), "wall_s": round(wall, 1),
                "max_overlap": max_overlap(runs, instance)}
    finally:
        local.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="refinery-backfill-bench-"))
    postgres = PostgresServer()
    results: dict[int, list[float]] = {c: [] for c in args.concurrency}
    try:
        postgres.start()
        for repeat in range(args.repeats):
            for c in args.concurrency:
                row = one_backfill(workdir, postgres, f"r{repeat}_c{c}", c)
                print(json.dumps(row), flush=True)
                results[c].append(row["wall_s"])
    finally:
        postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    medians = {c: statistics.median(v) for c, v in results.items()}
    print(json.dumps({"median_wall_s": medians}))
    base = args.concurrency[0]
    for c in args.concurrency[1:]:
        print(f"{c} concurrent runs: {medians[c]:.1f}s, {medians[base] / medians[c]:.2f}x the speed of {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
