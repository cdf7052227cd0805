"""Per-phase shard manifests: what a curriculum phase may read, pinned by content hash; how they
are built from the schedule and the inventory, and how the config is checked against them.

`phase_manifests` writes one JSON per phase at `manifests/<phase>.json`; the trainer and the
contamination scan read them. Entries of a bucket are numbered globally across its final shards in
shard order (shard 0's entries first), so one integer names one entry of the bucket.

A phase that keeps only part of a bucket (a quality cutoff, or contaminated documents dropped)
lists the kept global entry ids in a `.npy` file (int64, sorted) referenced by key and sha256. The
file is written as the ids stream in (the count is known first, so the header goes first) and
published atomically; its bytes are those `np.save` writes.

A phase with an `order` pins it in `order`: the spec (by, direction, bands) and per bucket its band
file (refinery/curriculum/bands.py: the served ids band by band) by key and sha256, with each
band's entries, tokens and mean difficulty. The bands are cut over the entries the phase serves
after its selection and exclusions, and cut again whenever exclusions change them.
"""

from __future__ import annotations

import hashlib
import io
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

import numpy as np
from refinery.config import RefineryConfig
from refinery.curriculum.bands import Served, bucket_bands, write_band_file
from refinery.curriculum.contract import CurriculumMismatch, ValidationReport, refuse_invalid
from refinery.curriculum.inventory import BucketInventory, ShardRef, table_slices
from refinery.curriculum.quality_cut import QualitySelection, kept_entry_ids
from refinery.curriculum.phase_fields import PLAN, PHASE_FIELDS, manifest_fields, order_spec, phase_differences
from refinery.curriculum.schedule import CurriculumError, PhasePlan, PhaseSpan, Schedule, build_schedule, place_phases
from refinery.layout import (MANIFESTS_PREFIX, bands_key, bucket_entries_key, exclusions_key, manifest_key, manifest_phase,
                             selection_key)
from refinery.shard_format import read_index
from refinery.tasks import RunTasks

if TYPE_CHECKING:
    from refinery.storage import DataRoot

MANIFEST_VERSION = 1
# Fields of a bucket's slice a quality cut adds; left out of the JSON where None.
BUCKET_CUT_FIELDS = ("quality_cutoffs", "languages")
# Fields added within version 1, with the value a manifest written before them means.
ADDED_FIELDS: dict[str, Any] = {"rope_scaling": None, "order": None}


class ManifestError(ValueError):
    """A manifest that is missing, malformed, or no longer matches the shards it names."""


@dataclass(frozen=True)
class BucketSlice:
    bucket: str
    shards: list[ShardRef]
    tokens: int  # tokens in the entries this phase may draw
    entries: int  # how many entries this phase may draw
    max_epochs: float = 1.0
    selection: str | None = None  # key of the .npy of kept global entry ids; None = every entry
    selection_sha256: str | None = None
    quality_cutoff: float | None = None  # the phase's quality cutoff kept documents scoring at least this
    # A per-language cut: each language's cutoff (null: none of its documents is scored); absent for
    # a global cut.
    quality_cutoffs: dict[str, float | None] | None = None
    # Under a quality cut, per language: the bucket's documents, those kept, their tokens, and the
    # language's share of the bucket and of the selection.
    languages: dict[str, dict[str, float]] | None = None

    @property
    def total_entries(self) -> int:
        return sum(s.entries for s in self.shards)


