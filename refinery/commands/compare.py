"""`refinery compare ROOT_A ROOT_B`: what a change did to the funnel, then which outputs of two data
roots are identical and which differ.

First a summary of the two roots' funnels (refinery/reports/funnel_diff.py): documents and bytes kept
per stage, bucket and language, removals per rule (as first failing rule and failing at all), and
the tokens of the final shards per bucket and phase, each with the difference: what an experiment
(one threshold changed) did. Two roots that are one folder are refused (exit 2): such a comparison
says SAME whatever the configs say.

Two runs of one config and seed (local and on Ray, today's code and yesterday's, here and on another
machine) must write the same bytes. This walks both local data roots and compares every file by kind:

- JSON and JSON-lines files field by field, without the fields that time a run (`TIMING_FIELDS`,
  `time/...` and `throughput/...` metrics) and with each root's own path read as `<root>` (a
  training status names its checkpoint by absolute path); a difference names the fields.
- Training checkpoints (`.pt`) by their contents (model, optimizer, sampler state, step, tokens, and
  the torch, numpy and Python RNG states, all seeded from the run's seed: training/checkpoint.py
  `seed_all`), so a difference names the fields; their sidecars (`checkpoints/step-N.json`) carry the
  checkpoint file's sha256, which two runs of the same config share. A root written before the
  trainer seeded numpy and Python (before 2026-11-28) differs from a newer one in those two states.
- Every other file (Parquet tables, token shards, models, plots) by its bytes (sha256, read in chunks).

Set aside, uncompared: `stats/` (each partition's counters, which carry wall times and docs/s; the
outputs they count are compared), TensorBoard event files (wall-clock stamps), launch logs, lock
files and temporary names. Memory holds both roots' file names and one JSON or checkpoint file at a
time (bytes are hashed in 1 MiB chunks), never the root's data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from refinery.reports.funnel_diff import format_difference, funnel_difference

# Fields that time a run: the only thing two runs of the same config may disagree on.
TIMING_FIELDS = frozenset({"wall_s", "docs_per_s", "tokens_per_s", "tokens_per_s_per_gpu", "elapsed_s",
                           "started_at", "finished_at", "updated"})
TIMING_PREFIXES = ("time/", "throughput/")
ROOT_MARK = "<root>"
MAX_NAMED_FIELDS = 5  # differing fields named per file; the count says how many more


def is_timing(key: str) -> bool:
    return key in TIMING_FIELDS or key.startswith(TIMING_PREFIXES)


def set_aside(rel: str) -> bool:
    """Files that record how a run went rather than what it made (see the module docstring)."""
    parts = rel.split("/")
    name = parts[-1]
    return (parts[0] == "stats" or "tensorboard" in parts[:-1] or name.endswith((".lock", ".tmp", ".log"))
            or name.startswith("."))


def strip_timing(obj: Any, roots: tuple[str, ...] = ()) -> Any:
    """`obj` without its timing fields, each root's path in its strings read as `<root>`."""
    if isinstance(obj, dict):
        return {k: strip_timing(v, roots) for k, v in obj.items() if not is_timing(str(k))}
    if isinstance(obj, (list, tuple)):
        return [strip_timing(v, roots) for v in obj]
    if isinstance(obj, str):
        for root in roots:
            obj = obj.replace(root, ROOT_MARK)
    return obj


def field_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths (`buckets/web/sha256`, `[3]`) at which two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}/{key}" if path else str(key)
            out += [f"{sub} (only in one)"] if (key in a) != (key in b) else field_differences(a[key], b[key], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in field_differences(x, y, f"{path}[{i}]")]
    if _equal(a, b):
        return []
    return [path or "the value"]


def _equal(a: Any, b: Any) -> bool:
    if type(a).__module__ == "torch" or type(b).__module__ == "torch":
        import torch

        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b)))
    return a == b


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _roots(root: Path) -> tuple[str, ...]:
    """The spellings of a root's path its files may hold, longest first."""
    return tuple(sorted({str(root.absolute()), os.path.realpath(root)}, key=len, reverse=True))


def _load(path: Path, roots: tuple[str, ...]) -> Any:
    if path.suffix == ".json":
        return strip_timing(json.loads(path.read_text(encoding="utf-8")), roots)
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [strip_timing(json.loads(line), roots) for line in f if line.strip()]
    import torch

    return strip_timing(torch.load(path, map_location="cpu", weights_only=True), roots)


def compare_file(a_root: Path, b_root: Path, rel: str) -> str | None:
    """None when the file is the same in both roots, else how it differs."""
    a, b = a_root / rel, b_root / rel
    if a.suffix in (".json", ".jsonl", ".pt"):
        try:
            fields = field_differences(_load(a, _roots(a_root)), _load(b, _roots(b_root)))
        except (ValueError, RuntimeError, OSError, EOFError, pickle.UnpicklingError) as err:  # unreadable: the bytes
            fields = [] if sha256(a) == sha256(b) else [f"the bytes ({type(err).__name__} reading it)"]
        if not fields:
            return None
        more = f" and {len(fields) - MAX_NAMED_FIELDS} more" if len(fields) > MAX_NAMED_FIELDS else ""
        return "fields differ: " + ", ".join(fields[:MAX_NAMED_FIELDS]) + more
    return None if sha256(a) == sha256(b) else "bytes differ"


