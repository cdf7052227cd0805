"""The trainer at corpus scale: start-up time, memory and handles of a rank, of two ranks on one
node and of a loader worker, and resume time, at 1M, 10M and 100M entries (issue 23).

    python bench/trainer_scale.py [--sizes 1M,10M,100M] [--repeats 3] [--resume-steps 64]
                                  [--measure fresh,resume,two_ranks,worker] [--out FILE.json]

Corpus, one per size, written once under `--workdir` in a folder named for its entry count and
reused: final shards in the project's format (refinery/shard_format.py), two buckets ("web" 80% of
the entries, "books" 20%), entries of 64-512 tokens (uniform, seeded; 288 on average), uint16,
shards closed at 4M tokens (`shards.shard_tokens`' default), one document per entry. Written in
bulk: the `.idx` from numpy arrays, the `.entries.parquet` from one polars frame, and the `.bin` as
a sparse file of the right size (zeros: what is measured is opening and memory, not content; 100M
entries is 58 GB apparent, almost nothing on disk). Two phase manifests with every file's sha256:
"main" (80% of the corpus's tokens, web 0.8 / books 0.2) and "anneal" (10%, web 0.7 / books 0.3),
whose web slice is a quality selection of about 30% of web's entries; and a config naming them,
global batch 8 rows of 2,048 tokens, a one-layer model. The build checks its output with the
project's readers (shard indexes, shard readers, manifests, the selection, `refuse_mismatch`).

Measured, each child a fresh `python bench/trainer_scale.py --child ...`, `--repeats` times,
medians reported:
- imports: the trainer's data stack (refinery.config, refinery.storage, training.data,
  training.batches) imported in a process that does nothing else; its anonymous memory and PSS
  then are what every rank holds before opening anything (mostly torch's).
- fresh: open-to-first-step, from after the imports to the first batch in hand (config load,
  `CurriculumData.open`, `TrainBatches`, the first `next`), one rank of world 1, num_workers=0.
  After the first batch the child waits while this process reads its RssAnon, VmHWM (peak RSS),
  open files and memory maps from /proc/<pid>/, and its PSS from /proc/<pid>/smaps_rollup. Then
  it trains on to `--resume-steps` committed steps and saves the sampler state (JSON). PSS is
  also given for the `.bin` maps alone: the pages of gathered entries and those the kernel maps
  around each on a fault, page cache that the rank maps but the tables are not in.
- resume: open + `load_state_dict(state)` + first batch, against fresh.
- two ranks: two children started together, world 2, ranks 0 and 1, num_workers=0; the sum of
  their PSS, read while both hold their first batch, against the fresh rank's PSS.
- worker: one rank with num_workers=1; the PSS of its loader worker (the descendant process that
  runs the rank's own command line) and of the rank beside it.

Targets (issue 23): anonymous memory per rank from the smallest to the largest size (1M to 100M)
grows less than 1.5x; open-to-first-step under 5 s at 100M; two ranks' PSS under 1.2x one rank's;
resume no slower than a fresh start. Every use of the trainer's API is in `open_first_batch`.

This module imports only the standard library at the top, so that a child times the trainer's
imports from a bare interpreter.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from bench.proc_readings import descendants, proc_memory  # noqa: E402

SHARD_TOKENS = 4_000_000
ENTRY_TOKENS = (64, 512)  # inclusive
BUCKET_SHARES = {"web": 0.8, "books": 0.2}
SELECTED = ("anneal", "web", 0.3)  # phase, bucket, kept fraction of the bucket's entries
SEQ_LEN = 2048
MICRO_BATCH, GRAD_ACCUM = 4, 2  # global batch 8 rows: 4 per rank at world 2
MEASURES = ("fresh", "resume", "two_ranks", "worker")
MIB = 1 << 20


# --- the corpus -----------------------------------------------------------------------------------

def parse_size(text: str) -> int:
    scale = {"k": 1_000, "M": 1_000_000, "B": 1_000_000_000}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def shard_lengths(rng, entries: int):
    """Per shard, its entries' token counts: entries are drawn in blocks and a shard closes at the
    first entry that brings it to SHARD_TOKENS tokens (the last shard takes the rest)."""
    import numpy as np

    pending, drawn = np.zeros(0, dtype=np.int64), 0
    while drawn < entries or len(pending):
        if drawn < entries and pending.sum() < SHARD_TOKENS:
            block = min(entries - drawn, 1 << 16)
            drawn_lengths = rng.integers(ENTRY_TOKENS[0], ENTRY_TOKENS[1] + 1, block, dtype=np.int64)
            pending = np.concatenate([pending, drawn_lengths])
            drawn += block
            continue
        cut = int(np.searchsorted(np.cumsum(pending), SHARD_TOKENS)) + 1
        yield pending[:cut]
        pending = pending[cut:]


def write_shard(prefix: Path, bucket: str, first_entry: int, lengths) -> None:
    """One final shard from its entries' lengths: zero tokens in a sparse `.bin`, the `.idx` from
    the offsets, one document per entry in the `.entries.parquet`; the `.idx` last, as ShardWriter
    publishes it."""
    import numpy as np
    import polars as pl

    from refinery import shard_format as sf
    from refinery.storage import atomic_path, write_parquet_file

    files = sf.shard_files(prefix)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    with atomic_path(files[".bin"]) as tmp:
        os.truncate(tmp, int(offsets[-1]) * np.dtype(np.uint16).itemsize)
    ids = pl.int_range(first_entry, first_entry + len(lengths), eager=True, dtype=pl.Int64)
    entries = pl.DataFrame({"doc_id": f"{bucket}-" + ids.cast(pl.String).str.zfill(9),
                            "window": pl.zeros(len(lengths), pl.Int32, eager=True),
                            "n_windows": pl.ones(len(lengths), pl.Int32, eager=True)}, schema=sf.ENTRIES_SCHEMA)
    with atomic_path(files[".entries.parquet"]) as tmp:
        write_parquet_file(entries, tmp)
    with atomic_path(files[".idx"]) as tmp:
        with open(tmp, "wb") as f:
            f.write(sf.HEADER.pack(sf.MAGIC, sf.VERSION, sf.DTYPE_CODES[np.dtype(np.uint16)], len(lengths)))
            f.write(offsets.tobytes())
            f.write(np.zeros(len(lengths), dtype=sf.OVERLAP_DTYPE).tobytes())


def write_bucket(root, shape: Path, bucket: str, entries: int, seed: int, select: float | None):
    """The bucket's shards (those whose `.idx` exists are kept), their ShardRefs with sha256 (cached
    in `shape/hashes-<bucket>.json`), and, with `select`, the sorted ids of a seeded `select`
    fraction of its entries and their token total."""
    import numpy as np

    from refinery.curriculum import ShardRef
    from refinery.layout import shard_key
    from refinery.shard_format import shard_hashes

    rng, pick = np.random.default_rng([seed, len(bucket)]), np.random.default_rng([seed, len(bucket), 1])
    cache = shape / f"hashes-{bucket}.json"
    hashes = json.loads(cache.read_text()) if cache.exists() else {}
    refs, kept, kept_tokens, first = [], [], 0, 0
    for number, lengths in enumerate(shard_lengths(rng, entries)):
        key = shard_key("final", bucket, number)
        if not (root.root / (key + ".idx")).exists():
            write_shard(root.root / key, bucket, first, lengths)
        if key not in hashes:
            hashes[key] = shard_hashes(root.root / key)
        refs.append(ShardRef(key, int(lengths.sum()), len(lengths), hashes[key]))
        if select is not None:
            chosen = np.flatnonzero(pick.random(len(lengths)) < select)
            kept.append(first + chosen)
            kept_tokens += int(lengths[chosen].sum())
        first += len(lengths)
        if number % 500 == 499:
            print(f"  {bucket}: {number + 1} shards, {first:,} entries", flush=True)
    cache.write_text(json.dumps(hashes))
    ids = np.concatenate(kept).astype(np.int64) if select is not None else None
    return refs, ids, kept_tokens


def check_corpus(root, cfg) -> None:
    """Read back what was written with the project's own readers: the first and last shard of
    each bucket, every manifest, the selection, and the config against the manifests."""
    from refinery.curriculum import read_manifest, read_selection
    from refinery.curriculum.manifests import refuse_mismatch
    from refinery.shard_format import ShardReader

    manifests = [read_manifest(root, p.name) for p in cfg.curriculum.phases]
    for name, bslice in manifests[-1].buckets.items():
        for ref in (bslice.shards[0], bslice.shards[-1]):
            reader = ShardReader(root.root / ref.prefix)
            if (len(reader), reader.num_tokens, reader.entries.height) != (ref.entries, ref.tokens, ref.entries):
                raise RuntimeError(f"{ref.prefix}: read back {len(reader)} entries, {reader.num_tokens} tokens")
        selection = read_selection(root, bslice)
        if selection is not None and len(selection) != bslice.entries:
            raise RuntimeError(f"{bslice.selection}: {len(selection)} ids, the manifest says {bslice.entries}")
    refuse_mismatch(cfg, root)


def build_corpus(workdir: Path, entries: int, seed: int) -> Path:
    """The config of the corpus of `entries` entries, written under `workdir/entries<N>` unless it
    is there (the config is written last: a build cut short leaves none)."""
    shape = workdir / f"entries{entries}-seed{seed}"
    config = shape / "trainer.yaml"
    if config.exists():
        return config
    from refinery.config import load_config
    from refinery.curriculum import BucketSlice, PhaseManifest, write_manifest
    from refinery.curriculum.manifests import selection_npy
    from refinery.layout import selection_key
    from refinery.storage import LocalDataRoot
    from synthetic.curriculum import SyntheticBucket, SyntheticPhase, synthetic_config

    t0 = time.perf_counter()
    root = LocalDataRoot(shape / "root")
    sel_phase, sel_bucket, sel_fraction = SELECTED
    counts = {"web": int(entries * BUCKET_SHARES["web"])}
    counts["books"] = entries - counts["web"]
    written = {b: write_bucket(root, shape, b, n, seed, sel_fraction if b == sel_bucket else None)
               for b, n in counts.items()}
    total = sum(r.tokens for refs, _, _ in written.values() for r in refs)
    # Two passes allowed per bucket: the anneal's books rows continue where main's stopped.
    buckets = {b: SyntheticBucket(docs=n, mean_len=sum(ENTRY_TOKENS) // 2, max_epochs=2.0) for b, n in counts.items()}
    phases = [SyntheticPhase("main", int(0.8 * total), {"web": 0.8, "books": 0.2}, seq_len=SEQ_LEN),
              SyntheticPhase(sel_phase, int(0.1 * total), {"web": 0.7, "books": 0.3}, seq_len=SEQ_LEN, lr_scale=0.5)]
    training = {"micro_batch_size": MICRO_BATCH, "grad_accum_steps": GRAD_ACCUM,
                "model": {"n_layer": 1, "n_head": 2, "n_embd": 32}}
    draft = synthetic_config(shape / "trainer.tmp.yaml", root.root, buckets, phases, training, seed=seed)
    cfg = load_config(draft)
    for index, phase in enumerate(phases):
        slices = {}
        for b, (refs, ids, kept_tokens) in written.items():
            full = (sum(r.tokens for r in refs), sum(r.entries for r in refs))
            if phase.name == sel_phase and ids is not None:
                key = selection_key(phase.name, b)
                digest = root.write_bytes(key, selection_npy(ids))
                slices[b] = BucketSlice(b, refs, kept_tokens, len(ids), 2.0, key, digest)
            else:
                slices[b] = BucketSlice(b, refs, *full, 2.0)
        write_manifest(root, PhaseManifest(
            phase=phase.name, index=index, token_budget=phase.tokens, seq_len=phase.seq_len, lr_scale=phase.lr_scale,
            weights=phase.weights, interpolation=phase.interpolation, buckets=slices,
            validation={"ok": True, "errors": [], "warnings": []}, config_fingerprint=cfg.fingerprint()))
    check_corpus(root, cfg)
    draft.rename(config)
    print(f"built {shape}: {entries:,} entries, {total:,} tokens in {time.perf_counter() - t0:.0f} s", flush=True)
    return config


def corpus_shape(config: Path) -> dict[str, int]:
    from refinery.config import load_config
    from refinery.curriculum import read_manifest
    from refinery.storage import LocalDataRoot

    cfg = load_config(config)
    main = read_manifest(LocalDataRoot(cfg.resolve(cfg.data_root)), cfg.curriculum.phases[0].name)
    return {"entries": sum(bs.total_entries for bs in main.buckets.values()),
            "tokens": sum(r.tokens for bs in main.buckets.values() for r in bs.shards),
            "shards": sum(len(bs.shards) for bs in main.buckets.values())}


# --- the children -----------------------------------------------------------------------------------

def open_first_batch(cfg, root, rank: int, world: int, workers: int, state: dict | None, commit_steps: int,
                     at_first_batch: Callable[[], None]) -> tuple[dict[str, float], dict | None]:
    """Every use of the trainer's data API in this bench: open the curriculum as `refinery train`
    does, resume from `state` if given, take the first batch, call `at_first_batch`, then commit
    `commit_steps` steps. Returns the times passed (perf_counter) and the sampler state after the
    commits (None without)."""
    from training.batches import TrainBatches
    from training.data import CurriculumData

    tc = cfg.training
    marks = {"start": time.perf_counter()}
    data = CurriculumData.open(cfg, root, tc.micro_batch_size * tc.grad_accum_steps)
    marks["opened"] = time.perf_counter()
    batches = TrainBatches(data, cfg.curriculum.allow_bucket_exhaustion, False, workers, [rank], world)
    if state is not None:
        batches.load_state_dict(state)
    steps = iter(batches)
    batch = next(steps)
    marks["first_batch"] = time.perf_counter()
    if not hasattr(batch, "tokens"):
        raise RuntimeError(f"the first step found the corpus exhausted: {batch}")
    at_first_batch()
    for done in range(commit_steps):
        batches.commit(batch)
        if done + 1 < commit_steps:
            batch = next(steps)
    return marks, batches.state_dict() if commit_steps else None


def child(spec: dict[str, Any]) -> None:
    """One measured process: imports, then (unless imports only) the first batch; prints one JSON
    line when it holds the first batch, waits for a line on stdin, and saves the state if asked."""
    t0 = time.perf_counter()
    from refinery.config import load_config
    from refinery.storage import LocalDataRoot
    import training.batches  # noqa: F401
    import training.data  # noqa: F401

    imported = time.perf_counter()
    if spec["mode"] == "imports":  # waits to be measured: the memory every rank holds before opening
        print(json.dumps({"imports_s": imported - t0}), flush=True)
        sys.stdin.readline()
        print("{}")
        return
    cfg = load_config(spec["config"])
    root = LocalDataRoot(cfg.resolve(cfg.data_root))
    state = json.loads(Path(spec["state_in"]).read_text()) if spec.get("state_in") else None
    configured = time.perf_counter()

    def report() -> None:
        print(json.dumps({"imports_s": imported - t0, "config_s": configured - imported}), flush=True)
        sys.stdin.readline()

    marks, saved = open_first_batch(cfg, root, spec["rank"], spec["world"], spec["workers"], state,
                                    spec.get("commit_steps", 0), report)
    if saved is not None:
        Path(spec["state_out"]).write_text(json.dumps(saved))
    print(json.dumps({"open_s": marks["opened"] - marks["start"],
                      "to_first_step_s": marks["first_batch"] - imported,
                      "first_batch_after_open_s": marks["first_batch"] - marks["opened"]}), flush=True)


# --- measuring them -----------------------------------------------------------------------------------

class Child:
    """A `--child` process; its stderr goes to a file beside the corpus, shown if it fails."""

    def __init__(self, spec: dict[str, Any], log: Path):
        self.log = log
        self.err = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)

    def line(self) -> dict[str, Any]:
        text = self.proc.stdout.readline()
        if not text:
            self.proc.wait()
            raise RuntimeError(f"child failed (exit {self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
        return json.loads(text)

    def finish(self) -> dict[str, Any]:
        """Release it (it was waiting at its first batch) and take its last line."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        out = self.line()
        self.proc.wait()
        self.err.close()
        return out


