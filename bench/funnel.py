"""Funnel stage throughput next to the bare library call, on one generated corpus, in one run.

The corpus is `synthetic.crawl.write_corpus` as a per-record-gzip WARC of HTML pages (real English
sentences, about 550 words a document), read once by `read_input_shard`. Each stage gets the
previous stage's output, so every stage sees the documents it would see in the funnel.

| stage              | ours                      | baseline                                                     |
| ------------------ | ------------------------- | ------------------------------------------------------------ |
| extracted_text     | `Extractor.run(table)`    | a loop of resiliparse `extract_plain_text(html, main_content=True)` |
| language_filtered  | `LanguageFilter.run`      | a loop of fastText `model.predict(text.replace("\\n", " "))` |
| heuristic_filtered | `HeuristicFilter.run`     | datatrove 0.10 GopherRepetition -> GopherQuality -> C4 (no terminal-punct rule) -> FineWebQuality, each `filter(doc)` called directly, in FineWeb's order, in a separate interpreter (`--datatrove-python`) |

Ours is timed whole, as the asset runs it: table in, kept table, rejects and stats out. The
baselines are timed on a Python list of their inputs made beforehand (afresh for every repeat), so
they are the library calls alone. Timings are CPU seconds of this process (`time.process_time`), so other load on a
shared machine inflates them less than wall time; each figure is the median of `--repeats` runs,
alternating baseline and ours. datatrove runs on the first `--datatrove-docs` documents (it manages ~50 docs
per CPU-second), and ours is timed on that same subset for the ratio.

    python bench/funnel.py --docs 20000 --repeats 3 --datatrove-python /tmp/dtvenv/bin/python

To add a stage, append a `StageBench` to `stage_benches()`: a name, `ours(table) -> table` and an
optional `baseline(table) -> None`, each given the previous stage's output table.
"""

import os
import sys

# First, and replace rather than prepend: sys.path[0] is bench/, whose tokenize.py would shadow the
# stdlib module that dataclasses (through inspect and linecache) imports.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import polars as pl  # noqa: E402

from refinery.stages.extract import Extractor  # noqa: E402
from refinery.stages.html import main_content_text  # noqa: E402
from refinery.stages.heuristic import HeuristicFilter  # noqa: E402
from refinery.stages.ingest import read_input_shard  # noqa: E402
from refinery.stages.language import LanguageFilter, LanguageModel, bundled_model_path  # noqa: E402
from refinery.config import ExtractConfig, HeuristicConfig, LanguageConfig, SourceConfig  # noqa: E402
from refinery.documents import InputShard  # noqa: E402
from synthetic.crawl import write_corpus  # noqa: E402