@dataclass(frozen=True)
class PhaseManifest:
    phase: str
    index: int  # position in the curriculum, 0-based
    token_budget: int
    seq_len: int
    lr_scale: float
    weights: dict[str, float]  # after temperature; sums to 1
    interpolation: float
    buckets: dict[str, BucketSlice]
    # The phase's declared RoPE scaling (None: keep the previous phase's; "none"; "auto"; or the YaRN
    # parameters), resolved against the manifests' seq_lens by the trainer (training/schedule.py).
    rope_scaling: str | dict[str, Any] | None = None
    # The phase's order within each bucket (None: a uniform shuffle per pass): {by, direction, bands,
    # buckets: {bucket: {file, sha256, entries, tokens, mean_difficulty, unscored}}} (order_manifest).
    order: dict[str, Any] | None = None
    validation: dict[str, Any] = field(default_factory=dict)  # {"ok": bool, "errors": [...], "warnings": [...], ...}
    config_fingerprint: str = ""
    version: int = MANIFEST_VERSION

    def to_json(self) -> dict[str, Any]:
        """The manifest's JSON; a uniform phase's has no `order` key, so its file is what it was before
        orders existed."""
        out = asdict(self)
        if out["order"] is None:
            del out["order"]
        for bucket in out["buckets"].values():  # a bucket without a quality cut reads as before the cut had languages
            for key in BUCKET_CUT_FIELDS:
                if bucket[key] is None:
                    del bucket[key]
        return out

    def identity(self) -> dict[str, Any]:
        """What identifies the manifest's contents: its JSON without the fields added since version 1
        while they hold the value an older manifest implies, so a run checkpointed against an older
        manifest resumes against a rebuilt one that says the same."""
        return {k: v for k, v in self.to_json().items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PhaseManifest":
        try:
            if d.get("version") != MANIFEST_VERSION:
                raise ManifestError(f"manifest version {d.get('version')}, this reader supports {MANIFEST_VERSION}")
            buckets = {
                name: BucketSlice(**{**b, "shards": [ShardRef(**s) for s in b["shards"]]})
                for name, b in d["buckets"].items()
            }
            return cls(**{**d, "buckets": buckets})
        except (KeyError, TypeError) as err:
            raise ManifestError(f"malformed manifest: {err}") from None


def write_manifest(root: DataRoot, manifest: PhaseManifest) -> str:
    return root.write_json(manifest_key(manifest.phase), manifest.to_json())


def read_manifest(root: DataRoot, phase: str) -> PhaseManifest:
    key = manifest_key(phase)
    if not root.exists(key):
        raise ManifestError(
            f"{root.display(key)}: no manifest for phase {phase!r}; materialize phase_manifests[{phase}] first"
        )
    try:
        return PhaseManifest.from_json(root.read_json(key))
    except (ValueError, KeyError, TypeError) as err:  # damaged: half-written, hand-edited, another format
        raise ManifestError(
            f"{root.display(key)}: not a readable phase manifest ({type(err).__name__}: {err}); materialize "
            f"phase_manifests[{phase}] again"
        ) from None


def read_selection(root: DataRoot, bucket: BucketSlice) -> np.ndarray | None:
    """The kept global entry ids of `bucket` (sorted int64, memory-mapped), verified against the
    manifest; None = all."""
    if bucket.selection is None:
        return None
    actual = root.sha256(bucket.selection)
    if actual != bucket.selection_sha256:
        raise ManifestError(
            f"{root.display(bucket.selection)}: content hash does not match the manifest; rebuild phase_manifests"
        )
    return np.load(root.local_path(bucket.selection), mmap_mode="r")


def selection_npy(entry_ids: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(entry_ids, dtype=np.int64))
    return buf.getvalue()


def selection_header(count: int) -> bytes:
    """The .npy header `np.save` writes for `count` int64 entry ids."""
    buf = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, dtype=np.int64))
    np.lib.format.write_array_header_1_0(buf, {**header, "shape": (count,)})
    return buf.getvalue()


@dataclass
class SelectionSink:
    """Where `write_selection`'s caller appends ascending entry ids; `sha256` is the file's once written."""

    file: BinaryIO
    digest: Any
    written: int = 0
    sha256: str = ""

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.digest.update(data)

    def append(self, entry_ids: np.ndarray) -> None:
        self.write(np.ascontiguousarray(entry_ids, dtype=np.int64).tobytes())
        self.written += len(entry_ids)


@contextmanager
def write_selection(root: DataRoot, key: str, count: int) -> Iterator[SelectionSink]:
    """Publish `count` sorted global entry ids under `key`, appended in ascending chunks to the sink,
    as the bytes `selection_npy` gives for all of them; nothing is published if fewer or more come."""
    with root.writer(key) as tmp, open(tmp, "wb") as f:
        sink = SelectionSink(f, hashlib.sha256())
        sink.write(selection_header(count))
        yield sink
        if sink.written != count:
            raise ManifestError(f"{root.display(key)}: {sink.written} entry ids, {count} expected; the entry table "
                                "changed while phase_manifests read it, rebuild it")
        sink.sha256 = sink.digest.hexdigest()


