"""Where a training run lives when the data root is remote (s3://...).

The trainer always works in a local run directory: checkpoints are written, fsynced and verified on
local disk, and torch reads them back from there. On a remote data root that directory sits in the
local cache (`$REFINERY_CACHE_DIR/runs/...`), and `RunMirror` keeps its durable copy on the data
root under `training.run_dir`: every checkpoint is uploaded after it is saved (its sidecar last, so
a remote checkpoint without a sidecar is incomplete, as it is locally), pruned checkpoints are
deleted there too, and status follows each status change. The JSON-lines logs (metrics and each
rank's consumption audit) go up in segments of the lines appended since the last push, so each line
crosses the network once; uploading the whole file at every checkpoint would grow with the square of
the run's length. A fresh machine restores the directory from the data root before resuming, so a
run moves between machines through S3. TensorBoard event files stay local.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from refinery.config import RefineryConfig
from refinery.storage import DataRoot, atomic_path, open_data_root
from refinery.storage.s3 import cache_base_dir
from refinery.layout import CHECKPOINTS_DIR, run_key

MIRRORED_FILES = ("status.json",)
LOG_SEGMENTS = "logs"  # <run key>/logs/<log file name>/<first line>-<end line>.jsonl


def is_remote(cfg: RefineryConfig) -> bool:
    return "://" in cfg.data_root


def run_base(cfg: RefineryConfig) -> Path:
    """The local directory that holds `training.run_dir`: inside the data root when it is local,
    else in the local cache, keyed by the data root's URL."""
    if not is_remote(cfg):
        return Path(cfg.resolve(cfg.data_root)) / cfg.training.run_dir
    return cache_base_dir() / "runs" / hashlib.sha256(cfg.data_root.encode()).hexdigest()[:16] / cfg.training.run_dir


def archive_run(cfg: RefineryConfig, run_dir: Path) -> str | None:
    """Move a run directory (and its copy on a remote data root) aside to `<run_dir>.archived-<UTC
    time>`, so a fresh run starts there and the old one stays; None when there was nothing."""
    suffix = time.strftime(".archived-%Y%m%dT%H%M%SZ", time.gmtime())
    mirror = RunMirror.for_run(cfg, run_dir)
    moved = mirror.archive(suffix) if mirror is not None else None
    if Path(run_dir).exists():
        target = Path(str(run_dir) + suffix)
        Path(run_dir).rename(target)
        return str(target)
    return moved


