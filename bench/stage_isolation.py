"""What per-record isolation costs on normal documents, in wall time, in one run.

- extracted_text: `Extractor.run` (depth pre-check, pages sent in batches of 64 to the isolated
  worker process, each answered within the budget) against a bare loop of resiliparse's
  `extract_plain_text` over the same pages in this process. Wall time, because the work moved to a
  child process that this process's CPU clock does not see; and CPU time of both processes
  (this one's plus the worker's, read from /proc), which shows what the isolation costs in work.
- language_filtered and heuristic_filtered: the stage with its per-record budget armed (a SIGALRM
  timer set and cleared around every document) against the same stage with no budget, in CPU
  seconds of this process (both run here; CPU time is less disturbed by a shared machine's load).

Each figure is the median of `--repeats` runs, alternating the two sides; the corpus is
`synthetic.crawl.write_corpus` as a per-record-gzip WARC, read once by `read_input_shard`.

    python bench/stage_isolation.py --docs 5000 --repeats 5
"""

import os
import sys

# Replace rather than prepend: sys.path[0] is bench/, whose tokenize.py would shadow the stdlib's.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from refinery.stages.extract import Extractor  # noqa: E402
from refinery.stages.heuristic import HeuristicFilter  # noqa: E402
from refinery.stages.html import main_content_text  # noqa: E402
from refinery.stages.ingest import read_input_shard  # noqa: E402
from refinery.stages.isolation import shared_worker  # noqa: E402
from refinery.stages.language import LanguageFilter, LanguageModel  # noqa: E402
from refinery.config import ExtractConfig, HeuristicConfig, LanguageConfig, SourceConfig  # noqa: E402
from refinery.documents import InputShard  # noqa: E402
from synthetic.crawl import write_corpus  # noqa: E402


def timed(clock, fn) -> float:
    start = clock()
    fn()
    return clock() - start


def compare(name: str, ours, baseline, repeats: int, docs: int, clock=time.perf_counter) -> dict:
    ours_t, base_t = [], []
    for _ in range(repeats):
        base_t.append(timed(clock, baseline))
        ours_t.append(timed(clock, ours))
    unit = "wall_s" if clock is time.perf_counter else "cpu_s"
    row = {
        "stage": name,
        "docs": docs,
        f"ours_{unit}": round(statistics.median(ours_t), 4),
        f"baseline_{unit}": round(statistics.median(base_t), 4),
        "ours_over_baseline": round(statistics.median(ours_t) / statistics.median(base_t), 3),
    }
    print(json.dumps(row), flush=True)
    return row


def worker_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        warc = Path(tmp_dir) / "bench.warc.gz"
        write_corpus(warc, args.docs, args.seed, fmt="warc")
        source = SourceConfig(name="bench", path=str(warc), format="warc", bucket="web")
        raw = read_input_shard(InputShard("bench-x", "bench", "web", str(warc)), source, ExtractConfig()).documents
    n = raw.height
    extractor = Extractor(ExtractConfig())
    extractor.run(raw.head(1))  # the worker process starts once per process, not per partition
    pages = raw["raw"].to_list()
    rows = [compare("extracted_text", lambda: extractor.run(raw),
                    lambda: [main_content_text(p) for p in list(map(str, pages))], args.repeats, n)]
    worker = shared_worker(main_content_text, extractor.record_timeout_s)
    both = lambda: time.process_time() + worker_cpu_s(worker.process.pid)  # noqa: E731
    rows.append(compare("extracted_text (CPU of both processes)", lambda: extractor.run(raw),
                        lambda: [main_content_text(p) for p in list(map(str, pages))], args.repeats, n, both))
    text = extractor.run(raw).documents

    budgeted = [LanguageFilter(LanguageConfig(), LanguageModel()), HeuristicFilter(HeuristicConfig())]
    unbudgeted = [LanguageFilter(LanguageConfig(), LanguageModel()), HeuristicFilter(HeuristicConfig())]
    for stage in unbudgeted:
        stage.record_timeout_s = None
    for ours, bare in zip(budgeted, unbudgeted):
        rows.append(compare(ours.name, lambda s=ours: s.run(text), lambda s=bare: s.run(text), args.repeats, n,
                            time.process_time))
        text = ours.run(text).documents
    print(json.dumps({"stages": rows}, indent=1))


if __name__ == "__main__":
    main()