def drawn_buckets(schedule: Schedule, span: PhaseSpan) -> list[str]:
    """Buckets the phase may draw from: its own positive weights, and during its blend window the
    previous phase's."""
    drawn = span.weights > 0
    if span.index > 0 and span.blend_tokens:
        drawn |= schedule.phases[span.index - 1].weights > 0
    return [b for b, d in zip(schedule.buckets, drawn) if d]


def shard_selection(selection: np.ndarray | None, first: int, entries: int) -> np.ndarray:
    """The ids of `selection` (None = every entry) inside the shard of `entries` entries from global id `first`."""
    if selection is None:
        return np.arange(first, first + entries, dtype=np.int64)
    lo, hi = np.searchsorted(selection, [first, first + entries])
    return np.asarray(selection[lo:hi], dtype=np.int64)


def excluded_entries(root: DataRoot, sl: BucketSlice, selection: np.ndarray | None, excluded: set[str]) -> np.ndarray:
    """Sorted global ids of the selected entries whose document is excluded, reading the doc ids one
    shard at a time."""
    import polars as pl

    excluded_ids = pl.Series(sorted(excluded), dtype=pl.String)
    found, first = [], 0
    for ref in sl.shards:
        doc_ids = root.read_parquet(ref.prefix + ".entries.parquet", columns=["doc_id"])["doc_id"]
        hits = first + np.flatnonzero(doc_ids.is_in(excluded_ids).to_numpy()).astype(np.int64)
        found.append(hits[np.isin(hits, shard_selection(selection, first, ref.entries))])
        first += ref.entries
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def apply_exclusions(root: DataRoot, manifest: PhaseManifest, excluded: set[str],
                     run_tasks: RunTasks | None = None) -> PhaseManifest:
    """The manifest with every entry of an excluded document removed from its bucket's selection.

    Entry ids are global within the bucket (refinery/curriculum/inventory.py), so the new selection is
    the old one (or every entry) minus the excluded documents' entries; token counts are recomputed
    from the shard offsets so the manifest stays truthful. Shards are read one at a time; only the
    removed entries' ids are held for the whole bucket. An ordered phase's bands are cut again by
    tasks run by `run_tasks` (default: in this process)."""
    buckets = {}
    for name, sl in manifest.buckets.items():
        selection = read_selection(root, sl)
        removed = excluded_entries(root, sl, selection, excluded)
        if not removed.size:
            buckets[name] = sl
            continue
        count = (sl.total_entries if selection is None else len(selection)) - len(removed)
        key, tokens, first = selection_key(manifest.phase, name), 0, 0
        with write_selection(root, key, count) as out:
            for ref in sl.shards:
                ids = shard_selection(selection, first, ref.entries)
                ids = ids[~np.isin(ids, removed)]
                tokens += int(np.diff(read_index(root.local_path(ref.prefix + ".idx")).offsets)[ids - first].sum())
                out.append(ids)
                first += ref.entries
        buckets[name] = replace(sl, entries=count, tokens=tokens, selection=key, selection_sha256=out.sha256)
    changed = replace(manifest, buckets=buckets)
    if changed.order and changed.buckets != manifest.buckets:
        return order_manifest(root, changed, changed.order, run_tasks)
    return changed


def order_manifest(root: "DataRoot", manifest: PhaseManifest, order: Any, run_tasks: RunTasks | None = None) -> PhaseManifest:
    """The manifest with its order pinned: per bucket the band file over the entries it serves
    (its selection, or every entry), cut and written by a task per final shard run by `run_tasks`
    (default: in this process). A bucket without difficulty scores gets no band file; validation
    reports it (contract.py), so the trainer never reads such a manifest."""
    spec = order_spec(order)
    assert spec is not None
    descending = spec["direction"] == "hard_first"
    pinned: dict[str, Any] = {}
    for name, sl in sorted(manifest.buckets.items()):
        table = bucket_entries_key("final", name)
        read_selection(root, sl)  # checks the selection against the manifest's sha256 before the tasks read it
        served = Served(selection=sl.selection)
        parts = table_slices(name, table, [s.entries for s in sl.shards])
        bands = bucket_bands(root, parts, served, spec["bands"], descending, run_tasks)
        if bands is None:
            continue
        key = bands_key(manifest.phase, name)
        sha = write_band_file(root, key, parts, served, sl.total_entries, bands, descending, run_tasks)
        if sum(bands.entries) != sl.entries:
            raise ManifestError(f"{root.display(table)}: {sum(bands.entries)} entries banded, the manifest serves "
                                f"{sl.entries}; re-materialize shuffled_shards[{name}] and phase_manifests")
        pinned[name] = {"file": key, "sha256": sha, **bands.to_json()}
    return replace(manifest, order={**spec, "buckets": pinned})


