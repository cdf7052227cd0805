"""Input discovery: the files each source's glob matches (a DatasetDict's splits for `hf_dataset`),
each file as an input shard, and the batches of them that partition the per-document stages."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from dataclasses import dataclass

from refinery.config import PartitionsConfig, RefineryConfig

# A DatasetDict saved with `save_to_disk`: its directory holds this index of its splits.
HF_DATASET_DICT = "dataset_dict.json"


def hf_dataset_dirs(paths: list[str]) -> list[str]:
    """The `save_to_disk` Dataset directories among `paths`: a DatasetDict's directory stands for its
    splits, in the order its dataset_dict.json lists them. Anything else stays, to be refused by
    name when it is read."""
    out: list[str] = []
    for path in paths:
        index = os.path.join(path, HF_DATASET_DICT)
        if os.path.isfile(index):
            with open(index) as f:
                out += [os.path.join(path, split) for split in json.load(f).get("splits", [])]
        else:
            out.append(path)
    return out


def source_folder(pattern: str) -> str | None:
    """The folder of a source's path pattern (the part before its first glob component), which
    every input must stay inside once its symlinks are resolved; None for a URL (no symlinks)."""
    if "://" in pattern:
        return None
    parts = pattern.split(os.sep)
    fixed = 0
    while fixed < len(parts) - 1 and not any(c in parts[fixed] for c in "*?["):
        fixed += 1
    return os.sep.join(parts[:fixed]) or (os.sep if pattern.startswith(os.sep) else os.curdir)


def outside_folder(path: str, folder: str) -> str | None:
    """Where `path` really is when, its symlinks resolved, it leaves `folder` (itself resolved, so a
    symlinked data folder still holds its own files); None when it stays inside. A file reached
    through such a link is not the source's, and reading it would put any file on the machine into
    the corpus and its rejects."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return None if os.path.commonpath([real, root]) == root else real


def input_files(cfg: RefineryConfig) -> dict[str, list[str]]:
    """Every source's inputs (files; directories for `hf_dataset`), sorted so partition keys are stable."""
    out: dict[str, list[str]] = {}
    for src in cfg.sources:
        matched = sorted(glob.glob(cfg.resolve(src.path)))
        out[src.name] = hf_dataset_dirs(matched) if src.format == "hf_dataset" else matched
    return out


@dataclass(frozen=True)
class InputShard:
    """One input file: the unit of every per-document table, rejects table and stats file."""

    key: str  # the Dagster partition key
    source: str
    bucket: str
    path: str
    # The source's folder, which `path` must resolve into to be read (None: not checked).
    folder: str | None = None


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_EXTENSIONS = (".warc.gz", ".warc", ".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz", ".parquet", ".arrow")


def _stem(path: str) -> str:
    name = os.path.basename(path.rstrip("/"))
    parent = os.path.dirname(path.rstrip("/"))
    if os.path.isfile(os.path.join(parent, HF_DATASET_DICT)):
        name = f"{os.path.basename(parent)}_{name}"  # a DatasetDict's split: the dataset and the split
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    return _UNSAFE.sub("_", name) or "file"


def input_shards(cfg: RefineryConfig) -> list[InputShard]:
    """Every input file as a partition, keyed `<source>-<file stem>`, in a stable order."""
    shards: list[InputShard] = []
    seen: set[str] = set()
    for src in cfg.sources:
        folder = source_folder(cfg.resolve(src.path))
        for path in input_files(cfg)[src.name]:
            key = f"{src.name}-{_stem(path)}"
            n = 2
            while key in seen:
                key = f"{src.name}-{_stem(path)}-{n}"
                n += 1
            seen.add(key)
            shards.append(InputShard(key=key, source=src.name, bucket=src.bucket, path=path, folder=folder))
    return shards


@dataclass(frozen=True)
class InputBatch:
    """A batch of input files of one source: the partition of the per-document stages. Outputs,
    rejects and stats stay per file (keyed by `InputShard.key`) inside it."""

    key: str  # the Dagster partition key
    source: str
    shards: tuple[InputShard, ...]


def batch_key(shard: InputShard, settings: PartitionsConfig) -> str:
    """The batch a file belongs to. It depends only on the file's own key and path, never on the
    other files, so adding input never moves a file to another batch."""
    if settings.by == "file":
        return shard.key
    group = shard.source
    if settings.snapshot_pattern is not None:
        found = re.search(settings.snapshot_pattern, shard.path)
        if found is not None:
            group = f"{group}-{_UNSAFE.sub('_', found.group(1))}"
    digest = hashlib.blake2b(shard.key.encode(), digest_size=8).digest()
    width = len(str(settings.count - 1))
    return f"{group}-b{int.from_bytes(digest, 'big') % settings.count:0{width}d}"


def input_batches(cfg: RefineryConfig) -> list[InputBatch]:
    """The non-empty batches of the current input files, ordered by their first file."""
    members: dict[str, list[InputShard]] = {}
    for shard in input_shards(cfg):
        members.setdefault(batch_key(shard, cfg.partitions), []).append(shard)
    return [InputBatch(key, shards[0].source, tuple(shards)) for key, shards in members.items()]


def batch_shards(cfg: RefineryConfig, keys: list[str]) -> list[InputShard]:
    """The files of the named batches, in input order: what a run over those partitions reads."""
    wanted = set(keys)
    known = {b.key for b in input_batches(cfg)}
    unknown = sorted(wanted - known)
    if unknown:
        raise KeyError(f"no input batch {unknown[0]!r} (partitions.by: {cfg.partitions.by}); "
                       f"known: {sorted(known)[:10]}")
    return [s for b in input_batches(cfg) if b.key in wanted for s in b.shards]