class RunMirror:
    """The data-root copy of one local run directory (`key_prefix` on `root`)."""

    def __init__(self, root: DataRoot, key_prefix: str, local_dir: Path):
        self.root, self.prefix, self.local = root, key_prefix.strip("/"), Path(local_dir)
        self._pushed: dict[str, tuple[int, int]] = {}  # log name -> (lines, bytes) of the local file on the root

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
        key = run_key(cfg.training.run_dir, *relative.parts)
        return cls(open_data_root(cfg.data_root), key, run_dir)

    def archive(self, suffix: str) -> str | None:
        """Copy the run's keys to `<prefix><suffix>/...`, then delete them; None when there were none."""
        keys = self.root.list(self.prefix + "/")
        for key in keys:
            self.root.write_bytes(self.prefix + suffix + key[len(self.prefix):], self.root.read_bytes(key))
        for key in keys:
            self.root.delete(key)
        return self.root.display(self.prefix + suffix) if keys else None

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
        ckpt_dir = self.local / CHECKPOINTS_DIR
        remote = set(self.root.list(run_key(self.prefix, CHECKPOINTS_DIR)))
        local = {self._key(p) for p in ckpt_dir.glob("step-*")} if ckpt_dir.is_dir() else set()
        for side in sorted(ckpt_dir.glob("step-*.json")) if ckpt_dir.is_dir() else ():
            pt = side.with_suffix(".pt")
            if self._key(side) not in remote and pt.is_file():
                self.push(pt)
                self.push(side)
        for key in sorted(remote - local, key=lambda k: not k.endswith(".json")):  # sidecar first, as locally
            self.root.delete(key)

    # ---- JSON-lines logs, in segments -------------------------------------------------------------

    def _segments(self, name: str) -> list[tuple[int, int, str]]:
        """(first line, end line, key) of the root's segments of log `name`, by first line."""
        base = f"{self.prefix}/{LOG_SEGMENTS}/{name}/"
        out = []
        for key in self.root.list(base.rstrip("/")):
            first, _, end = key[len(base):].removesuffix(".jsonl").partition("-")
            if key.startswith(base) and first.isdigit() and end.isdigit():
                out.append((int(first), int(end), key))
        return sorted(out)

    def _write_segment(self, name: str, first: int, data: bytes) -> int:
        end = first + data.count(b"\n")
        self.root.write_bytes(f"{self.prefix}/{LOG_SEGMENTS}/{name}/{first:012d}-{end:012d}.jsonl", data)
        return end

    def push_log(self, path: Path) -> None:
        """Upload the whole lines appended to log `path` since the last push as one segment (a line
        still being written waits for the next push)."""
        if path.name not in self._pushed:
            self.sync_log(path)
        lines, offset = self._pushed[path.name]
        if not path.is_file():
            return
        with open(path, "rb") as f:
            f.seek(offset)
            new = f.read()
        new = new[: new.rfind(b"\n") + 1]
        if new:
            self._pushed[path.name] = (self._write_segment(path.name, lines, new), offset + len(new))

    def sync_log(self, path: Path, intact_lines: int | None = None) -> None:
        """Make the root's segments of log `path` hold the local file's whole lines and no more (resume
        cut the file back to the checkpoint): segments reaching past its end, past its first
        `intact_lines` (resume rewrote the lines after those: a damaged one was dropped) or after a
        gap are deleted, and the lines after the last kept one are pushed again."""
        data = path.read_bytes() if path.is_file() else b""
        data = data[: data.rfind(b"\n") + 1]
        total, kept = data.count(b"\n"), 0
        intact = total if intact_lines is None else min(intact_lines, total)
        for first, end, key in self._segments(path.name):
            if first == kept and end <= intact:
                kept = end
            else:
                self.root.delete(key)
        offset = int(np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n"))[kept - 1]) + 1 if kept else 0
        if kept < total:
            self._write_segment(path.name, kept, data[offset:])
        self.root.delete(self._key(self.local / path.name))  # a whole-file copy an older version mirrored
        self._pushed[path.name] = (total, len(data))

    def _restore_logs(self) -> int:
        """Each log the local directory lacks, joined from its segments up to the first gap."""
        base, restored = f"{self.prefix}/{LOG_SEGMENTS}/", 0
        names = sorted({k[len(base):].split("/", 1)[0] for k in self.root.list(base.rstrip("/")) if k.startswith(base)})
        for name in names:
            target = self.local / name
            if target.exists():
                continue
            parts, end = [], 0
            for first, last, key in self._segments(name):
                if first != end:
                    print(f"refinery train: {self.root.display(key)}: lines {end}-{first} of {name} are missing on the "
                          f"data root; restored the first {end}")
                    break
                parts.append(self.root.read_bytes(key))
                end = last
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(target) as tmp:
                tmp.write_bytes(b"".join(parts))
            restored += 1
        return restored

    def restore(self) -> int:
        """Copy into the local directory every mirrored file and log it lacks; returns how many were
        copied."""
        copied = self._restore_logs()
        logs = f"{self.prefix}/{LOG_SEGMENTS}/"
        for key in sorted(self.root.list(self.prefix), key=lambda k: k.endswith(".json")):  # sidecars last
            if key.startswith(logs):
                continue
            target = self.local / key[len(self.prefix) + 1:]
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(target) as tmp:
                tmp.write_bytes(self.root.read_bytes(key))
            copied += 1
        return copied

