"""Shard reading and batch building for the trainer.

`CurriculumData.open` reads every phase manifest and builds, per bucket, a `BucketIndex` over its
final shards (training/shard_pool.py: shards opened lazily through a bounded pool, verified on first
read) and the entry sets the sampler reads (an ordered phase's from its memory-mapped band files). Nothing at open grows with the corpus beyond the
manifests themselves: no shard is opened, hashed or copied until a step reads it. `gather` turns a
planned step (see `training.sampler`) into whole-batch numpy arrays, and `gather_steps` does so for
many planned steps at once: one `np.concatenate` of memmap slices, handed to torch with
`torch.from_numpy`: no per-item tensors and no Python lists of tokens. Where each row's entries
start and which targets the loss skips travel as a `RowLayout`, a few positions per row, and become
per-token doc ids and target masks only on the trainer's device. Held-out entries become rows here
too (`eval_rows`), at the length of the phase being trained.

A phase's seq_len reaches the model from here (docs/architecture.md): rows are cut to it
(`gather_steps`, `eval_rows`) and the tensors' shape carries it on; the loader, the loop and the
model keep no field of it.

Sharding: every rank and loader worker plans the same global order (planning is integer
arithmetic, no token reads); rank r reads rows [r*G/W, (r+1)*G/W) of each global batch, and with
`num_workers=k` whole chunks of steps go round-robin to the workers (chunk c to worker c % k), so the
order a rank sees depends on neither W nor k (`training.loader` runs this in worker processes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from refinery.config import RefineryConfig
from refinery.curriculum import BucketSlice, PhaseManifest, read_manifest
from refinery.storage import DataRoot
from refinery.shard_cache import ShardCache
from training.entry_sets import EntrySet, ordinals
from training.sampler import ChunkPlan, CurriculumSampler, StepPlan
from training.schedule import StepSchedule
from training.shard_pool import BucketIndex, ShardPool, VerifiedRecord
from training.heldout import heldout_entries  # e-run-safety


def entry_set_key(bucket: BucketSlice, bands: dict[str, Any] | None = None) -> str:
    """One key per distinct (bucket, shards, selection, order): phases with the same key read the
    same order. An ordered set's key adds its band file's sha256 (its order is keyed by it); without
    `bands` the key is the set's group, shared by every order of the same entries, whose phases
    share one cursor and its passes (`training.handover.Handover`)."""
    ident = "|".join(sorted(s.sha256.get(".idx", s.prefix) for s in bucket.shards)) + f"|{bucket.selection_sha256}"
    if bands is not None:
        ident += f"|bands:{bands['sha256']}"
    return f"{bucket.bucket}:{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def bands_of(root: DataRoot, manifest: PhaseManifest, bucket: str, record: VerifiedRecord) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """An ordered phase's band entry for `bucket` in its manifest and the band file (global entry
    ids band by band, memory-mapped, checked against the manifest's sha256 once per node and file
    version); (None, None) for a uniform phase."""
    if manifest.order is None:
        return None, None
    bands = manifest.order["buckets"].get(bucket)
    if bands is None:
        raise ValueError(f"manifest of phase {manifest.phase!r} orders by {manifest.order['by']} but pins no bands "
                         f"for bucket {bucket!r}; fix the curriculum and rebuild phase_manifests")
    path = root.local_path(bands["file"])
    record.check(path, bands["sha256"], "rebuild phase_manifests")
    return bands, np.load(path, mmap_mode="r")


def selection_of(root: DataRoot, bucket: BucketSlice, record: VerifiedRecord) -> np.ndarray | None:
    """A phase's kept global entry ids (sorted int64), memory-mapped, checked against the manifest's
    sha256 once per node and file version; None = every entry."""
    if bucket.selection is None:
        return None
    path = root.local_path(bucket.selection)
    record.check(path, bucket.selection_sha256 or "", "rebuild phase_manifests")
    return np.load(path, mmap_mode="r")


@dataclass
class RowLayout:
    """How entries are packed into `rows` rows of `seq_len` tokens, as flat positions (row * seq_len +
    column): `starts`, where each entry after a row's first begins, and `skipped`, positions whose
    target lies in an entry's overlap prefix (trained on already, as the end of the previous
    window). A few positions per row instead of two per-token arrays: the loader writes only
    tokens, and the trainer expands the layout where it computes (varlen attention's cu_seqlens hold the
    same boundaries)."""

    rows: int
    seq_len: int
    starts: np.ndarray  # int64, ascending
    skipped: np.ndarray  # int64, ascending

    def doc_ids(self, device: torch.device | str | None = None) -> torch.Tensor:
        """int32 (rows, seq_len): each token's entry ordinal within its row, for attention masking."""
        flat = torch.zeros(self.rows * self.seq_len, dtype=torch.int32, device=device)
        flat.index_fill_(0, _positions(self.starts, flat.device), 1)
        return flat.view(self.rows, self.seq_len).cumsum(1, dtype=torch.int32)

    def target_mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """bool (rows, seq_len): position i's target (token i+1) counts in the loss unless it starts
        another entry of the row, lies past the row's end, or sits in an overlap prefix."""
        flat = torch.ones(self.rows * self.seq_len, dtype=torch.bool, device=device)
        flat.index_fill_(0, _positions(np.concatenate([self.starts - 1, self.skipped]), flat.device), False)
        mask = flat.view(self.rows, self.seq_len)
        mask[:, -1] = False
        return mask

    @classmethod
    def cat(cls, layouts: list["RowLayout"]) -> "RowLayout":
        """The layouts' rows one after another (one process serving several ranks)."""
        shift = np.cumsum([0] + [lay.rows * lay.seq_len for lay in layouts[:-1]])
        return cls(sum(lay.rows for lay in layouts), layouts[0].seq_len,
                   np.concatenate([lay.starts + d for lay, d in zip(layouts, shift)]),
                   np.concatenate([lay.skipped + d for lay, d in zip(layouts, shift)]))


