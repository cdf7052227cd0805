"""Checkpoints: one `step-XXXXXXXX.pt` per save (model, optimizer, scheduler, sampler, train state,
RNG states), written to a temp name, fsynced and renamed, then a `.json` sidecar holding its sha256.
The sidecar is the completion marker: a checkpoint without one, or whose bytes no longer match it,
is skipped in favour of the newest good one. Only tensors and primitives are stored, so loading uses
`torch.load(weights_only=True)`. Retention keeps the last `keep_last` plus every phase-boundary one.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from refinery.storage import atomic_path, dumps_json, sha256_file


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "cached": cached},
        "python": list(random.getstate()[1]),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    random.setstate((3, tuple(state["python"]), None))


class CheckpointManager:
    def __init__(self, directory: str | Path, keep_last: int):
        self.dir = Path(directory)
        self.keep_last = keep_last

    def path_for(self, step: int) -> Path:
        return self.dir / f"step-{step:08d}.pt"

    def save(self, step: int, state: dict[str, Any], boundary: str | None = None) -> Path:
        """Write checkpoint `step`; `boundary` names the phase it closes (kept forever)."""
        path = self.path_for(step)
        self.dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
        meta = {"step": step, "sha256": sha256_file(path), "bytes": path.stat().st_size, "boundary": boundary}
        with atomic_path(path.with_suffix(".json")) as tmp:
            tmp.write_bytes(dumps_json(meta))
        _fsync_dir(self.dir)
        self.prune()
        return path

    def complete(self) -> list[dict[str, Any]]:
        """Sidecars of checkpoints whose files exist, oldest first (bytes not yet verified)."""
        out = []
        for side in sorted(self.dir.glob("step-*.json")):
            try:
                meta = json.loads(side.read_text())
            except (OSError, ValueError):
                continue
            if side.with_suffix(".pt").is_file():
                out.append({**meta, "path": str(side.with_suffix(".pt"))})
        return out

    def prune(self) -> None:
        plain = [m for m in self.complete() if not m.get("boundary")]
        for meta in plain[: max(0, len(plain) - self.keep_last)]:
            pt = Path(meta["path"])
            pt.with_suffix(".json").unlink(missing_ok=True)  # the marker goes first, so a crash leaves no half
            pt.unlink(missing_ok=True)

    def verify(self, path: str | Path) -> str | None:
        """None when `path` matches its sidecar, else why not."""
        path = Path(path)
        side = path.with_suffix(".json")
        if not side.is_file():
            return "no completion sidecar (interrupted while saving?)"
        try:
            meta = json.loads(side.read_text())
        except ValueError:
            return "unreadable sidecar"
        if not path.is_file():
            return "checkpoint file missing"
        if sha256_file(path) != meta.get("sha256"):
            return "content hash differs from its sidecar (truncated or corrupted)"
        return None

    def latest(self) -> Path | None:
        """The newest checkpoint whose bytes match its sidecar; bad ones are reported and skipped."""
        for meta in reversed(self.complete()):
            problem = self.verify(meta["path"])
            if problem is None:
                return Path(meta["path"])
            print(f"refinery train: skipping checkpoint {meta['path']}: {problem}", file=sys.stderr)
        return None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found; pass a step-XXXXXXXX.pt from <run_dir>/checkpoints")
    problem = CheckpointManager(path.parent, 1).verify(path)
    if problem:
        raise ValueError(f"{path}: {problem}; pick an older checkpoint or use --resume auto")
    return torch.load(path, map_location="cpu", weights_only=True)
