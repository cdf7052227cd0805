"""Checkpoints: the run's named stateful parts in one file per save, and where a run resumes from.

`CheckpointManager` keeps the files: one `step-XXXXXXXX.pt` per save, written to a temp name,
fsynced and renamed, then a `.json` sidecar holding its sha256. The sidecar is the completion
marker: a checkpoint without one, or whose bytes no longer match it, is skipped in favour of the
newest good one. What a save killed mid-write left under a temporary name is removed at the next
save and when rank 0 resumes. Only tensors and primitives are stored, so loading uses
`torch.load(weights_only=True)`. Retention keeps the last `keep_last` plus every phase-boundary one.

`Checkpointer` fills them from the parts under constant keys (torchtitan's shape): the model, its
shape, the optimizer, the LR scheduler, the sampler, the train state (step and tokens, the run's
accounting and its validation history) and the RNG states; and it applies the resume policy of
status.json (a halted run is not auto-resumed).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np
import torch

from refinery.storage import atomic_path, dumps_json, sha256_file
from refinery.storage.base import TEMPORARY_SUFFIX
from refinery.layout import CHECKPOINTS_DIR

if TYPE_CHECKING:
    from training.run_store import RunMirror

MODEL, MODEL_ARGS, OPTIMIZER, SCHEDULER, SAMPLER, TRAIN_STATE, RNG = (
    "model", "model_args", "optimizer", "scheduler", "sampler", "train", "rng")
# The model's shape is checked before its weights load, and the train state (which refuses other
# held-out entries) before the sampler's cursors into the entry sets that exclude them.
LOAD_ORDER = (MODEL_ARGS, MODEL, OPTIMIZER, SCHEDULER, TRAIN_STATE, SAMPLER, RNG)


class DiskFull(RuntimeError):
    """A checkpoint did not fit on its disk: relaunching cannot help until space is freed."""


# Below this much free space, a failed write is taken for a full disk: torch reports ENOSPC as an
# `enforce fail ... file write failed` RuntimeError without the errno.
NEARLY_FULL_BYTES = 64 << 20


def disk_full(err: BaseException, directory: Path) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return isinstance(err, (OSError, RuntimeError)) and shutil.disk_usage(directory).free < NEARLY_FULL_BYTES
    except OSError:
        return False


class ResumeRefused(RuntimeError):
    """The run may not continue as asked; the message says why and what to change."""


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seed_all(seed: int) -> None:
    """Seed every RNG a checkpoint saves (torch and CUDA, numpy's and Python's global ones), so that
    a run's checkpoints are the same bytes run to run, not only its model: nothing in the trainer
    draws from numpy's or Python's global RNG today, but their states are saved and restored."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


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


class RNGState:
    """The process's torch, CUDA, numpy and Python RNG states, as a part."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)


class ModelShape:
    """The model's config (GPTConfig as a dict): a checkpoint resumes only into the model it was saved from."""

    def __init__(self, args: dict[str, Any]):
        self.args = args

    def state_dict(self) -> dict[str, Any]:
        return self.args

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state != self.args:
            raise ResumeRefused(
                f"the checkpoint's model {state} differs from the config's {self.args}; "
                "restore training.model or start a new run_dir"
            )


