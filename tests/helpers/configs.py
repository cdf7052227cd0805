"""Config files that tests write: a hand-made config dict as YAML, and configs/demo.yaml moved
out of the repo (its data root into a temp folder) in one of two ways.

- `demo_config`: the demo's input paths made absolute, so the copy can live in any folder.
- `write_beside_sample`: the demo's relative paths kept; the copy goes to `workdir/configs/`
  with `workdir/data` linked to the repo's data/, so `../data/sample/...` resolves as in the repo
  (what a subprocess, a code server or an S3 data root sees is the demo as written).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from refinery.config.paths import rebase_paths

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"


def write_config(folder: Path, data: dict, name: str = "refinery.yaml") -> Path:
    """`data` as YAML in `folder/name`; returns the path."""
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def read_demo() -> dict:
    """configs/demo.yaml as written, its paths relative to configs/."""
    return yaml.safe_load(DEMO.read_text())


def demo_config(data_root: Path | str) -> dict:
    """configs/demo.yaml with its data root at `data_root` and every input path (sources, eval
    sets, the quality classifier's labelled set) made absolute."""
    data = rebase_paths(read_demo(), DEMO.parent)
    data["data_root"] = str(data_root)
    return data


def write_beside_sample(workdir: Path, name: str, data: dict) -> str:
    """`data` (the demo's layout: paths relative to configs/) as `workdir/configs/<name>.yaml`, with
    `workdir/data` linked to the repo's data/; returns the path."""
    configs = workdir / "configs"
    configs.mkdir(exist_ok=True)
    if not (workdir / "data").exists():
        (workdir / "data").symlink_to(REPO / "data")
    path = configs / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# The demo curriculum's budget, quartered: each phase stays a whole number of optimizer steps (8, 104,
# 16 and 4 steps of 4 rows) and the graph still trains every phase, in a quarter of the time. For
# tests that check the graph's flow through training, not what it learns.
QUARTER_DEMO_TOKENS = 327_680 // 4


def with_quarter_curriculum(data: dict) -> dict:
    """`data` (a demo config dict) with its curriculum's total_tokens quartered."""
    assert data["curriculum"]["total_tokens"] == 4 * QUARTER_DEMO_TOKENS, "the demo's budget changed: revisit"
    data["curriculum"]["total_tokens"] = QUARTER_DEMO_TOKENS
    return data
