"""Input discovery: the inputs each source's glob matches, as its format's record says
(refinery/stages/readers/formats.py: a DatasetDict's splits for `hf_dataset`), each input as an
input shard, and the batches of them that partition the per-document stages."""

from __future__ import annotations

import glob
import hashlib
import os
import re
from dataclasses import dataclass

from refinery.config import PartitionsConfig, RefineryConfig

def pattern_parts(pattern: str) -> tuple[int, str]:
    """How many leading components of `pattern` hold no glob character (the source's folder), and
    the literal text its last component ends with after its last glob character: every match's
    name ends with that text."""
    parts = pattern.split(os.sep)
    fixed = 0
    while fixed < len(parts) - 1 and not any(c in parts[fixed] for c in "*?["):
        fixed += 1
    last = parts[-1]
    tail = last[max(last.rfind(c) for c in "*?]") + 1:]
    return fixed, tail


def source_folder(pattern: str) -> str | None:
    """The folder of a source's path pattern (the part before its first glob component), which
    every input must stay inside once its symlinks are resolved; None for a URL (no symlinks)."""
    if "://" in pattern:
        return None
    fixed, _ = pattern_parts(pattern)
    return os.sep.join(pattern.split(os.sep)[:fixed]) or (os.sep if pattern.startswith(os.sep) else os.curdir)


def outside_folder(path: str, folder: str) -> str | None:
    """Where `path` really is when, its symlinks resolved, it leaves `folder` (itself resolved, so a
    symlinked data folder still holds its own files); None when it stays inside. A file reached
    through such a link is not the source's, and reading it would put any file on the machine into
    the corpus and its rejects."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return None if os.path.commonpath([real, root]) == root else real


def input_files(cfg: RefineryConfig) -> dict[str, list[str]]:
    """Every source's inputs (files; directories for a folder format), sorted so partition keys are stable."""
    # imported here: loading a config imports no reader package (tests/test_preflight.py)
    from refinery.stages.readers.formats import input_format

    out: dict[str, list[str]] = {}
    for src in cfg.sources:
        pattern = cfg.resolve(src.path)
        out[src.name] = input_format(src.format).inputs(sorted(glob.glob(pattern)), source_folder(pattern))
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


# A path component shown as it is in a key: dot-separated words (no empty, leading or trailing
# dot, so never Dagster's forbidden "..."), letters, digits, "_" and "-" only: safe as a Dagster
# partition key, an S3 key and a file name.
_PLAIN = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # what a snapshot name may not hold (`batch_key`)
_UNSAFE_IN_KEY = re.compile(r"[^A-Za-z0-9_-]+")
_EXTENSIONS = (".warc.gz", ".warc", ".jsonl.gz", ".jsonl", ".ndjson.gz", ".ndjson", ".json.gz", ".json", ".gz",
               ".parquet", ".arrow")
# Between the folders of a key's path (`~`: unreserved in URLs, and in no plain component); a key
# that had to be cleaned or shortened ends in `~~` and a hash of the path, which no plain key holds.
_FOLDER_MARK, _HASH_MARK = "~", "~~"
_READABLE_CHARS = 120  # a longer path is shortened (with its hash): `<key>.parquet` stays a valid file name
_HASH_BYTES = 5  # 10 hex digits, told apart only among paths that clean to the same name


def input_key(source: str, path: str, pattern: str) -> str:
    """The partition key of the input `path` of source `source`, whose glob is `pattern` (resolved):
    `<source>-<path below the source's folder>`, a function of that path alone, so a new file never
    changes an old one's key (nor its doc ids, `<key>/<record>`).

    Folders are joined by `~` (`web-CC-MAIN-2024-10~part-00`). The file's extension is left out
    when the glob fixes it (`*.jsonl.gz`: every match ends with it); otherwise it stays, since
    `a.jsonl` and `a.jsonl.gz` are two files (`*.warc*` gives `web-web-00.warc.gz`). A path with
    other characters (a space, a `+`, non-ASCII), or too long, is cleaned and ends in `~~` and a
    hash of the whole relative path: `a b.jsonl` beside `a_b.jsonl` is `web-a_b~~84e1bb311b`, and
    `web-a_b` stays `a_b.jsonl`'s. The relative path, never the absolute one, keeps keys the same on
    every machine."""
    fixed, tail = pattern_parts(pattern)
    parts = path.rstrip(os.sep).split(os.sep)[fixed:]
    name = parts[-1]
    if len(parts) == len(pattern.split(os.sep)) - fixed:  # the glob's own match, not a DatasetDict's split
        ext = next((e for e in _EXTENSIONS if tail.lower().endswith(e)), "")
        if ext and len(name) > len(ext):
            name = name[: -len(ext)]
    shown = [*parts[:-1], name]
    readable = _FOLDER_MARK.join(shown)
    if all(_PLAIN.fullmatch(p) for p in shown) and len(readable) <= _READABLE_CHARS:
        return f"{source}-{readable}"
    relative = "/".join(parts).encode("utf-8", "surrogateescape")
    digest = hashlib.blake2b(relative, digest_size=_HASH_BYTES).hexdigest()
    cleaned = _FOLDER_MARK.join(_UNSAFE_IN_KEY.sub("_", p) for p in shown)[:_READABLE_CHARS].rstrip(_FOLDER_MARK)
    return f"{source}-{cleaned}{_HASH_MARK}{digest}"


def input_shards(cfg: RefineryConfig) -> list[InputShard]:
    """Every input file as a partition, keyed by `input_key`, in a stable order."""
    shards: list[InputShard] = []
    seen: dict[str, str] = {}
    files = input_files(cfg)
    for src in cfg.sources:
        pattern = cfg.resolve(src.path)
        folder = source_folder(pattern)
        for path in dict.fromkeys(files[src.name]):
            key = input_key(src.name, path, pattern)
            if key in seen:  # two paths, one cleaned name and one 40-bit hash: never silently merged
                raise ValueError(f"inputs {seen[key]} and {path} both have the partition key {key!r}; rename one")
            seen[key] = path
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


def input_file_state(shards: list[InputShard]) -> dict[str, str]:
    """What `refinery demo --changed` compares to see an input edited, added or removed: each file's
    key -> `<size>:<mtime_ns>` (a directory's own, for `hf_dataset`); a file gone is left out. One
    short entry per file of a batch, recorded with the batch's raw_documents."""
    out = {}
    for shard in shards:
        try:
            st = os.stat(shard.path)
        except FileNotFoundError:
            continue
        out[shard.key] = f"{st.st_size}:{st.st_mtime_ns}"
    return out
