"""Where a training run lives when the data root is remote (s3://...).

The trainer always works in a local run directory: checkpoints are written, fsynced and verified on
local disk, and torch reads them back from there. On a remote data root that directory sits in the
local cache (`$REFINERY_CACHE_DIR/runs/...`), and `RunMirror` keeps its durable copy on the data
root under `training.run_dir`: every checkpoint is uploaded after it is saved (its sidecar last, so
a remote checkpoint without a sidecar is incomplete, as it is locally), pruned checkpoints are
deleted there too, and status and metrics follow each status change. A fresh machine restores the
directory from the data root before resuming, so a run moves between machines through S3.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from refinery.config import RefineryConfig
from refinery.storage import DataRoot, atomic_path, open_data_root
from refinery.storage_s3 import cache_base_dir
MIRRORED_FILES = ("status.json", "metrics.jsonl")


def is_remote(cfg: RefineryConfig) -> bool:
    return "://" in cfg.data_root


def run_base(cfg: RefineryConfig) -> Path:
    """The local directory that holds `training.run_dir`: inside the data root when it is local,
    else in the local cache, keyed by the data root's URL."""
    if not is_remote(cfg):
        return Path(cfg.resolve(cfg.data_root)) / cfg.training.run_dir
    return cache_base_dir() / "runs" / hashlib.sha256(cfg.data_root.encode()).hexdigest()[:16] / cfg.training.run_dir


class RunMirror:
    """The data-root copy of one local run directory (`key_prefix` on `root`)."""

    def __init__(self, root: DataRoot, key_prefix: str, local_dir: Path):
        self.root, self.prefix, self.local = root, key_prefix.strip("/"), Path(local_dir)

    @classmethod
    def for_run(cls, cfg: RefineryConfig, run_dir: Path) -> "RunMirror | None":
        """A mirror when the data root is remote and `run_dir` lies under `run_base(cfg)`, else None."""
        if not is_remote(cfg):
            return None
        base = run_base(cfg)
        try:
            relative = Path(run_dir).resolve().relative_to(base.resolve())
        except ValueError:
            return None
        key = "/".join([cfg.training.run_dir.strip("/"), *relative.parts])
        return cls(open_data_root(cfg.data_root), key, run_dir)

    def _key(self, path: Path) -> str:
        return f"{self.prefix}/{path.relative_to(self.local).as_posix()}"

    def push(self, path: Path) -> None:
        if path.is_file():
            with self.root.writer(self._key(path)) as tmp:
                tmp.write_bytes(path.read_bytes())

    def push_run_files(self) -> None:
        for name in MIRRORED_FILES:
            self.push(self.local / name)

    def push_checkpoints(self) -> None:
        """Upload local checkpoints the root lacks (each `.pt` before its `.json` sidecar) and delete
        the root's copies of checkpoints pruned locally."""
        ckpt_dir = self.local / "checkpoints"
        remote = set(self.root.list(f"{self.prefix}/checkpoints"))
        local = {self._key(p) for p in ckpt_dir.glob("step-*")} if ckpt_dir.is_dir() else set()
        for side in sorted(ckpt_dir.glob("step-*.json")) if ckpt_dir.is_dir() else ():
            pt = side.with_suffix(".pt")
            if self._key(side) not in remote and pt.is_file():
                self.push(pt)
                self.push(side)
        for key in sorted(remote - local, key=lambda k: not k.endswith(".json")):  # sidecar first, as locally
            self.root.delete(key)

    def restore(self) -> int:
        """Copy into the local directory every mirrored file it lacks; returns how many were copied."""
        copied = 0
        for key in sorted(self.root.list(self.prefix), key=lambda k: k.endswith(".json")):  # sidecars last
            target = self.local / key[len(self.prefix) + 1:]
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(target) as tmp:
                tmp.write_bytes(self.root.read_bytes(key))
            copied += 1
        return copied