def build_phase_manifest(
    cfg: RefineryConfig,
    root: "DataRoot",
    phase: str,
    report: ValidationReport,
    inventory: dict[str, BucketInventory],
    selections: dict[str, dict[str, QualitySelection]],
    run_tasks: RunTasks | None = None,
) -> PhaseManifest:
    """The manifest of `phase`: per drawn bucket its final shards (pinned by sha256) and, under a
    quality cutoff, the kept entries streamed into a sorted int64 .npy; plus the phase's budget,
    weights after temperature, seq_len, lr_scale, blend width and the validation result. Documents
    the contamination drop policy excluded from this phase stay excluded. What reads the entry
    tables runs as a task per final shard, run by `run_tasks` (default: in this process). The
    schedule is the one `report` validated."""

    assert cfg.curriculum is not None
    schedule = report.schedule if report.schedule is not None else build_schedule(cfg)  # None: raises why
    names = [p.name for p in schedule.phases]
    if phase not in names:
        raise CurriculumError(f"unknown phase {phase!r}; the curriculum has {names}")
    span = schedule.phases[names.index(phase)]
    policy = cfg.curriculum.buckets
    buckets = {}
    for b in drawn_buckets(schedule, span):
        inv = inventory[b]
        max_epochs = policy[b].max_epochs if b in policy else 1.0
        sel = selections.get(phase, {}).get(b)
        if sel is None:
            buckets[b] = BucketSlice(bucket=b, shards=inv.shards, tokens=inv.tokens, entries=inv.entries, max_epochs=max_epochs)
            continue
        key = selection_key(phase, b)
        with write_selection(root, key, sel.entries) as out:
            for ids in kept_entry_ids(root, inv, sel.cut, run_tasks):
                out.append(ids)
        buckets[b] = BucketSlice(
            bucket=b,
            shards=inv.shards,
            tokens=sel.tokens,
            entries=sel.entries,
            max_epochs=max_epochs,
            selection=key,
            selection_sha256=out.sha256,
            quality_cutoff=sel.cutoff,
            quality_cutoffs=None if sel.cut.by_language is None else
            {lang: (None if math.isinf(c) else c) for lang, c in sel.cut.by_language.items()},
            languages=sel.languages,
        )
    manifest = PhaseManifest(
        index=span.index,
        buckets=buckets,
        validation=report.to_json(),
        config_fingerprint=cfg.fingerprint(),
        **manifest_fields(cfg.curriculum.phases[span.index], span, schedule.buckets),
    )
    excluded_key = exclusions_key(phase)
    if root.exists(excluded_key):
        manifest = apply_exclusions(root, manifest, set(root.read_json(excluded_key)), run_tasks)
    order = cfg.curriculum.phases[span.index].order
    return manifest if order is None else order_manifest(root, manifest, order, run_tasks)


def schedule_from_manifests(manifests: list[PhaseManifest], buckets: list[str] | None = None) -> Schedule:
    """The same schedule rebuilt from the phase manifests alone (what the trainer holds): each
    schedule field phase_fields.py declares, from the manifest's attribute that pins it (the weights,
    already after temperature, aligned with `buckets`)."""
    if not manifests:
        raise CurriculumError("no phase manifests; materialize phase_manifests first")
    ordered = sorted(manifests, key=lambda m: m.index)
    names = tuple(buckets) if buckets is not None else tuple(ordered[0].weights)
    pinned = [f for f in PHASE_FIELDS if PLAN in f.schedule and f.manifest is not None]
    plans = [PhasePlan(**{**{f.name: getattr(m, f.manifest) for f in pinned},
                          "weights": np.array([m.weights.get(b, 0.0) for b in names])})
             for m in ordered]
    return place_phases(names, plans)


