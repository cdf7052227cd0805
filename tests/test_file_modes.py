"""Written files follow the umask (issue 38): every atomic write goes through a temporary created
with mode 0666 less the umask, so shards, Parquet tables, manifests, checkpoints, status.json and
the schedule PNG publish with the mode a plain open() gives, not mkstemp's 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import polars as pl
import pytest

from orchestration.cli import main
from refinery.config import load_config
from refinery.storage import LocalDataRoot
from synthetic.curriculum import tiny_run
from training.trainer import RunOptions, Trainer


def modes(folder: Path) -> dict[str, int]:
    """Permission bits of every file under `folder`, by path relative to it."""
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_writer_publishes_files_with_the_umask_mode(tmp_path, monkeypatch, umask):
    monkeypatch.setenv("REFINERY_VERIFIED_DIR", str(tmp_path / "verified"))
    old = os.umask(umask)
    try:
        config = tiny_run(tmp_path, training={"checkpoint_interval": 4, "record_consumption": True})
        cfg = load_config(config)
        root = LocalDataRoot(cfg.resolve(cfg.data_root))
        root.write_parquet("tables/t.parquet", pl.DataFrame({"a": [1, 2]}))
        assert Trainer(cfg, RunOptions(run_dir=str(tmp_path / "run"))).train()["state"] == "completed"
        assert main(["validate", "--config", str(config)]) == 0
    finally:
        os.umask(old)
    written = modes(tmp_path)
    kinds = {".bin", ".idx", ".parquet", ".json", ".npy", ".pt", ".png", ".jsonl"}
    assert kinds <= {Path(p).suffix for p in written}, sorted(written)
    for must in ("run/status.json", "root/curriculum/schedule.png", "root/manifests/anneal.json", "tables/t.parquet"):
        assert any(p.endswith(must) for p in written), must
    assert not any(p.endswith(".tmp") for p in written)
    wrong = {p: oct(m) for p, m in written.items() if m != 0o666 & ~umask}
    assert not wrong, f"umask {oct(umask)}: {wrong}"
