"""The funnel end to end, text in to deduplicated, redacted text out: ours next to HuggingFace
datatrove's comparable chain on the same documents, in the same run.

    python bench/funnel_chain.py --docs 20000 --datatrove-docs 2000 \\
        --datatrove-python /tmp/dtvenv/bin/python
    python bench/funnel_chain.py --corpus multilingual --repeats 5 --datatrove-python /tmp/dtvenv/bin/python

The `synth` corpus is `synthetic.crawl.write_corpus` JSONL (real English sentences, about 3.6 KB per
document, 5% exact and 5% near copies). The `multilingual` corpus is the project's own:
data/multilingual (documentation pages in ten languages and planted spam) and the JSONL sources of
data/sample (wiki, books, math, code; the deliberately broken `-9x` files left out), every
language kept (`languages: all`, datatrove's `languages=None`) at score 0.65; `--docs` and
`--datatrove-docs` are then its size. Both chains start from its text (extraction is timed
separately, in bench/funnel.py) and end with the surviving documents written out:

- ours, in one process, as the graph runs it for one input shard: `read_input_shard`,
  `Extractor` (text passes through), `LanguageFilter` (fastText lid.176), `HeuristicFilter` (URL, Gopher, C4, FineWeb rules),
  `dedup_signatures`, every `exact_deduped` hash range, every `near_deduped` band,
  `near_dup_clusters`, `deduped`, then the PII redactor; Parquet in and out at every step.
- datatrove 0.10, with `LocalPipelineExecutor` (1 task, 1 worker): JsonlReader -> LanguageFilter
  (ft176, given the same local lid.176.ftz instead of a download) -> GopherRepetitionFilter ->
  GopherQualityFilter -> C4QualityFilter(filter_no_terminal_punct=False) -> FineWebQualityFilter
  -> PIIFormatter -> JsonlWriter, then the 4-stage MinHash (signatures, buckets, clusters, filter
  with a JsonlWriter), its FineWeb configuration.

Figures are documents in per CPU-second of the whole process (children included), from after the
imports (each side's import CPU-seconds are printed apart, `import_cpu_s`), medians of `--repeats`
runs that take turns;
datatrove runs on the first `--datatrove-docs` documents and ours on both that subset and the
whole corpus.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

DATATROVE_CHAIN = textwrap.dedent(
    """
    import json, resource, sys
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                          MinhashDedupSignature)
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter, LanguageFilter)
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.lid import FT176LID

    def cpu():
        self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime

    start = cpu()  # interpreter start and imports are not the chain's work (ours leaves them out too)
    data, work, model, languages = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    FT176LID.MODEL_URL = "file://" + model  # the local lid.176 file, not a download
    minhash = MinhashConfig()  # FineWeb's: 14 buckets x 8 hashes, 5-grams
    stages = [
        [JsonlReader(data), LanguageFilter(languages=None if languages == "all" else languages.split(","), language_threshold=0.65), GopherRepetitionFilter(),
         GopherQualityFilter(), C4QualityFilter(filter_no_terminal_punct=False), FineWebQualityFilter(),
         PIIFormatter(), JsonlWriter(f"{work}/filtered")],
        [JsonlReader(f"{work}/filtered"), MinhashDedupSignature(output_folder=f"{work}/sigs", config=minhash)],
        [MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=minhash)],
        [MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=minhash)],
        [JsonlReader(f"{work}/filtered"), MinhashDedupFilter(input_folder=f"{work}/remove_ids"),
         JsonlWriter(f"{work}/deduped")],
    ]
    for i, pipeline in enumerate(stages):
        workers = minhash.num_buckets if i == 2 else 1
        LocalPipelineExecutor(pipeline=pipeline, tasks=workers, workers=1,
                              logging_dir=f"{work}/logs/{i}", skip_completed=False).run()
    kept = 0
    import glob, gzip
    for path in glob.glob(f"{work}/deduped/*"):
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            kept += sum(1 for _ in f)
    print(json.dumps({"cpu_s": cpu() - start, "import_cpu_s": start, "kept": kept}))
    """
)


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ours(jsonl: Path, work: Path, languages: str | list[str]) -> dict:
    """Our chain over one input shard, as the graph's assets run it, in a fresh process."""
    script = textwrap.dedent(
        f"""
        import json, resource, sys
        sys.path[0] = {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r}
        from bench.funnel_chain import run_our_chain
        print(json.dumps(run_our_chain({str(jsonl)!r}, {str(work)!r}, {languages!r})))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"our chain failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


REPO = Path(__file__).resolve().parents[1]


def write_multilingual_corpus(path: Path) -> int:
    """data/multilingual plus the sample's JSONL sources as one JSONL of {id, url, text}; the count."""
    import gzip

    files = sorted((REPO / "data/multilingual").glob("*.jsonl.gz"))
    files += [f for f in sorted((REPO / "data/sample").glob("*/*.jsonl*")) if "-9" not in f.name]
    n = 0
    with path.open("w") as out:
        for f in files:
            with (gzip.open(f, "rt", errors="replace") if f.suffix == ".gz" else f.open(errors="replace")) as lines:
                for line in lines:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        record = None
                    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                        continue  # the sample's planted bad records; the ingest tests cover them
                    out.write(json.dumps({"id": f"{f.stem}-{n}", "url": record.get("url", f"file://{f.name}/{n}"),
                                          "text": record["text"]}) + "\n")
                    n += 1
    return n


def run_our_chain(jsonl: str, work: str, languages: str | list[str] = ("en",)) -> dict:
    imports_from = cpu_seconds()
    from assets import dedup
    from refinery.global_steps import exact_dedup as ex
    from refinery.global_steps import near_dedup as nd
    from refinery.stages.extract import Extractor
    from refinery.stages.heuristic import HeuristicFilter
    from refinery.stages.ingest import read_input_shard
    from refinery.stages.language import LanguageFilter, LanguageModel
    from refinery.stages.pii import PiiRedactor
    from refinery.config import load_config
    from refinery.documents import input_shards
    from refinery.layout import documents_key
    from refinery.stages.attributes import publish_attributes, read_stage_documents
    from refinery.storage import LocalDataRoot

    config = Path(work) / "chain.yaml"
    config.write_text(yaml.safe_dump({
        "seed": 1, "data_root": str(Path(work) / "root"), "buckets": ["web"],
        "sources": [{"name": "web", "path": jsonl, "format": "jsonl", "bucket": "web"}],
        "stages": {"language": {"languages": languages if languages == "all" else list(languages), "min_score": 0.65}},
    }))
    start = cpu_seconds()
    cfg = load_config(str(config))
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    [shard] = input_shards(cfg)
    raw = read_input_shard(shard, cfg.sources[0], cfg.stages.extract)
    text = Extractor(cfg.stages.extract).run(raw.documents)  # JSONL text passes through
    root.write_parquet(documents_key("extracted_text", shard.key), text.documents)
    language = LanguageFilter(cfg.stages.language, LanguageModel()).run(text.documents)
    publish_attributes(root, "language_filtered", shard.key, text.documents, language.documents)
    heuristic = HeuristicFilter(cfg.stages.heuristic).run(language.documents)
    publish_attributes(root, "heuristic_filtered", shard.key, language.documents, heuristic.documents)
    dedup.compute_signatures(cfg, root, shard.key)
    for key in ex.range_keys(cfg.stages.exact_dedup.hash_ranges):
        dedup.compute_exact_range(cfg, root, key)
    for key in nd.band_keys(nd.DedupSettings.from_config(cfg).bands):
        dedup.compute_band_edges(cfg, root, key)
    dedup.compute_clusters(cfg, root)
    dedup.apply_to_shard(cfg, root, shard.key)
    deduped = read_stage_documents(root, "deduped", shard.key)
    redacted = PiiRedactor.from_config(cfg.stages.pii).run(deduped)
    root.write_parquet(documents_key("pii_redacted", shard.key), redacted.documents)
    return {"cpu_s": cpu_seconds() - start, "import_cpu_s": start - imports_from, "docs_in": raw.documents.height,
            "kept": redacted.documents.height}


def main() -> None:
    from refinery.stages.language import bundled_model_path
    from synthetic.crawl import write_corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--datatrove-docs", type=int, default=2_000)
    ap.add_argument("--datatrove-python", help="an interpreter with datatrove[processing] and spaCy installed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", choices=("synth", "multilingual"), default="synth")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each side, taken in turns; medians reported")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        full = tmp / "corpus.jsonl"
        if args.corpus == "multilingual":
            languages: str | list[str] = "all"
            args.docs = args.datatrove_docs = write_multilingual_corpus(full)
        else:
            languages = ["en"]
            write_corpus(full, args.docs, args.seed, fmt="jsonl")
        subset = tmp / "subset" / "corpus.jsonl"
        subset.parent.mkdir()
        subset.write_text("".join(full.read_text().splitlines(keepends=True)[: args.datatrove_docs]))
        sides = [("ours, whole corpus", full, args.docs), ("ours, subset", subset, args.datatrove_docs)]
        if args.datatrove_docs == args.docs:
            sides = sides[1:]  # the subset is the whole corpus
        if args.datatrove_python:
            script = tmp / "datatrove_chain.py"
            script.write_text(DATATROVE_CHAIN)
            sides.append(("datatrove, subset", subset, args.datatrove_docs))
        runs: dict[str, list[dict]] = {name: [] for name, _, _ in sides}
        for repeat in range(args.repeats):  # the sides take turns, so a change in load falls on both
            for name, path, n in sides:
                work = tmp / f"{name.replace(', ', '-').replace(' ', '_')}-{repeat}"
                work.mkdir()
                if name.startswith("datatrove"):
                    r = datatrove(args.datatrove_python, script, path, work, bundled_model_path(), languages)
                else:
                    r = ours(path, work, languages)
                runs[name].append({**r, "docs": n, "docs_per_cpu_s": n / r["cpu_s"]})
                print(json.dumps({name: runs[name][-1]}), flush=True)
        median = {name: statistics.median(r["docs_per_cpu_s"] for r in rs) for name, rs in runs.items()}
        print(json.dumps({"median_docs_per_cpu_s": median}))
        if args.datatrove_python:
            print(json.dumps({"ours_over_datatrove_on_subset": median["ours, subset"] / median["datatrove, subset"]}))


def datatrove(python: str, script: Path, jsonl: Path, work: Path, model: str, languages: str | list[str]) -> dict:
    """datatrove's chain in a fresh process of `python`."""
    proc = subprocess.run([python, str(script), str(jsonl.parent), str(work), model,
                           languages if languages == "all" else ",".join(languages)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"datatrove chain failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])

if __name__ == "__main__":
    main()
