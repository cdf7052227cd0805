"""heuristic_filtered CPU time on English and on the multilingual corpus, against another checkout.

Inputs are made once, in this checkout: `synthetic.crawl` English documents (a WARC, extracted as
the funnel does) and data/multilingual's clean and spam pages, both through language ID with
`languages: all`. Each checkout named by `--baseline` (a folder holding an older tree, e.g. made
with `git archive COMMIT | tar -x -C DIR`) and this one then time `HeuristicFilter(HeuristicConfig())
.run(table)` in their own interpreter, alternately, `--rounds` times; each figure is the median of
`--repeats` CPU-time runs inside one interpreter, after a warm-up run per language (jieba's
dictionary, the stop-word lists). Also prints this checkout's milliseconds per document per language.

    python bench/heuristic_languages.py --docs 3000 --rounds 3 --baseline /tmp/base
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(sys.path[0])

TIMER = """
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import polars as pl
import refinery.stages.heuristic as h
from refinery.config import HeuristicConfig
assert h.__file__.startswith(sys.argv[1]), h.__file__
table = pl.read_parquet(sys.argv[2])
stage = h.HeuristicFilter(HeuristicConfig())
for lang in table["language"].unique().to_list():
    stage.run(table.filter(pl.col("language") == lang).head(2))
times = []
for _ in range(int(sys.argv[3])):
    start = time.process_time()
    kept = stage.run(table).documents.height
    times.append(time.process_time() - start)
print(json.dumps({"median_s": statistics.median(times), "kept": kept}))
"""


def make_inputs(tmp: Path, docs: int) -> dict[str, Path]:
    import gzip

    import polars as pl

    from refinery.stages.extract import Extractor
    from refinery.stages.ingest import read_input_shard
    from refinery.stages.language import LanguageFilter, load_language_model
    from refinery.config import ExtractConfig, LanguageConfig, SourceConfig
    from refinery.documents import PROVENANCE_SCHEMA, InputShard
    from synthetic.crawl import write_corpus

    language = LanguageFilter(LanguageConfig(languages="all", min_score=0.0), load_language_model(None))
    warc = tmp / "en.warc.gz"
    write_corpus(warc, docs, 1, fmt="warc")
    source = SourceConfig(name="bench", path=str(warc), format="warc", bucket="web")
    raw = read_input_shard(InputShard("bench-x", "bench", "web", str(warc)), source, ExtractConfig()).documents
    english = language.run(Extractor(ExtractConfig()).run(raw).documents).documents
    pages = [json.loads(line) for name in ("clean", "spam")
             for line in gzip.open(HERE / "data" / "multilingual" / f"{name}.jsonl.gz", "rt", encoding="utf-8")]
    n = len(pages)
    frame = pl.DataFrame(
        {"doc_id": [f"ml/{i}" for i in range(n)], "url": [p["url"] for p in pages], "source": ["ml"] * n,
         "bucket": ["web"] * n, "file": ["ml"] * n, "record_index": list(range(n)), "record_offset": list(range(n)),
         "fetch_time": [None] * n, "content_type": ["text/plain"] * n, "text": [p["text"] for p in pages]},
        schema_overrides={**PROVENANCE_SCHEMA, "text": pl.String},
    )
    multilingual = language.run(frame).documents
    paths = {"english": tmp / "english.parquet", "multilingual": tmp / "multilingual.parquet"}
    english.write_parquet(paths["english"])
    multilingual.write_parquet(paths["multilingual"])
    return paths


def per_language_ms(path: Path) -> dict[str, float]:
    import polars as pl

    from refinery.stages.heuristic import HeuristicFilter
    from refinery.config import HeuristicConfig

    table = pl.read_parquet(path)
    stage = HeuristicFilter(HeuristicConfig())
    out = {}
    for lang in sorted(table["language"].unique().to_list()):
        part = table.filter(pl.col("language") == lang)
        stage.run(part.head(2))
        start = time.process_time()
        stage.run(part)
        out[lang] = round((time.process_time() - start) / part.height * 1000, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", action="append", default=[], help="another checkout's folder (repeatable)")
    args = ap.parse_args()
    codes = {**{Path(b).name: str(Path(b).resolve()) for b in args.baseline}, "this": str(HERE)}
    with tempfile.TemporaryDirectory() as tmp_dir:
        inputs = make_inputs(Path(tmp_dir), args.docs)
        runs: dict[tuple[str, str], list[float]] = {}
        kept: dict[tuple[str, str], int] = {}
        for _ in range(args.rounds):
            for name, code in codes.items():
                for corpus, path in inputs.items():
                    out = subprocess.run([sys.executable, "-c", TIMER, code, str(path), str(args.repeats)],
                                         check=True, capture_output=True, text=True).stdout
                    result = json.loads(out)
                    runs.setdefault((name, corpus), []).append(result["median_s"])
                    kept[(name, corpus)] = result["kept"]
        report = {
            "runs": [{"code": name, "corpus": corpus, "median_s": round(statistics.median(times), 4),
                      "rounds": [round(t, 4) for t in times], "kept": kept[(name, corpus)]}
                     for (name, corpus), times in runs.items()],
            "this_ms_per_doc_by_language": per_language_ms(inputs["multilingual"]),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