class PureLR:
    """The LR scheduler's part: the LR is a pure function of the step (StepSchedule.lr_at), so it
    records the step and restores nothing."""

    def __init__(self, step: Callable[[], int]):
        self.step = step

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "warmup_stable_decay", "step": self.step()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SharedKey:
    """Several parts under one key as one flat dict (their keys never collide): the train state is
    the trainer's step and tokens, the run's accounting and the evaluator's history."""

    def __init__(self, *parts: Stateful):
        self.parts = parts

    def state_dict(self) -> dict[str, Any]:
        return {k: v for part in self.parts for k, v in part.state_dict().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part in self.parts:
            part.load_state_dict(state)


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
        self.remove_leftovers()
        try:
            with atomic_path(path) as tmp:
                with open(tmp, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:
            if not disk_full(err, self.dir):
                raise
            free = shutil.disk_usage(self.dir).free
            raise DiskFull(f"No space left on device: checkpoint {path.name} did not fit in {self.dir} ({free:,} bytes "
                           "free); free space or point training.run_dir at a larger disk, then train again to resume "
                           "from the latest checkpoint") from err
        meta = {"step": step, "sha256": sha256_file(path), "bytes": path.stat().st_size, "boundary": boundary}
        with atomic_path(path.with_suffix(".json")) as tmp:
            tmp.write_bytes(dumps_json(meta))
        _fsync_dir(self.dir)
        self.prune()
        return path

    def remove_leftovers(self) -> int:
        """Delete the temporaries (`.step-XXXXXXXX.pt.<random>.tmp`, and a sidecar's) of saves killed
        mid-write, which never reached their own cleanup; returns how many. Only the process that
        writes this directory calls it (the run lock keeps it to one)."""
        removed = 0
        for tmp in self.dir.glob(f".step-*{TEMPORARY_SUFFIX}"):
            tmp.unlink(missing_ok=True)
            removed += 1
        return removed

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


class Checkpointer(CheckpointManager):
    """The checkpoints of `<run_dir>/checkpoints`, filled from `parts` (key -> stateful part, in the
    order the file stores them); `path` is the checkpoint last written or resumed from."""

    def __init__(self, run_dir: str | Path, keep_last: int, parts: dict[str, Stateful], rank: int,
                 mirror: "RunMirror | None"):
        super().__init__(Path(run_dir) / CHECKPOINTS_DIR, keep_last)
        self.run_dir, self.parts, self.rank, self.mirror = Path(run_dir), parts, rank, mirror
        self.path: str | None = None

    def write(self, step: int, boundary: str | None) -> None:
        """Checkpoint `step`: every rank gathers its parts' state, rank 0 writes it (and copies it to
        the data root when that is remote). `boundary` names the phase it closes."""
        state = {key: part.state_dict() for key, part in self.parts.items()}
        if self.rank == 0:
            self.path = str(self.save(step, state, boundary))
            if self.mirror is not None:
                self.mirror.push_checkpoints()

    def load(self, path: str | Path) -> None:
        state = load_checkpoint(path)
        for key in LOAD_ORDER:
            self.parts[key].load_state_dict(state[key])
        self.path = str(path)

    def resume(self, how: str, status: dict[str, Any], allow_exhaustion: bool) -> Path | None:
        """Load the checkpoint the run starts from, enforcing the halted/completed rules of
        status.json, and return it (None: a fresh start). `how`: "never", "auto" (the latest good
        checkpoint) or a checkpoint path (e.g. a previous phase's boundary checkpoint)."""
        path: Path | None
        if how == "never":
            if self.complete():
                raise ResumeRefused(f"{self.run_dir} already has checkpoints; use --resume auto or another run_dir")
            path = None
        elif how == "auto":
            if status.get("state") == "halted":
                flag_changed = (status.get("halt_kind") == "bucket_exhausted" and allow_exhaustion
                                and not status.get("allow_bucket_exhaustion"))
                if not flag_changed:
                    raise ResumeRefused(
                        f"the run halted: {status.get('reason')}. Auto-resume would repeat it; set "
                        "curriculum.allow_bucket_exhaustion: true to continue with renormalized weights, or pass "
                        "--resume PATH to restart from a chosen checkpoint"
                    )
            path = self.latest()
            if path is None and self.complete():
                names = ", ".join(Path(m["path"]).name for m in self.complete())
                raise ResumeRefused(
                    f"every checkpoint in {self.dir} is damaged ({names}); refusing to restart from step 0 over them: "
                    "pass --resume PATH with an intact copy, or archive the run and start over with --fresh"
                )
        else:
            path = Path(how)
        if self.rank == 0 and self.dir.is_dir():
            self.remove_leftovers()
        if path is not None:
            self.load(path)
        return path