def _positions(positions: np.ndarray, device: torch.device) -> torch.Tensor:
    """int64 positions on `device`. To CUDA through pinned memory, so that the copy is queued
    behind the device's work instead of waiting for it (a pageable copy may wait), and filled with
    `index_fill_` by the callers: `flat[idx] = value` copies the value to the device and waits."""
    t = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


@dataclass
class EvalRows:
    """Held-out entries packed back to back into rows of one seq_len, with the loss mask."""

    tokens: np.ndarray  # int64 (rows, L)
    doc_ids: np.ndarray  # int32 (rows, L): entry ordinal, for document-masked attention
    target_mask: np.ndarray  # bool (rows, L): position i's target (token i+1) counts


def pack_eval_rows(shards: BucketIndex, ids: np.ndarray, seq_len: int) -> EvalRows:
    """Entries `ids` of one bucket as rows of `seq_len`: a target counts when it lies in the same entry
    and outside the entry's overlap prefix (the tokens its previous window already trained on), as
    in training; the last row is padded with masked tokens."""
    shard, offset, lengths, overlaps = shards.table(ids)
    pieces = [shards.reader(s).tokens[o:o + n] for s, o, n in zip(shard.tolist(), offset.tolist(), lengths.tolist())]
    n = int(lengths.sum())
    rows = max(1, -(-n // seq_len))
    tokens = np.zeros(rows * seq_len, dtype=np.int64)
    if n:
        tokens[:n] = np.concatenate(pieces)
    doc = np.full(rows * seq_len, -1, dtype=np.int64)
    doc[:n] = np.repeat(np.arange(len(ids)), lengths)
    starts = np.cumsum(lengths) - lengths
    in_overlap = np.zeros(rows * seq_len, dtype=bool)
    for s, ov in zip(starts, np.minimum(overlaps, lengths)):
        in_overlap[s:s + ov] = True
    doc, in_overlap = doc.reshape(rows, seq_len), in_overlap.reshape(rows, seq_len)
    mask = np.zeros((rows, seq_len), dtype=bool)
    mask[:, :-1] = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0) & ~in_overlap[:, 1:]
    return EvalRows(tokens.reshape(rows, seq_len), doc.astype(np.int32), mask)


def _fresh(name: str, n: int, dtype: Any) -> np.ndarray:
    return np.empty(n, dtype=dtype)


def _filled(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    out[:] = values
    return out


class CurriculumData:
    def __init__(self, schedule: StepSchedule, buckets: dict[str, BucketIndex], sets_by_phase: list[dict[str, EntrySet]],
                 seed: int, pool: ShardPool, heldout: dict[str, np.ndarray]):
        self.schedule = schedule
        self.buckets = buckets
        self.sets_by_phase = sets_by_phase
        self.seed = seed
        self.pool = pool
        self.heldout = heldout  # e-run-safety: bucket -> held-out entry ids, for validation loss
        self.bucket_names = sorted(buckets)
        # Shards numbered across buckets (bucket_names order) for one lookup per chunk.
        self._bases = np.cumsum([0] + [len(buckets[n].shards) for n in self.bucket_names])[:-1]
        self._shard_base = dict(zip(self.bucket_names, self._bases.tolist()))
        self._eval_rows: dict[tuple[str, int], EvalRows] = {}  # (bucket, seq_len) -> its held-out rows

    @classmethod
    def open(cls, cfg: RefineryConfig, root: DataRoot, global_batch: int) -> "CurriculumData":
        if cfg.curriculum is None:
            raise ValueError("the config has no `curriculum:` section; add one (see configs/demo.yaml) to train")
        manifests = [read_manifest(root, p.name) for p in cfg.curriculum.phases]
        for m in manifests:
            if m.validation and not m.validation.get("ok", True):
                raise ValueError(
                    f"manifest of phase {m.phase!r} failed validation: {m.validation.get('errors')}; fix the "
                    "curriculum and rebuild phase_manifests (or set the allow_* flag the error names)"
                )
        schedule = StepSchedule.build(manifests, global_batch)
        # On a remote data root a shard lands in a bounded local cache while the pool holds it open (and
        # ahead of the read position: see `upcoming_shards`); a local root is read in place.
        cache = ShardCache(root, max_bytes=int(cfg.training.shard_cache_gb * (1 << 30)), threads=4)
        record = VerifiedRecord()
        pool = ShardPool(cache, record=record)
        # -- e-run-safety: validation entries held out of training (training/heldout.py); they are
        # removed from every entry set below, so the sampler can never serve them.
        heldout = heldout_entries(root, manifests, cfg.training.eval_entries_per_bucket, cfg.seed)
        buckets: dict[str, BucketIndex] = {}
        sets: dict[str, EntrySet] = {}
        sets_by_phase = []
        for m in manifests:
            phase_sets = {}
            for name, bslice in sorted(m.buckets.items()):
                if name not in buckets:
                    buckets[name] = BucketIndex(name, bslice.shards, pool)
                bands, band_file = bands_of(root, m, name, record)
                key = entry_set_key(bslice, bands)
                if key not in sets:
                    selection = selection_of(root, bslice, record) if bands is None else band_file
                    sets[key] = EntrySet(key, name, buckets[name], bslice.tokens, bslice.max_epochs, cfg.seed,
                                         selection, heldout[name], None if bands is None else bands["entries"],
                                         entry_set_key(bslice))
                phase_sets[name] = sets[key]
            sets_by_phase.append(phase_sets)
        return cls(schedule, buckets, sets_by_phase, cfg.seed, pool, heldout)

    def sampler(self, allow_exhaustion: bool) -> CurriculumSampler:
        return CurriculumSampler(self.schedule, self.sets_by_phase, self.seed, allow_exhaustion)

    def prefetch(self, sampler: CurriculumSampler) -> None:
        """Fetch the shards of the blocks the sampler's sets read next (a remote root; no-op locally)."""
        if not self.pool.cache.remote:
            return
        for bucket, spans in sampler.upcoming_entries().items():
            for lo, hi in spans:
                self.buckets[bucket].prefetch_entries(lo, hi)

    def rank_rows(self, rank: int, world_size: int) -> slice:
        G = self.schedule.global_batch
        if G % world_size:
            raise ValueError(
                f"the global batch ({G} rows = micro_batch_size * grad_accum_steps) does not split over {world_size} "
                "ranks; choose sizes whose product is a multiple of the world size"
            )
        per = G // world_size
        return slice(rank * per, (rank + 1) * per)

    def step_slice_tokens(self, phase: int, rows: slice) -> int:
        """Tokens of rows `rows` (a rank's slice) in one step of phase `phase`: what `gather_steps` copies."""
        return (rows.stop - rows.start) * self.schedule.manifests[phase].seq_len

    def eval_rows(self, bucket: str, phase: int) -> EvalRows:
        """Bucket `bucket`'s held-out entries as rows of phase `phase`'s seq_len, packed once per length."""
        key = (bucket, self.schedule.manifests[phase].seq_len)
        if key not in self._eval_rows:
            self._eval_rows[key] = pack_eval_rows(self.buckets[bucket], self.heldout[bucket], key[1])
        return self._eval_rows[key]

    def _reader_tokens(self, shard: int) -> np.ndarray:
        """The token map of shard number `shard` (numbered across buckets, in `bucket_names` order)."""
        name = self.bucket_names[int(np.searchsorted(self._bases, shard, side="right")) - 1]
        return self.buckets[name].reader(shard - self._shard_base[name]).tokens

    def _copy(self, shard: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray) -> None:
        """Tokens [lo, hi) of each piece's shard, back to back into `out`. One np.concatenate when the
        pieces' shards fit the pool at once (the piece bounds, tens per row, become Python ints because
        slicing a memmap with them is the cheapest view numpy offers); else a pool's worth of shards
        at a time, so the open maps stay bounded."""
        low = int(shard.min(initial=0))
        if len(shard) and int(shard.max()) - low < 1 << 16:  # a chunk reads a few blocks: count, not sort
            present = np.flatnonzero(np.bincount(shard - low))
            lookup = np.empty(len(present) and int(present[-1]) + 1, dtype=np.int64)
            lookup[present] = np.arange(len(present))
            uniq, which = present + low, lookup[shard - low]
        else:
            uniq, which = np.unique(shard, return_inverse=True)
        capacity = self.pool.capacity
        if len(uniq) <= capacity:
            arrays = [self._reader_tokens(u) for u in uniq.tolist()]
            np.concatenate([arrays[i][s:t] for i, s, t in zip(which.tolist(), lo.tolist(), hi.tolist())], out=out,
                           casting="same_kind")
            return
        at = np.cumsum(hi - lo) - (hi - lo)
        for first in range(0, len(uniq), capacity):
            arrays = [self._reader_tokens(u) for u in uniq[first:first + capacity].tolist()]
            picked = np.flatnonzero((which >= first) & (which < first + capacity))
            for i, s, t, o in zip((which[picked] - first).tolist(), lo[picked].tolist(), hi[picked].tolist(),
                                  at[picked].tolist()):
                out[o:o + t - s] = arrays[i][s:t]

    def gather(self, plan: StepPlan, rows: slice, record: bool = False) -> dict[str, Any]:
        """Numpy arrays of rows `rows` of one step: tokens, doc_ids, target_mask (the layout expanded on
        the CPU), row_bucket, and the pieces read, as `consumed`, when recording."""
        out = self.gather_steps(plan.chunk, rows, np.array([plan.step - plan.chunk.step]), record)
        layout = out["layouts"][0]
        one = {"tokens": out["tokens"][0], "doc_ids": layout.doc_ids().numpy(),
               "target_mask": layout.target_mask().numpy(), "row_bucket": out["row_bucket"][0]}
        if record:
            one["consumed"] = out["consumed"][0]
        return one

    def gather_steps(self, chunk: ChunkPlan, rows: slice, steps: np.ndarray, record: bool = False,
                     alloc: Callable[[str, int, Any], np.ndarray] | None = None) -> dict[str, Any]:
        """Rows `rows` of the chosen steps of `chunk` in one pass: tokens (steps, rows, L) int32 copied
        out of the memory-mapped shards by one np.concatenate, row_bucket (steps, rows) int64, each
        step's `RowLayout` in `layouts`; with `record`, `consumed` lists each step's pieces.

        `alloc(name, n, dtype)` gives the 1-D output arrays (default: new ones); a loader passes reused
        buffers, because first touching new pages costs more than the copy."""
        alloc = alloc or _fresh
        p = chunk.pieces(rows, steps)
        per, L = rows.stop - rows.start, chunk.seq_len
        n_rows = len(steps) * per
        bucket_index = np.array([self.bucket_names.index(es.bucket) for es in chunk.sets], dtype=np.int64)
        # Shards numbered across buckets; the planner read each entry's shard and start already.
        shard = np.array([self._shard_base[es.bucket] for es in chunk.sets], dtype=np.int64)[p.set_index] + p.shard
        overlap = p.overlap
        tokens = alloc("tokens", n_rows * L, np.int32)
        self._copy(shard, p.start + p.a, p.start + p.b, tokens)
        lens = p.b - p.a
        pos = np.cumsum(lens) - lens
        starts = pos[(lens > 0) & (pos % L > 0)]  # entries after the first of their row
        masked = np.minimum(np.maximum(overlap - p.a, 0), lens)
        has = np.flatnonzero(masked)
        at = np.repeat(pos[has], masked[has]) + ordinals(masked[has])  # tokens inside overlap prefixes
        skipped = at[at % L > 0] - 1  # a row's first token is nobody's target within the row
        # Each step's positions, relative to the step: slices of the chunk's (sorted) arrays.
        step_tokens, bounds = per * L, np.arange(len(steps) + 1) * per * L
        cut_starts = np.searchsorted(starts, bounds).tolist()
        cut_skipped = np.searchsorted(skipped, bounds).tolist()
        starts, skipped = starts % step_tokens, skipped % step_tokens
        layouts = [RowLayout(per, L, starts[cut_starts[i]:cut_starts[i + 1]], skipped[cut_skipped[i]:cut_skipped[i + 1]])
                   for i in range(len(steps))]
        out: dict[str, Any] = {
            "tokens": tokens.reshape(len(steps), per, L),
            "row_bucket": _filled(alloc("row_bucket", n_rows, np.int64), bucket_index[chunk.row_set[steps, rows]].reshape(-1))
            .reshape(len(steps), per),
            "layouts": layouts,
        }
        if record:
            cuts = np.searchsorted(p.row, np.arange(1, len(steps)) * per)
            fields = {"row": p.row % per + rows.start, "bucket": bucket_index[p.set_index], "epoch": p.epoch,
                      "entry": p.entry, "a": p.a, "b": p.b}
            split = {k: np.split(v, cuts) for k, v in fields.items()}
            out["consumed"] = [{k: split[k][i] for k in fields} for i in range(len(steps))]
        return out
