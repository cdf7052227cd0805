"""A decompression bomb through raw_documents: CPU-seconds and what is passed on, with the default
bound on the inflation ratio (`stages.extract.max_inflation_ratio`) and without it (the bound
before issue 41 item 3: `max_file_bytes` alone), in the same run.

    python bench/bomb.py --mb 800 --repeats 3

The bomb is tests/helpers/bombs.py's gzip JSONL (one English sentence repeated, about 300x), the
issue's shape: a few MB on disk, `--mb` decompressed. Each setting reads it with
`stream_input_shard` into Parquet, as the asset does, in one process; figures are medians.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = REPO
sys.path.insert(1, os.path.join(REPO, "tests"))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from helpers.bombs import write_jsonl_bomb  # noqa: E402
from refinery.config import ExtractConfig, SourceConfig  # noqa: E402
from refinery.documents import REJECTS_SCHEMA, InputShard  # noqa: E402
from refinery.stages.ingest import RAW_SCHEMA, stream_input_shard  # noqa: E402
from refinery.stages.parquet_batches import ParquetBatchWriter  # noqa: E402


def ingest(path: Path, out: Path, extract: ExtractConfig) -> dict:
    source = SourceConfig(name="bomb", path=str(path), format="jsonl", bucket="web")
    start = time.process_time()
    with ParquetBatchWriter(out / "documents.parquet", RAW_SCHEMA) as documents, \
         ParquetBatchWriter(out / "rejects.parquet", REJECTS_SCHEMA) as rejects:
        stats = stream_input_shard(InputShard("bomb-x", "bomb", "web", str(path)), source, extract,
                                   documents.write, rejects.write)
    return {"cpu_s": time.process_time() - start, "docs_out": stats.docs_out, "mb_out": stats.bytes_out / 2**20,
            "dropped": dict(stats.dropped)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=800, help="decompressed size of the bomb")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    settings = {"default bound (ratio 100 over 64 MiB)": ExtractConfig(),
                "max_file_bytes alone (before)": ExtractConfig(max_inflation_ratio=None)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.jsonl.gz"
        records, _ = write_jsonl_bomb(path, args.mb << 20)
        print(json.dumps({"file_mb": round(path.stat().st_size / 2**20, 2), "records": records}))
        runs: dict[str, list[dict]] = {name: [] for name in settings}
        for _ in range(args.repeats):  # the settings take turns
            for name, extract in settings.items():
                out = Path(tmp) / "out"
                out.mkdir(exist_ok=True)
                runs[name].append(ingest(path, out, extract))
                print(json.dumps({name: runs[name][-1]}), flush=True)
        for name, rs in runs.items():
            print(json.dumps({name: {"median_cpu_s": round(statistics.median(r["cpu_s"] for r in rs), 2),
                                     "docs_out": rs[0]["docs_out"], "mb_out": round(rs[0]["mb_out"], 1),
                                     "dropped": rs[0]["dropped"]}}))


if __name__ == "__main__":
    main()
