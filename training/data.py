"""Shard reading and batch building for the trainer.

`CurriculumData.open` reads every phase manifest, memory-maps each bucket's final shards and checks
their sha256 against the manifest before the first step. `gather` turns a planned step (see
`training.sampler`) into whole-batch numpy arrays, and `gather_steps` does so for many planned steps at
once: one `np.concatenate` of memmap slices, handed to torch with `torch.from_numpy`: no per-item
tensors and no Python lists of tokens. Where each row's entries start and which targets the loss
skips travel as a `RowLayout`, a few positions per row, and become per-token doc ids and target masks
only on the trainer's device.

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
from refinery.curriculum import BucketSlice, read_manifest, read_selection
from refinery.shard_format import ShardReader
from refinery.storage import DataRoot
from refinery.shard_cache import ShardCache
from training.sampler import ChunkPlan, CurriculumSampler, EntrySet, StepPlan, ordinals
from training.schedule import StepSchedule
from training.heldout import heldout_entries  # e-run-safety


@dataclass
class BucketShards:
    """One bucket's final shards, memory-mapped, with per-entry lookup arrays over global entry ids:
    20 bytes an entry, held by every rank (a bucket of a billion entries costs 20 GB)."""

    bucket: str
    prefixes: list[str]  # data-root keys
    arrays: list[np.ndarray]
    entry_shard: np.ndarray  # int32: global entry id -> shard position in `arrays`
    entry_offset: np.ndarray  # int64: global entry id -> first token within its shard
    lengths: np.ndarray  # int32
    overlaps: np.ndarray  # uint32 overlap-prefix length (masked out of the loss)

    def shard_token(self, entry: int, token: int) -> tuple[str, int]:
        """(shard prefix key, token offset within the shard) of token `token` of global entry `entry`."""
        return self.prefixes[int(self.entry_shard[entry])], int(self.entry_offset[entry]) + token


def open_bucket(cache: ShardCache, bucket: BucketSlice, verified: set[str]) -> BucketShards:
    readers = []
    for ref in bucket.shards:
        reader = ShardReader(cache.local_prefix(ref.prefix))
        if ref.prefix not in verified:
            reader.verify(ref.sha256)
            verified.add(ref.prefix)
        readers.append(reader)
    if not readers:
        raise ValueError(f"bucket {bucket.bucket!r}: the manifest lists no shards; rebuild phase_manifests")
    lengths = np.concatenate([np.diff(r.offsets) for r in readers])
    if len(lengths) and lengths.max() >= 1 << 31:
        raise ValueError(f"bucket {bucket.bucket!r}: an entry of {int(lengths.max())} tokens; entries must be "
                         "shorter than 2^31 tokens (tokenize splits documents into windows)")
    return BucketShards(
        bucket=bucket.bucket,
        prefixes=[ref.prefix for ref in bucket.shards],
        arrays=[r.tokens.view(np.ndarray) for r in readers],
        entry_shard=np.concatenate([np.full(len(r), i, dtype=np.int32) for i, r in enumerate(readers)]),
        entry_offset=np.concatenate([r.offsets[:-1] for r in readers]).astype(np.int64),
        lengths=lengths.astype(np.int32),
        overlaps=np.concatenate([r.overlaps for r in readers]),
    )


def entry_set_key(bucket: BucketSlice) -> str:
    """One key per distinct (bucket, shards, selection): phases with the same key share a cursor."""
    ident = "|".join(sorted(s.sha256.get(".idx", s.prefix) for s in bucket.shards)) + f"|{bucket.selection_sha256}"
    return f"{bucket.bucket}:{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


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


def _fresh(name: str, n: int, dtype: Any) -> np.ndarray:
    return np.empty(n, dtype=dtype)


def _filled(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    out[:] = values
    return out


class CurriculumData:
    def __init__(self, schedule: StepSchedule, buckets: dict[str, BucketShards], sets_by_phase: list[dict[str, EntrySet]], seed: int):
        self.schedule = schedule
        self.buckets = buckets
        self.sets_by_phase = sets_by_phase
        self.seed = seed
        self.bucket_names = sorted(buckets)
        arrays, base = [], {}
        for name in self.bucket_names:
            base[name] = len(arrays)
            arrays.extend(buckets[name].arrays)
        self._arrays = arrays
        self._array_base = base
        self._allocations: dict = {}

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
        # On a remote data root the shards land in a bounded local cache, fetched in the background in
        # the order the buckets are opened; a local root is read in place.
        cache = ShardCache(root, max_bytes=int(cfg.training.shard_cache_gb * (1 << 30)), threads=4)
        cache.prefetch([ref.prefix for m in manifests for _, bs in sorted(m.buckets.items()) for ref in bs.shards])
        verified: set[str] = set()
        # -- e-run-safety: validation entries held out of training (training/heldout.py); they are
        # removed from every entry set below, so the sampler can never serve them.
        heldout = heldout_entries(root, manifests, cfg.training.eval_entries_per_bucket, cfg.seed)
        buckets: dict[str, BucketShards] = {}
        sets: dict[str, EntrySet] = {}
        sets_by_phase = []
        for m in manifests:
            phase_sets = {}
            for name, bslice in sorted(m.buckets.items()):
                if name not in buckets:
                    buckets[name] = open_bucket(cache, bslice, verified)
                key = entry_set_key(bslice)
                if key not in sets:
                    selection = read_selection(root, bslice)
                    ids = np.arange(bslice.total_entries) if selection is None else selection
                    if heldout[name].size:  # e-run-safety: never train on held-out entries
                        ids = np.setdiff1d(ids, heldout[name])
                    # int32 where it fits: the set and each pass's order hold one id per entry
                    # (a permutation of int32 ids is the same order as of int64 ones)
                    ids = ids.astype(np.int32 if bslice.total_entries < 1 << 31 else np.int64)
                    sets[key] = EntrySet(key, name, ids, buckets[name].lengths, bslice.max_epochs, cfg.seed)
                phase_sets[name] = sets[key]
            sets_by_phase.append(phase_sets)
        cache.close()
        held = cache.held_bytes()
        if held > cache.max_bytes:
            raise ValueError(
                f"the phase manifests name {held / (1 << 30):.2f} GiB of shards, more than training.shard_cache_gb="
                f"{cfg.training.shard_cache_gb:g} holds; raise it (the trainer keeps every shard it may read)"
            )
        data = cls(schedule, buckets, sets_by_phase, cfg.seed)
        data.heldout = heldout  # e-run-safety: bucket -> held-out entry ids, for validation loss
        return data

    def sampler(self, allow_exhaustion: bool) -> CurriculumSampler:
        return CurriculumSampler(self.schedule, self.sets_by_phase, self.seed, allow_exhaustion, self._allocations)

    def rank_rows(self, rank: int, world_size: int) -> slice:
        G = self.schedule.global_batch
        if G % world_size:
            raise ValueError(
                f"the global batch ({G} rows = micro_batch_size * grad_accum_steps) does not split over {world_size} "
                "ranks; choose sizes whose product is a multiple of the world size"
            )
        per = G // world_size
        return slice(rank * per, (rank + 1) * per)

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
        array = np.empty(len(p.entry), dtype=np.int64)
        start = np.empty(len(p.entry), dtype=np.int64)
        overlap = np.empty(len(p.entry), dtype=np.int64)
        bucket_index = np.array([self.bucket_names.index(es.bucket) for es in chunk.sets], dtype=np.int64)
        for si, es in enumerate(chunk.sets):
            m = p.set_index == si if len(chunk.sets) > 1 else slice(None)
            bs, e = self.buckets[es.bucket], p.entry[m]
            array[m] = self._array_base[es.bucket] + bs.entry_shard[e]
            start[m] = bs.entry_offset[e]
            overlap[m] = bs.overlaps[e]
        lo, hi = start + p.a, start + p.b
        tokens = alloc("tokens", n_rows * L, np.int32)
        # One copy for the whole chunk. The piece bounds (tens per row, never tokens) become Python
        # ints because slicing a memmap with them is the cheapest view numpy offers.
        arrays = self._arrays
        np.concatenate([arrays[i][s:t] for i, s, t in zip(array.tolist(), lo.tolist(), hi.tolist())], out=tokens,
                       casting="same_kind")
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
