"""Trainer data loading: tokens/s of the curriculum sampler behind the trainer's loader
(`make_loader`), against a bare memmap gather of the same windows, in the same run.

    python bench/loader.py [--steps 8000] [--seq-len 4096] [--batch 8] [--repeats 7] [--bands N]

A synthetic curriculum (two buckets of 72M and 24M tokens in documents of 800 tokens on average, uint16 shards,
one phase at `--seq-len`, repeating a bucket when the run reads past its end; with `--bands N`
the phase serves each bucket in N difficulty bands, easy first, over seeded per-document scores) is written under
`--workdir`, in a folder named for the run's shape. Then, each a median of `--repeats`:

- bare gather: the windows every row of every step reads, as (shard array, start, end) computed
  beforehand, copied out of the memory-mapped shards with one `np.concatenate` per step; no
  planning, no masks, no tensors. The upper bound a loader can reach.
- ours, num_workers=0 and 2: `StepStream` behind `make_loader`, the trainer's own path: planning
  steps in bulk, gathering their rows, building each step's `RowLayout` (where entries start, which
  targets are skipped; the trainer expands it into doc ids and a target mask on its device), handing
  torch tensors over through the prefetch thread. "steady" is the rate once every gather buffer
  has been filled once (`ring_chunks` chunks per producer), scaled to the same step count: what a
  long run reads at. "whole run" counts from creating the loader, its one-off start included
  (forking workers, first touches of the reused gather buffers, nothing yet to overlap); "first
  batch" is that start alone. The default run is 8000 steps, 0.3-0.5 s of bare copying here: at
  2000 steps (0.1 s) the start, about 40 ms with two workers, weighs as much as half the copying.

- litdata (`--peers-python`, an interpreter with litdata installed, outside .venv): the same
  tokens, the same shards' `.bin` files concatenated, written by `litdata.optimize` with its
  `TokensLoader`, read by `StreamingDataset` + `StreamingDataLoader` in windows of `--seq-len`,
  batch `--batch`, shuffled, workers 0 and 2. MosaicML streaming is not run: its package imports
  torchvision, whose wheel does not load against the pinned CPU torch here.

The shards are read once before timing, so every reader works from the page cache. Each run of ours
is paired with a bare gather just before it; "vs bare" is the median of the pairs' ratios, tokens/s
the median of the times. Target: ours at least 0.5x the bare gather, steady and over the whole run.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from refinery.config import load_config  # noqa: E402
from refinery.storage import LocalDataRoot  # noqa: E402
from training.data import CurriculumData  # noqa: E402
from training.loader import CHUNK_TOKENS, StepStream, make_loader, ring_chunks  # noqa: E402
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, synthetic_config, write_synthetic_curriculum  # noqa: E402


LITDATA_SCRIPT = textwrap.dedent(
    """
    import glob, json, statistics, sys, time
    import numpy as np, torch
    from litdata import StreamingDataLoader, StreamingDataset, optimize
    from litdata.streaming.item_loader import TokensLoader

    shards, out, seq_len, batch, steps, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    tokens = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted(glob.glob(f"{shards}/*/*.bin"))])
    chunk = seq_len * 1024

    def pieces(i):
        yield torch.from_numpy(tokens[i * chunk:(i + 1) * chunk].astype(np.int32))

    if __name__ == "__main__":
        optimize(fn=pieces, inputs=list(range(len(tokens) // chunk)), output_dir=out, chunk_size=chunk,
                 item_loader=TokensLoader(), num_workers=1, mode="overwrite")
        result = {}
        for workers in (0, 2):
            times = []
            for _ in range(repeats):
                ds = StreamingDataset(out, item_loader=TokensLoader(block_size=seq_len), shuffle=True, drop_last=True, seed=1)
                loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
                start, read = time.perf_counter(), 0
                while read < steps:  # passes over the dataset until `steps`, as the corpus repeats buckets
                    for b in loader:
                        read += 1
                        if read == steps:
                            break
                times.append(time.perf_counter() - start)
            result[f"litdata, num_workers={workers}"] = statistics.median(times)
        print(json.dumps(result))
    """
)


def litdata_times(python: str, shard_dir: Path, workdir: Path, seq_len: int, batch: int, steps: int, repeats: int) -> dict[str, float]:
    script = workdir / "litdata_loader.py"
    script.write_text(LITDATA_SCRIPT)
    proc = subprocess.run([python, str(script), str(shard_dir), str(workdir / "litdata"), str(seq_len), str(batch),
                           str(steps), str(repeats)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"litdata run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build_corpus(workdir: Path, seq_len: int, batch: int, steps: int, bands: int = 0) -> Path:
    """The folder holding `loader.yaml` and `root/`: the corpus and its one-phase curriculum, under a
    folder named for the run's shape (a corpus written for fewer steps would end the phase early).
    Buckets a long run reads past their end are repeated (`max_epochs`), as a curriculum repeats a
    small bucket."""
    phase_tokens = steps * batch * seq_len
    shares = {"web": 0.7, "code": 0.3}
    buckets = {"web": SyntheticBucket(90_000, 800, shards=8), "code": SyntheticBucket(30_000, 800, shards=4)}
    for name, b in buckets.items():  # 10% headroom: allocation holds shares to within a row, not exactly
        b.max_epochs = float(max(1, math.ceil(1.1 * shares[name] * phase_tokens / (b.docs * b.mean_len))))
    order = {"by": "difficulty", "direction": "easy_first", "bands": bands} if bands else None
    phases = [SyntheticPhase("main", phase_tokens, shares, seq_len=seq_len, order=order)]
    shape = workdir / (f"steps{steps}-batch{batch}-seq{seq_len}" + (f"-bands{bands}" if bands else ""))
    config = shape / "loader.yaml"
    if not config.exists():
        write_synthetic_curriculum(shape / "root", buckets, phases, vocab=32_000, window=seq_len, overlap=0)
        synthetic_config(shape / "loader.tmp.yaml", shape / "root", buckets, phases,
                         {"micro_batch_size": batch, "grad_accum_steps": 1})
        (shape / "loader.tmp.yaml").rename(config)  # last: a run cut short leaves no config behind
    return shape


def planned_windows(data: CurriculumData, steps: int) -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: the token maps of the shards it reads, and which of them, start and end every piece
    of every row reads."""
    sampler, out = data.sampler(False), []
    rows = slice(0, data.schedule.global_batch)
    for _ in range(steps):
        plan = sampler.plan_next()
        p = plan.pieces(rows)
        flat = np.empty(len(p.entry), np.int64)
        maps: dict[tuple[str, int], int] = {}
        arrays: list[np.ndarray] = []
        for si, es in enumerate(plan.sets):
            m = p.set_index == si
            for s in np.unique(p.shard[m]).tolist():
                if (es.bucket, s) not in maps:
                    maps[(es.bucket, s)] = len(arrays)
                    arrays.append(data.buckets[es.bucket].reader(s).tokens)
            flat[m] = [maps[(es.bucket, s)] for s in p.shard[m].tolist()]
        out.append((arrays, flat, p.start + p.a, p.start + p.b))
    return out


def bare_gather(data: CurriculumData, windows, tokens_per_step: int) -> float:
    out = np.empty(tokens_per_step, dtype=np.int32)
    start = time.perf_counter()
    for arrays, flat, lo, hi in windows:
        np.concatenate([arrays[i][s:t] for i, s, t in zip(flat.tolist(), lo.tolist(), hi.tolist())], out=out,
                       casting="same_kind")
    return time.perf_counter() - start


def ours(data: CurriculumData, steps: int, workers: int) -> tuple[float, float, float]:
    """Seconds (from creating the loader to the first batch; for all `steps` from creating the
    loader; for the same number of steps at the rate after warm-up, once every gather buffer of the
    ring has been filled, `ring_chunks` chunks per producer: the pipeline a long run reads from)."""
    start = time.perf_counter()
    loader = make_loader(StepStream(data, None, False, 0, 1), workers)
    first_at, warm_at = None, None
    steps_per_chunk = max(1, CHUNK_TOKENS // data.schedule.global_batch // data.schedule.seq_len_at(0))
    warm_steps = ring_chunks(workers) * max(workers, 1) * steps_per_chunk
    if warm_steps >= steps:
        raise SystemExit(f"--steps {steps} ends before the loader is warm ({warm_steps} steps); raise it")
    for i, batch in enumerate(loader):
        _ = batch.tokens.numel()
        if i == 0:
            first_at = time.perf_counter()
        if i + 1 == warm_steps:
            warm_at = time.perf_counter()
        if i + 1 == steps:
            break
    end = time.perf_counter()
    return first_at - start, end - start, (end - warm_at) * steps / (steps - warm_steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)  # pairs: this VM's single pairs spread by +-0.15x
    ap.add_argument("--workdir", default="/tmp/refinery-bench-loader")
    ap.add_argument("--bands", type=int, default=0,
                    help="serve the phase in this many difficulty bands, easy first (curriculum.phases[].order); 0: uniform")
    ap.add_argument("--peers-python", help="an interpreter with litdata installed (not this environment)")
    args = ap.parse_args()

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(workdir, args.seq_len, args.batch, args.steps, args.bands)
    data = CurriculumData.open(load_config(corpus / "loader.yaml"), LocalDataRoot(corpus / "root"), args.batch)
    tokens_per_step = args.batch * args.seq_len
    windows = planned_windows(data, args.steps)
    bare_gather(data, windows, tokens_per_step)  # page cache warm for everyone

    # Paired: a bare gather right before every run of ours, and the ratio taken within the pair, so
    # the machine's drift between repeats (this VM's bare gather alone swings by 30%) cancels.
    times: dict[str, list[float]] = {"bare memmap gather": []}
    ratios: dict[str, list[float]] = {}
    first_batch: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(args.repeats):
        for workers in (0, 2):
            bare = bare_gather(data, windows, tokens_per_step)
            first, whole, steady = ours(data, args.steps, workers)
            times["bare memmap gather"].append(bare)
            first_batch[workers].append(first)
            for name, t in ((f"ours, num_workers={workers}, steady", steady),
                            (f"ours, num_workers={workers}, whole run", whole)):
                times.setdefault(name, []).append(t)
                ratios.setdefault(name, []).append(bare / t)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    if args.peers_python:
        peers = litdata_times(args.peers_python, corpus / "root" / "shards" / "final", corpus, args.seq_len,
                              args.batch, args.steps, args.repeats)
        medians |= peers
        ratios |= {name: [medians["bare memmap gather"] / t] for name, t in peers.items()}  # not paired: its own process
    total = args.steps * tokens_per_step
    print(f"{args.steps} steps of {args.batch} x {args.seq_len} tokens ({total:,} tokens, "
          f"{medians['bare memmap gather']:.2f} s of bare gather), {args.repeats} repeats; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'loader':<36} {'tokens/s':>14} {'vs bare':>8}  {'(paired ratios: min-max)'}")
    for name, t in medians.items():
        r = ratios.get(name, [1.0])
        print(f"{name:<36} {total / t:>14,.0f} {statistics.median(r):>7.2f}x  ({min(r):.2f}-{max(r):.2f})")
    print("first batch, from creating the loader: " + ", ".join(
        f"num_workers={w} {1e3 * statistics.median(ts):.0f} ms ({1e3 * min(ts):.0f}-{1e3 * max(ts):.0f})"
        for w, ts in first_batch.items()))


if __name__ == "__main__":
    main()