# datatrove's chain as FineWeb ran it over a JSONL file of {"text": ...}; prints the CPU seconds of
# each repeat and every document's keep decision as JSON. Run by the interpreter with datatrove.
DATATROVE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from datatrove.data import Document
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter,
                                            GopherQualityFilter, GopherRepetitionFilter)
    texts = [json.loads(line)["text"] for line in open(sys.argv[1])]
    repeats = int(sys.argv[2])
    chain = [GopherRepetitionFilter(), GopherQualityFilter(),
             C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter()]
    chain[0].filter(Document(text=texts[0], id="warmup"))  # load spaCy outside the timing
    times, kept = [], []
    for _ in range(repeats):
        start, keep = time.process_time(), []
        for i, text in enumerate(texts):
            doc = Document(text=text, id=str(i))
            verdict = True
            for f in chain:
                verdict = f.filter(doc)
                if verdict is not True:
                    break
            keep.append(verdict is True)
        times.append(time.process_time() - start)
        kept = keep
    print(json.dumps({"cpu_s": times, "kept": kept}))
    """
)


@dataclass
class StageBench:
    """`ours` takes the previous stage's table and is timed whole (table in, table out, as the asset
    runs it). `baseline` is timed on `prepare(table)`, made beforehand, so it is only the library
    calls."""

    name: str
    ours: Callable[[pl.DataFrame], pl.DataFrame]
    baseline_name: str
    prepare: Callable[[pl.DataFrame], list] | None = None
    baseline: Callable[[list], None] | None = None


def cpu_time(fn: Callable, *args):
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def stage_benches() -> list[StageBench]:
    extractor = Extractor(ExtractConfig())
    bare_extract = main_content_text
    language = LanguageFilter(LanguageConfig(), LanguageModel())

    import fasttext

    bare_model = fasttext.load_model(bundled_model_path())
    heuristic = HeuristicFilter(HeuristicConfig())

    def extract_loop(pages: list[str]) -> None:
        for html in pages:
            bare_extract(html)

    def predict_loop(texts: list[str]) -> None:
        for text in texts:
            bare_model.predict(text.replace("\n", " "), k=1)

    return [
        StageBench("extracted_text", lambda t: extractor.run(t).documents, "resiliparse extract_plain_text loop",
                   lambda t: t["raw"].to_list(), extract_loop),
        StageBench("language_filtered", lambda t: language.run(t).documents, "fastText predict loop",
                   lambda t: t["text"].to_list(), predict_loop),
        StageBench("heuristic_filtered", lambda t: heuristic.run(t).documents, "datatrove (see heuristic_vs_datatrove)"),
    ]


def measure(bench: StageBench, table: pl.DataFrame, repeats: int) -> tuple[dict, pl.DataFrame]:
    ours_t, base_t, out = [], [], table
    for _ in range(repeats):
        if bench.baseline is not None:
            # Fresh inputs every repeat: CPython caches a str's UTF-8 form on first use, so a list
            # handed to the library twice runs faster the second time than any real input does.
            prepared = bench.prepare(table)
            base_t.append(cpu_time(bench.baseline, prepared)[0])
            del prepared
        t, out = cpu_time(bench.ours, table)
        ours_t.append(t)
    row = {
        "stage": bench.name,
        "docs_in": table.height,
        "docs_out": out.height,
        "ours_docs_per_cpu_s": table.height / statistics.median(ours_t),
        "ours_cpu_s": ours_t,
    }
    if base_t:
        row |= {
            "baseline": bench.baseline_name,
            "baseline_docs_per_cpu_s": table.height / statistics.median(base_t),
            "baseline_cpu_s": base_t,
            "ours_over_baseline_time": statistics.median(ours_t) / statistics.median(base_t),
        }
    return row, out


def datatrove_versus_ours(table: pl.DataFrame, python: str, docs: int, repeats: int, tmp: Path) -> dict:
    subset = table.head(docs)
    path = tmp / "heuristic_input.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in subset["text"]))
    script = tmp / "datatrove_chain.py"
    script.write_text(DATATROVE_SCRIPT)
    proc = subprocess.run([python, str(script), str(path), str(repeats)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"datatrove run failed:\n{proc.stderr[-3000:]}")
    dt = json.loads(proc.stdout.strip().splitlines()[-1])
    heuristic = HeuristicFilter(HeuristicConfig())
    ours_t = [cpu_time(heuristic.run, subset)[0] for _ in range(repeats)]
    ours_kept = set(heuristic.run(subset).documents["doc_id"])
    agree = sum((doc_id in ours_kept) == kept for doc_id, kept in zip(subset["doc_id"], dt["kept"]))
    return {
        "docs": subset.height,
        "datatrove_docs_per_cpu_s": subset.height / statistics.median(dt["cpu_s"]),
        "datatrove_cpu_s": dt["cpu_s"],
        "ours_docs_per_cpu_s": subset.height / statistics.median(ours_t),
        "ours_cpu_s": ours_t,
        "speedup": statistics.median(dt["cpu_s"]) / statistics.median(ours_t),
        "kept_ours": len(ours_kept),
        "kept_datatrove": sum(dt["kept"]),
        "decision_agreement": agree / subset.height,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--datatrove-python", help="an interpreter with datatrove and spaCy installed")
    ap.add_argument("--datatrove-docs", type=int, default=2_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        warc = tmp / "bench.warc.gz"
        write_corpus(warc, args.docs, args.seed, fmt="warc")
        source = SourceConfig(name="bench", path=str(warc), format="warc", bucket="web")
        table = read_input_shard(InputShard("bench-x", "bench", "web", str(warc)), source, ExtractConfig()).documents
        rows, inputs = [], {}
        for bench in stage_benches():
            inputs[bench.name] = table
            row, table = measure(bench, table, args.repeats)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)
        report = {"stages": rows}
        if args.datatrove_python:
            report["heuristic_vs_datatrove"] = datatrove_versus_ours(
                inputs["heuristic_filtered"], args.datatrove_python, args.datatrove_docs, args.repeats, tmp
            )
            print(json.dumps(report["heuristic_vs_datatrove"]), flush=True)
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