def measure_ranks(specs: list[dict[str, Any]], log: Path, settle_s: float) -> list[dict[str, Any]]:
    """Start the children together; once every one holds its first batch (and `settle_s` later),
    read the memory of each and of its loader workers, then release them."""
    children = [Child(s, log.with_suffix(f".rank{s['rank']}.log")) for s in specs]
    firsts = [c.line() for c in children]
    time.sleep(settle_s)
    runs = []
    for c, first in zip(children, firsts):
        cmdline = Path(f"/proc/{c.proc.pid}/cmdline").read_bytes()
        workers = [p for p in descendants(c.proc.pid) if Path(f"/proc/{p}/cmdline").read_bytes() == cmdline]
        runs.append({**first, "rank": proc_memory(c.proc.pid), "workers": [proc_memory(p) for p in workers]})
    for c, run in zip(children, runs):
        run.update(c.finish())
    return runs


def median(runs: list[dict[str, Any]], get: Callable[[dict[str, Any]], float]) -> float:
    return statistics.median(get(r) for r in runs)


def measure_size(config: Path, measures: set[str], repeats: int, commit_steps: int, settle_s: float) -> dict[str, Any]:
    logs, state = config.parent / "logs", config.parent / "sampler-state.json"
    logs.mkdir(exist_ok=True)
    base = {"mode": "open", "config": str(config), "rank": 0, "world": 1, "workers": 0}
    runs: dict[str, list] = {"imports": []}
    for r in range(repeats):
        runs["imports"].append(measure_ranks([{"mode": "imports", "rank": 0}], logs / "imports", settle_s)[0])
        if measures & {"fresh", "resume"}:
            spec = {**base, "commit_steps": commit_steps if r == 0 else 0, "state_out": str(state)}
            runs.setdefault("fresh", []).append(measure_ranks([spec], logs / "fresh", settle_s)[0])
        if "resume" in measures:
            resumed = {**base, "state_in": str(state)}
            runs.setdefault("resume", []).append(measure_ranks([resumed], logs / "resume", settle_s)[0])
        if "two_ranks" in measures:
            runs.setdefault("two_ranks", []).append(
                measure_ranks([{**base, "world": 2, "rank": k} for k in (0, 1)], logs / "two", settle_s))
        if "worker" in measures:
            with_worker = {**base, "workers": 1}
            runs.setdefault("worker", []).append(measure_ranks([with_worker], logs / "worker", settle_s)[0])
    return runs