@dataclass
class Comparison:
    root_a: str
    root_b: str
    identical: list[str] = field(default_factory=list)
    differ: dict[str, str] = field(default_factory=dict)  # file -> how it differs
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # in either root, not compared
    funnel: dict[str, Any] = field(default_factory=dict)  # funnel_difference of the two roots

    @property
    def same(self) -> bool:
        return not (self.differ or self.only_in_a or self.only_in_b)

    def lines(self) -> list[str]:
        out = [f"comparing {self.root_a} (A) with {self.root_b} (B)"]
        if "unreadable" in self.funnel:
            out += [f"no funnel summary: a stats, manifest or shard index file is not what a run writes "
                    f"({self.funnel['unreadable']})", ""]
        elif self.funnel:
            out += format_difference(self.funnel) + [""]
        out.append("Files: every output but stats and timings")
        by_folder: dict[str, int] = {}
        for rel in self.identical:
            folder = rel.rsplit("/", 1)[0] if "/" in rel else "."
            by_folder[folder] = by_folder.get(folder, 0) + 1
        out.append(f"identical: {len(self.identical):,} file(s)")
        out += [f"  {folder}/: {n:,}" for folder, n in sorted(by_folder.items())]
        out.append(f"differ: {len(self.differ):,} file(s)")
        out += [f"  {rel}: {how}" for rel, how in sorted(self.differ.items())]
        for label, files in (("only in A", self.only_in_a), ("only in B", self.only_in_b)):
            if files:
                out.append(f"{label}: {len(files):,} file(s)")
                out += [f"  {rel}" for rel in files]
        out.append(f"set aside, not compared: {len(self.set_aside):,} file(s) (stats/ counters with wall times, "
                   "TensorBoard events, launch logs, locks); JSON compared without its timing fields ("
                   + ", ".join(sorted(TIMING_FIELDS)) + ", time/*, throughput/*)")
        out.append("SAME: every compared output is identical" if self.same else
                   f"DIFFERENT: {len(self.differ) + len(self.only_in_a) + len(self.only_in_b):,} file(s) differ "
                   "or are in one root only")
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "same": self.same}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def compare_roots(root_a: str | Path, root_b: str | Path) -> Comparison:
    """Every file of two local data roots, compared by kind (module docstring)."""
    a, b = Path(root_a), Path(root_b)
    for root in (a, b):
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a folder; give two local data roots (a config's data_root)")
    if os.path.realpath(a) == os.path.realpath(b):
        raise SameFolder(f"{root_a} and {root_b} are one folder ({os.path.realpath(a)}): a comparison of it with "
                         f"itself says SAME whatever made it; give each run its own data_root")
    in_a, in_b = _files(a), _files(b)
    result = Comparison(str(a), str(b))
    from refinery.storage import open_data_root

    try:
        result.funnel = funnel_difference(open_data_root(str(a)), open_data_root(str(b)))
    except (KeyError, TypeError, ValueError) as err:  # a hand-made or older root: files only
        result.funnel = {"unreadable": f"{type(err).__name__}: {err}"}
    result.set_aside = sorted(rel for rel in in_a | in_b if set_aside(rel))
    compared_a, compared_b = in_a - set(result.set_aside), in_b - set(result.set_aside)
    result.only_in_a, result.only_in_b = sorted(compared_a - compared_b), sorted(compared_b - compared_a)
    for rel in sorted(compared_a & compared_b):
        how = compare_file(a, b, rel)
        if how is None:
            result.identical.append(rel)
        else:
            result.differ[rel] = how
    return result


class SameFolder(ValueError):
    """Two roots (or two configs' roots) that resolve to one folder."""


def data_root_of(path: str) -> str:
    """A data root given as a folder, or as the config (`.yaml`) whose local data root it is."""
    if path.endswith((".yaml", ".yml")) and os.path.isfile(path):
        from refinery.config import load_config

        cfg = load_config(path)
        if cfg.data_root.startswith("s3://"):
            raise FileNotFoundError(f"{path}: data root {cfg.data_root} is on S3; compare compares local roots")
        return cfg.resolve(cfg.data_root)
    return path


def run(args: argparse.Namespace) -> int:
    try:
        result = compare_roots(data_root_of(args.root_a), data_root_of(args.root_b))
    except SameFolder as err:
        print(f"refinery compare: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=1) if args.json else "\n".join(result.lines()))
    return 0 if result.same else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="which outputs of two data roots are identical and which differ",
        description="Compare two local data roots: first what a change did to the funnel (documents and bytes "
                    "kept per stage, bucket and language, removals per rule as first failing rule and failing at "
                    "all, final shard tokens per bucket and phase, with the difference), then every file under both, Parquet tables, token shards and "
                    "models by their bytes, JSON and JSON lines field by field without the fields that time a run, "
                    "checkpoints by their contents. It names every file that differs (and the fields of a JSON "
                    "file), every file only one root has, and how many are identical per folder; stats/ counters, "
                    "TensorBoard events, logs and locks are set aside. Exit status 0 when every output is the "
                    "same, 1 when one differs, 2 when both name one folder.",
        epilog="examples:\n  refinery compare out/local out/ray\n"
               "  refinery compare local.yaml ray.yaml --json    # each config's data root",
    )
    p.add_argument("root_a", metavar="ROOT_A", help="a data root folder, or a config whose data root it is")
    p.add_argument("root_b", metavar="ROOT_B", help="the other data root, or its config")
    p.add_argument("--json", action="store_true", help="print one JSON object: funnel (the summary), identical, "
                   "differ, only_in_a, only_in_b, set_aside, same")
    p.set_defaults(func=run)
