"""Per-phase shard manifests: what a curriculum phase may read, pinned by content hash.

`phase_manifests` writes one JSON per phase at `manifests/<phase>.json`; the trainer and the
contamination scan read them. Entries of a bucket are numbered globally across its final shards in
shard order (shard 0's entries first), so one integer names one entry of the bucket.

A phase that keeps only part of a bucket (a quality cutoff, or contaminated documents dropped)
lists the kept global entry ids in a `.npy` file (int64, sorted) referenced by key and sha256.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from refinery.storage import DataRoot

MANIFEST_VERSION = 1


class ManifestError(ValueError):
    """A manifest that is missing, malformed, or no longer matches the shards it names."""


def manifest_key(phase: str) -> str:
    return f"manifests/{phase}.json"


@dataclass(frozen=True)
class ShardRef:
    prefix: str  # data-root key without suffix, e.g. "shards/final/web/shard-00000"
    tokens: int
    entries: int
    sha256: dict[str, str]  # suffix (".bin", ".idx", ".entries.parquet") -> hex


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
    validation: dict[str, Any] = field(default_factory=dict)  # {"ok": bool, "errors": [...], "warnings": [...], ...}
    config_fingerprint: str = ""
    version: int = MANIFEST_VERSION

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

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
    return PhaseManifest.from_json(root.read_json(key))


def read_selection(root: DataRoot, bucket: BucketSlice) -> np.ndarray | None:
    """The kept global entry ids of `bucket` (sorted int64), verified against the manifest; None = all."""
    if bucket.selection is None:
        return None
    actual = root.sha256(bucket.selection)
    if actual != bucket.selection_sha256:
        raise ManifestError(
            f"{root.display(bucket.selection)}: content hash does not match the manifest; rebuild phase_manifests"
        )
    return np.load(root.local_path(bucket.selection))