def summarize(shape: dict[str, int], runs: dict[str, list]) -> dict[str, Any]:
    s: dict[str, Any] = {**shape, "imports_s": median(runs["imports"], lambda r: r["imports_s"]),
                         "imports_anon_mib": median(runs["imports"], lambda r: r["rank"]["RssAnon"]),
                         "imports_pss_mib": median(runs["imports"], lambda r: r["rank"]["Pss"])}
    if "fresh" in runs:
        f = runs["fresh"]
        s |= {"to_first_step_s": median(f, lambda r: r["to_first_step_s"]), "open_s": median(f, lambda r: r["open_s"])}
        for name, key in (("anon_mib", "RssAnon"), ("pss_mib", "Pss"), ("bin_pss_mib", "Pss_bin"),
                          ("peak_rss_mib", "VmHWM"), ("fds", "fds"), ("maps", "maps")):
            s[f"rank_{name}"] = median(f, lambda r: r["rank"][key])
    if "resume" in runs:
        s["resume_to_first_step_s"] = median(runs["resume"], lambda r: r["to_first_step_s"])
        s["resume_vs_fresh"] = s["resume_to_first_step_s"] / s["to_first_step_s"]
    if "two_ranks" in runs:
        pair = runs["two_ranks"]
        s["two_ranks_pss_mib"] = median(pair, lambda p: sum(r["rank"]["Pss"] for r in p))
        s["two_ranks_bin_pss_mib"] = median(pair, lambda p: sum(r["rank"]["Pss_bin"] for r in p))
        s["two_ranks_anon_mib"] = median(pair, lambda p: sum(r["rank"]["RssAnon"] for r in p))
        s["two_ranks_to_first_step_s"] = median(pair, lambda p: max(r["to_first_step_s"] for r in p))
        if "rank_pss_mib" in s:
            s["two_ranks_vs_one"] = s["two_ranks_pss_mib"] / s["rank_pss_mib"]
    if "worker" in runs:
        w = [r for r in runs["worker"] if r["workers"]]
        if len(w) < len(runs["worker"]):
            print(f"  warning: {len(runs['worker']) - len(w)} worker run(s) had no live worker when measured")
        if w:
            s["worker_pss_mib"] = median(w, lambda r: r["workers"][0]["Pss"])
            s["worker_anon_mib"] = median(w, lambda r: r["workers"][0]["RssAnon"])
            s["worker_rank_pss_mib"] = median(w, lambda r: r["rank"]["Pss"])
    return s