def manifest_differences(cfg: RefineryConfig, manifests: dict[str, PhaseManifest], schedule: Schedule) -> list[str]:
    """What differs between the config's curriculum (placed as `schedule`) and `manifests` (the data
    root's phase manifests by phase name), one sentence per field; empty when the config is what they
    were built from. Every field phase_fields.PHASE_FIELDS declares is compared.

    A config phase without a manifest was added (or renamed: a manifest of another name sits at its
    position); a manifest at another position means phases before it were added or removed. Extra
    manifests of phases the config does not name (another anneal variant's) are not differences."""
    assert cfg.curriculum is not None
    cur = cfg.curriculum
    by_index = {m.index: name for name, m in manifests.items()}
    diffs: list[str] = []
    for i, (p, span) in enumerate(zip(cur.phases, schedule.phases)):
        where = f"curriculum.phases[{i}] ({p.name})"
        m = manifests.get(p.name)
        if m is None:
            other = by_index.get(i)
            renamed = f" or renamed from {other!r}, whose manifest sits at this position" if other else ""
            diffs.append(f"{where}: no manifest manifests/{p.name}.json: the phase was added{renamed}")
            continue
        if m.index != i:
            before = [by_index[j] for j in sorted(by_index) if j < m.index]
            diffs.append(f"{where}: its manifest was built for position {m.index} (after {before}): phases before it "
                         "were added, removed or reordered")
        diffs += phase_differences(where, p, span, schedule.buckets, m)
        for b, bs in sorted(m.buckets.items()):
            max_epochs = cur.buckets[b].max_epochs if b in cur.buckets else 1.0
            if bs.max_epochs != max_epochs:
                diffs.append(f"curriculum.buckets.{b}.max_epochs: the config says {max_epochs:g}, manifest {p.name} "
                             f"{bs.max_epochs:g}")
    built = [manifests[p.name] for p in cur.phases if p.name in manifests]
    built_total = sum(m.token_budget for m in built)
    if len(built) == len(cur.phases) and built_total != schedule.total_tokens:
        diffs.append(f"curriculum.total_tokens: the config schedules {schedule.total_tokens:,} tokens, its phases' "
                     f"manifests {built_total:,}")
    return diffs


def stored_manifests(root: "DataRoot", needed: set[str]) -> dict[str, PhaseManifest]:
    """The phase manifests on the data root (manifests/<phase>.json) by phase name. Those of phases
    in `needed` must read; another one that does not (an old variant's) is left out."""
    names = [phase for phase in map(manifest_phase, root.list(MANIFESTS_PREFIX)) if phase is not None]
    out = {}
    for name in sorted(names):
        try:
            out[name] = read_manifest(root, name)
        except ManifestError:
            if name in needed:
                raise
    return out


def refuse_mismatch(cfg: RefineryConfig, root: "DataRoot") -> None:
    """Before training: raise CurriculumMismatch when the curriculum is invalid or is not the one the
    data root's manifests were built from, naming every difference. The trainer reads every per-phase
    field from the manifests alone; this is where the config is held to them. A config whose
    fingerprint differs from the manifests' (any other section changed) passes when no field the
    manifests carry differs."""
    schedule = refuse_invalid(cfg)
    assert cfg.curriculum is not None
    manifests = stored_manifests(root, {p.name for p in cfg.curriculum.phases})
    if not manifests:
        raise CurriculumMismatch(f"{root.display('manifests')}: no phase manifests; materialize phase_manifests first")
    diffs = manifest_differences(cfg, manifests, schedule)
    if diffs:
        lines = "\n".join(f"  {d}" for d in diffs)
        built_from = sorted({m.config_fingerprint for m in manifests.values()})
        raise CurriculumMismatch(
            f"the config's curriculum differs from the phase manifests on {root.display('manifests')} (built from "
            f"config fingerprint {', '.join(built_from)}, this config's is {cfg.fingerprint()}); nothing was "
            f"trained:\n{lines}\n"
            "rematerialize phase_manifests from this config, or train with the config they were "
            "built from"
        )
