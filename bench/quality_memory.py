"""Peak memory of the quality classifier's training step (`quality_model`) as the corpus grows, and
its held-out accuracy and AUC.

`--docs N [N ...]` builds, per size, a data root whose `deduped` tables hold N synthetic documents
(half curated-looking `wiki`, half `web`, about 3.6 KB each, 5,000 to a file) and runs
`train_and_publish` in a fresh process per size; that process reports its own peak RSS
(`ru_maxrss`) and wall time. `--config PATH` trains on an existing data root instead (the bundled
sample after `deduped`) and also scores the held-out documents for accuracy and AUC.

The training code is whichever `refinery` comes first on the path, so the code before a change is
measured by running this file with `PYTHONPATH=<old tree>:<repo>`:

    python bench/quality_memory.py --docs 10000 20000 40000
    python bench/quality_memory.py --config /path/to/demo.yaml
"""

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

CURATED = ("the river valley was settled by farmers who built stone houses and kept records of harvests weather "
           "trade council history letters parish families generations archive museum chapter volume author study "
           "period century region population government language tradition").split()
WEB = ("click here buy now cheap deals free shipping best price casino bonus win money online today limited offer "
       "subscribe hot sale discount code login account password download app review rating").split()
SHARED = "the of and to in a is that for it as was with be by on not this are or from at which".split()
DOCS_PER_FILE = 5000


def synthetic_texts(n: int, vocab: list[str], rng: random.Random) -> list[str]:
    """About 3.6 KB each: 60% of words from the class vocabulary, the rest shared or from the other."""
    mixed = CURATED + WEB
    texts = []
    for _ in range(n):
        words, size = [], 0
        while size < 3600:
            r = rng.random()
            word = rng.choice(vocab) if r < 0.6 else rng.choice(SHARED) if r < 0.9 else rng.choice(mixed)
            words.append(word)
            size += len(word) + 1
        texts.append(" ".join(words))
    return texts


def build_root(workdir: Path, docs: int) -> Path:
    """A config and a data root whose `deduped` tables hold `docs` documents; returns the config path."""
    import polars as pl

    from refinery.config import load_config
    from refinery.documents import input_shards
    from refinery.stages.attributes import write_stage_documents
    from refinery.storage import LocalDataRoot

    per_class = docs // 2
    files = max(1, -(-per_class // DOCS_PER_FILE))
    for bucket in ("web", "wiki"):
        (workdir / "in" / bucket).mkdir(parents=True, exist_ok=True)
        for f in range(files):
            (workdir / "in" / bucket / f"{f:04d}.jsonl").write_text("")
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "seed": 1, "data_root": "out", "buckets": ["web", "wiki"],
        "sources": [{"name": b, "path": f"in/{b}/*.jsonl", "format": "jsonl", "bucket": b} for b in ("web", "wiki")],
        "stages": {"quality": {"positive_buckets": ["wiki"], "negative_buckets": ["web"]}},
    }))
    cfg = load_config(str(cfg_path))
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    rng = random.Random(0)
    for shard in input_shards(cfg):
        n = min(DOCS_PER_FILE, per_class - int(Path(shard.path).stem) * DOCS_PER_FILE)
        texts = synthetic_texts(n, CURATED if shard.bucket == "wiki" else WEB, rng)
        write_stage_documents(root, "deduped", shard.key, pl.DataFrame({
            "doc_id": [f"{shard.key}/{i:07d}" for i in range(n)], "bucket": [shard.bucket] * n, "text": texts}))
    return cfg_path


def holdout_accuracy_auc(cfg, root, model) -> dict:
    """Accuracy at 0.5 and ROC AUC on the held-out documents (the same split the trainer makes)."""
    import numpy as np
    import polars as pl

    from refinery.documents import input_shards
    from refinery.models import quality_fit as qfit
    from refinery.stages.attributes import read_stage_documents

    qc = cfg.stages.quality
    wanted = set(qc.positive_buckets) | set(qc.negative_buckets)
    docs = pl.concat([read_stage_documents(root, "deduped", s.key).select("doc_id", "bucket", "text")
                      for s in input_shards(cfg) if s.bucket in wanted])
    chosen = qfit.training_set(qfit.text_index(docs), list(qc.positive_buckets), list(qc.negative_buckets),
                               qc.max_train_docs_per_class, cfg.seed)
    labels = chosen["label"].to_numpy().astype(np.int64)
    held = chosen.filter(pl.Series(qfit.split_holdout(labels, chosen["_key"].to_numpy(), qc.holdout_fraction)))
    held = held.join(docs.select("doc_id", "text"), on="doc_id", how="left", maintain_order="left")
    truth = held["label"].to_numpy() == 1
    scores = model.score(held["text"])
    # AUC as the Mann-Whitney statistic: ties count one half.
    ranks = pl.Series(scores).rank("average").to_numpy()
    n_pos, n_neg = int(truth.sum()), int((~truth).sum())
    auc = (ranks[truth].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {"holdout_docs": len(truth), "accuracy": round(float(np.mean((scores >= 0.5) == truth)), 4),
            "auc": round(float(auc), 4)}


def train_once(config_path: str, evaluate: bool) -> dict:
    """Run in the measuring process: train and publish, then report this process's peak RSS."""
    from refinery.config import load_config
    from refinery.models import quality_training as qt
    from refinery.models.quality_training import train_and_publish
    from refinery.storage import LocalDataRoot

    cfg = load_config(config_path)
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    import torch  # noqa: F401  (imported before the baseline, as the trainer imports it)

    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    pointer, report = train_and_publish(cfg, root)
    out = {"train_s": round(time.perf_counter() - start, 2),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "rss_after_imports_mb": round(base_mb), "sha256": pointer["sha256"][:16],
           "report_accuracy": report.accuracy, "train_docs": report.train_positive + report.train_negative}
    if evaluate:
        out.update(holdout_accuracy_auc(cfg, root, qt.load_published_model(root)[0]))
    return out


def measure(config_path: Path, evaluate: bool) -> dict:
    cmd = [sys.executable, __file__, "--train-once", str(config_path)] + (["--evaluate"] if evaluate else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs="*", default=[])
    parser.add_argument("--config", help="train on this config's data root (its deduped tables) and evaluate")
    parser.add_argument("--train-once", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_once:
        print(json.dumps(train_once(args.train_once, args.evaluate)))
        return
    if args.config:
        print(json.dumps({"config": args.config, **measure(Path(args.config), evaluate=True)}), flush=True)
    for n in args.docs:
        with tempfile.TemporaryDirectory() as tmp:
            config_path = build_root(Path(tmp), n)
            print(json.dumps({"docs": n, **measure(config_path, evaluate=False)}), flush=True)


if __name__ == "__main__":
    main()