COLUMNS = [  # (summary key, header, format)
    ("entries", "entries", "{:,}"), ("tokens", "tokens", "{:,}"), ("shards", "shards", "{:,}"),
    ("imports_s", "imports (s)", "{:.2f}"), ("imports_anon_mib", "anon after imports (MiB)", "{:,.0f}"),
    ("to_first_step_s", "open to first step (s)", "{:.2f}"),
    ("open_s", "of which open (s)", "{:.2f}"), ("resume_to_first_step_s", "resume (s)", "{:.2f}"),
    ("resume_vs_fresh", "resume / fresh", "{:.2f}x"), ("rank_anon_mib", "rank anon (MiB)", "{:,.0f}"),
    ("rank_pss_mib", "rank PSS (MiB)", "{:,.0f}"), ("rank_bin_pss_mib", "of which .bin maps (MiB)", "{:,.0f}"), ("rank_peak_rss_mib", "rank peak RSS (MiB)", "{:,.0f}"),
    ("rank_fds", "rank fds", "{:,.0f}"), ("rank_maps", "rank maps", "{:,.0f}"),
    ("two_ranks_pss_mib", "2 ranks PSS (MiB)", "{:,.0f}"), ("two_ranks_bin_pss_mib", "of which .bin (MiB)", "{:,.0f}"), ("two_ranks_vs_one", "2 ranks / 1", "{:.2f}x"),
    ("worker_pss_mib", "worker PSS (MiB)", "{:,.0f}"), ("worker_rank_pss_mib", "its rank's PSS (MiB)", "{:,.0f}"),
]


