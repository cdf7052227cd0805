"""Peak memory of one per-file stage on one generated input file, measured in a fresh process.

`peak_of_signatures(workdir, docs)` writes `docs` documents of about 12 KB (distinct words, so
every document is its own) as one input file's `heuristic_filtered` table (one row group, as a
whole-file writer would leave it), then runs `dedup_signatures`' file task on it in a child
process with `stages.extract.batch_bytes` at its 1 MiB floor, and returns the child's figures:
its peak resident memory (VmHWM) and the documents it signed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import polars as pl

from helpers.configs import demo_config, write_config

REPO = Path(__file__).resolve().parents[2]
WORDS_PER_DOC = 1000
BATCH_BYTES = 1 << 20


def generated_documents(docs: int, seed: int = 0) -> pl.DataFrame:
    """`docs` documents of WORDS_PER_DOC words drawn from 20,000 made-up words."""
    rng = random.Random(seed)
    vocabulary = [f"w{rng.getrandbits(40):x}" for _ in range(20_000)]
    texts = [" ".join(rng.choices(vocabulary, k=WORDS_PER_DOC)) for _ in range(docs)]
    return pl.DataFrame({"text": texts})


def write_input(workdir: Path, docs: int) -> Path:
    """A config whose one source is a file of `docs` documents, with that file's heuristic_filtered
    table written under its data root; returns the config's path."""
    from refinery.config import load_config
    from refinery.documents import input_shards, make_doc_id
    from refinery.stages.attributes import write_stage_documents
    from refinery.storage import LocalDataRoot

    workdir.mkdir(parents=True)
    source = workdir / "big.jsonl"
    texts = generated_documents(docs)
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts["text"]))
    data = demo_config(workdir / "out")
    data["sources"] = [{"name": "big", "path": str(source), "format": "jsonl", "bucket": "web"}]
    data["stages"].setdefault("extract", {})["batch_bytes"] = BATCH_BYTES
    config = write_config(workdir, data)
    cfg = load_config(config)
    [shard] = input_shards(cfg)
    table = texts.with_columns(
        doc_id=pl.Series([make_doc_id(shard.key, i) for i in range(docs)]),
        url=pl.Series([f"https://big.example/{i}" for i in range(docs)]),
    )
    write_stage_documents(LocalDataRoot(cfg.resolve(cfg.data_root)), "heuristic_filtered", shard.key, table)
    return config


def peak_of_signatures(workdir: Path, docs: int) -> dict:
    """Run dedup_signatures' file task on a fresh file of `docs` documents in a child process."""
    config = write_input(workdir, docs)
    done = subprocess.run([sys.executable, __file__, str(config)], capture_output=True, text=True, check=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])})
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    from refinery.config import load_config
    from refinery.documents import input_shards
    from refinery.global_steps.dedup_compute import compute_signatures
    from refinery.storage import LocalDataRoot

    cfg = load_config(sys.argv[1])
    [shard] = input_shards(cfg)
    counts, _ = compute_signatures(cfg, LocalDataRoot(cfg.resolve(cfg.data_root)), shard.key)
    # VmHWM, this process image's own peak: ru_maxrss keeps the forking parent's peak across exec.
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"peak_rss_bytes": int(hwm.split()[1]) * 1024, "docs": counts.docs}))