def table(summaries: list[dict[str, Any]]) -> str:
    cols = [c for c in COLUMNS if any(c[0] in s for s in summaries)]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "| " + " | ".join("---:" for _ in cols) + " |"]
    for s in summaries:
        lines.append("| " + " | ".join(fmt.format(s[k]) if k in s else "-" for k, _, fmt in cols) + " |")
    return "\n".join(lines)


def targets(summaries: list[dict[str, Any]]) -> list[str]:
    small, large = summaries[0], summaries[-1]
    out = []
    if "rank_anon_mib" in large and len(summaries) > 1:
        g = large["rank_anon_mib"] / small["rank_anon_mib"]
        out.append(f"anon memory per rank {large['entries']:,} / {small['entries']:,} entries: {g:.2f}x "
                   f"(target < 1.5x from 1M to 100M): {'met' if g < 1.5 else 'NOT met'}")
    if "to_first_step_s" in large:
        t = large["to_first_step_s"]
        out.append(f"open to first step at {large['entries']:,} entries: {t:.2f} s beyond imports "
                   f"(target < 5 s at 100M): {'met' if t < 5 else 'NOT met'}")
    for s in summaries:
        if "two_ranks_vs_one" in s:
            ratio = s["two_ranks_vs_one"]
            out.append(f"two ranks' PSS / one rank's at {s['entries']:,}: {ratio:.2f}x (target < 1.2x): "
                       f"{'met' if ratio < 1.2 else 'NOT met'}")
        if "resume_vs_fresh" in s:
            out.append(f"resume / fresh at {s['entries']:,}: {s['resume_vs_fresh']:.2f}x (target <= 1): "
                       f"{'met' if s['resume_vs_fresh'] <= 1 else 'NOT met'}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1M,10M,100M", help="entry counts, e.g. 1M,10M,100M or 200k")
    ap.add_argument("--workdir", default="/tmp/refinery-bench-trainer-scale")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--resume-steps", type=int, default=64, help="steps the fresh run commits before saving state")
    ap.add_argument("--measure", default=",".join(MEASURES), help=f"a subset of {','.join(MEASURES)}")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds between the first batch and reading memory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build-only", action="store_true", help="write the corpora and stop")
    ap.add_argument("--out", help="write the runs and the summary as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    measures = set(args.measure.split(","))
    if measures - set(MEASURES):
        raise SystemExit(f"--measure: unknown {sorted(measures - set(MEASURES))}; choose from {MEASURES}")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    summaries, raw = [], {}
    for size in args.sizes.split(","):
        config = build_corpus(workdir, parse_size(size), args.seed)
        if args.build_only:
            continue
        t0 = time.perf_counter()
        runs = measure_size(config, measures, args.repeats, args.resume_steps, args.settle)
        summaries.append(summarize(corpus_shape(config), runs))
        raw[size] = runs
        print(f"{size}: measured in {time.perf_counter() - t0:.0f} s", flush=True)
    if not summaries:
        return
    print(f"\n{args.repeats} repeats, medians; load average {os.getloadavg()[0]:.1f}\n")
    print(table(summaries))
    print()
    print("\n".join(targets(summaries)))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summaries, "runs": raw,
                                              "targets": targets(summaries)}, indent=1))


if __name__ == "__main__":
    main()
