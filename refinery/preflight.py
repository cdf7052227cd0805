"""One check of a config before any compute: every problem at once, each naming its field.

`check(path, needs)` loads the YAML and returns every problem it finds, as `field: message` lines:

- YAML nested too deep or whose aliases expand too far, refused before any object is built;
- what the schema and the cross-references reject (refinery/config/: types, unknown fields, a YAML
  `no` read as false, NaN or infinite numbers, thresholds out of range, text with control
  characters, unknown buckets and phases, bucket names unsafe as folder names);
- custom filters that cannot be built: each `stages.custom_filters` entry is imported and built
  here, so a wrong path, a class on another base or bad params stop the command naming the field
  (loading the config runs no user code; this is the one place before a run that does);
- paths: source globs that match no file, eval sets (contamination's and `ablations.eval_sets`),
  `tokenizer.path` and `stages.language.model_path` that name no file (read from the YAML even when the schema rejects it, so these come together);
  a `stages.difficulty.model_path` whose zip directory, array headers or meta are not a reference
  model's (sizes checked from the headers, no array read);
- inputs that cannot be read: a glob match that is a directory, FIFO, dangling symlink or symlink
  loop (or, for `hf_dataset`, not a save_to_disk directory), a Parquet or Arrow table without the
  source's text (or id) column (its schema only is read), and a glob that reaches into the data root
  (a match whose symlinks lead out of the source's folder is not opened: ingest counts it as one
  `ingest/outside_source` reject and reads nothing of it);
- a data root that is a file, or a local one that cannot be written;
- for a command that sends work to Ray (a graph run, the definitions, `validate`), a cluster that
  does not answer at `execution.address` within a few seconds (one gRPC call that only a Ray head
  serves), or `host-cluster` with no cluster registered on this host;
- what the command needs: the quality classifier's buckets fed by a source, a curriculum to train;
- the difficulty score's reference buckets: declared buckets, and (unless `stages.difficulty.model_path`
  names a model) fed by a source.

`require(path, needs)` raises `PreflightError` listing them all; every `refinery` command and the
Dagster definitions call it before they start. Nothing here leaves anything under the data root
(the writability probe makes an empty folder in it, or in its nearest existing parent, and removes
it at once) and the only network call is the Ray probe: an `s3://` data root is not probed.
"""

from __future__ import annotations

import copy
import errno
import fnmatch
import glob
import importlib.util
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from refinery.config import (ConfigError, CustomFilterConfig, RefineryConfig, field_path, parse_config,
                             read_yaml)
from refinery.config.execution import HOST_CLUSTER, resolve_address, unreachable
from refinery.config.paths import CHECKOUT, FILE_FIELDS, SHIPPED_LABELLED_SETS, dotted
from refinery.documents.inputs import outside_folder, source_folder
from refinery.stages.readers.formats import InputFormat, known_format


@dataclass(frozen=True)
class Needs:
    """What the command about to run will touch. `sources`: it reads the input files (a graph run);
    `eval_sets`: it scans for contamination; `curriculum`: it trains on or checks the curriculum;
    `schedule`: it builds phase manifests, so the curriculum's blocking errors that need no corpus
    (weights, shares, phase names: what `refinery train` refuses) stop it too; `writes`: it writes
    under the data root; `cluster`: it sends work to the Ray cluster the config names (or checks a
    config that will), so that cluster must answer."""

    sources: bool = False
    eval_sets: bool = False
    curriculum: bool = False
    schedule: bool = False
    writes: bool = False
    cluster: bool = False


# The whole graph: ingest, scans, manifests and training.
GRAPH = Needs(sources=True, eval_sets=True, curriculum=True, schedule=True, writes=True, cluster=True)
# The Dagster definitions: a config without a curriculum loads (the graph just has no phases).
DEFINITIONS = Needs(sources=True, eval_sets=True, writes=True, cluster=True)
READ_ONLY = Needs()


class PreflightError(ConfigError):
    """A config with problems found before any work; `problems` lists them, `field: message` each."""

    def __init__(self, origin: str, problems: list[str]):
        head = f"{origin}: {len(problems)} problem(s) found before any work started; nothing was run or written"
        super().__init__("\n".join([head, *(f"  {p}" for p in problems)]), problems)


def _items(data: Any, *keys: str) -> list[Any]:
    """`data[k1][k2]...` as a list (a missing or wrongly typed level gives []): the raw YAML, so path
    checks run even when the schema rejects another field."""
    for k in keys:
        data = data.get(k) if isinstance(data, dict) else None
    return data if isinstance(data, list) else []


def _value(data: Any, *keys: str) -> Any:
    for k in keys:
        data = data.get(k) if isinstance(data, dict) else None
    return data


def _resolve(base_dir: Path, path: str) -> str:
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.normpath(base_dir / path)


def not_a_file(path: str) -> str | None:
    """What a glob match is when it is not a readable regular file (None: it is one)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop"
        if os.path.islink(path):
            return f"a dangling symlink (to {os.readlink(path)})"
        return f"not readable ({err.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "not a regular file (a socket or device)"


def _folder_problem(path: str, fmt: InputFormat) -> str | None:
    """What a match of a folder format (`hf_dataset`) is when it is no input of it (None: it is one)."""
    kind = not_a_file(path)
    if kind is None:
        return f"a file (an {fmt.name} source matches directories saved with save_to_disk)"
    if kind != "a directory":
        return kind
    if not any(os.path.isfile(os.path.join(path, name)) for name in fmt.folder_marks):
        return f"a directory without {' or '.join(fmt.folder_marks)} (not saved with save_to_disk)"
    return None


def _missing_columns(names: list[str], src: dict) -> list[tuple[str, str]]:
    """(field, column) of each column a table source reads that the table lacks."""
    wanted = [("text_field", src.get("text_field", "text")), ("id_field", src.get("id_field"))]
    return [(field, column) for field, column in wanted if isinstance(column, str) and column not in names]


def source_file_problems(src: dict, i: int, matched: list[str], folder: str) -> list[str]:
    """Glob matches that cannot be read as the source's format: a directory, FIFO, dangling
    symlink or symlink loop where a file is expected (a file or a bare folder where a dataset is),
    and a table without the column the source reads its text (or id) from. A match whose symlinks
    lead out of the source's `folder` is left to ingest, which counts it (`ingest/outside_source`)
    without opening it: nothing of it is read here either, not even its columns."""
    # An unknown format is the config schema's refusal: its matches are checked as files, no columns.
    fmt = known_format(src.get("format"))
    in_folders = fmt is not None and fmt.is_folder
    problems = []
    for path in matched:
        if outside_folder(path, folder) is not None:
            continue
        kind = _folder_problem(path, fmt) if in_folders else not_a_file(path)
        if kind is not None:
            problems.append(f"sources[{i}].path: {path} is {kind}; narrow the glob so it matches only "
                            f"{'save_to_disk directories' if in_folders else 'files'}")
            continue
        for file, names in fmt.schemas(path) if fmt is not None and fmt.schemas is not None else ():
            for field, column in _missing_columns(names, src):
                problems.append(f"sources[{i}].{field}: {file} has no column {column!r}; its columns are {names}; "
                                f"set {field} to one of them")
    return problems


def _glob_reaches(pattern: str, root: str) -> bool:
    """Whether a (non-recursive) glob can match the folder `root` or a path inside it: each of
    root's components matches the pattern's component at its place, as glob.glob matches them."""
    parts, root_parts = Path(pattern).parts, Path(root).parts
    if len(parts) < len(root_parts):
        return False
    for part, name in zip(parts, root_parts):
        if name.startswith(".") and not part.startswith("."):
            return False  # glob's `*` skips hidden names
        if not fnmatch.fnmatchcase(name, part):
            return False
    return True


def data_root_in_source_problems(data: Any, base_dir: Path) -> list[str]:
    """Source globs that reach into a local data root: the run's own outputs would be read back as
    input on the next run."""
    root = _value(data, "data_root")
    if not isinstance(root, str) or "://" in root:
        return []
    roots = {_resolve(base_dir, root), os.path.realpath(_resolve(base_dir, root))}
    problems = []
    for i, src in enumerate(_items(data, "sources")):
        path = src.get("path") if isinstance(src, dict) else None
        if not isinstance(path, str) or "://" in path:
            continue
        pattern = _resolve(base_dir, path)
        inside = [m for m in glob.glob(pattern)
                  if any(os.path.realpath(m) == r or os.path.realpath(m).startswith(r + os.sep) for r in roots)]
        if any(_glob_reaches(pattern, r) for r in roots) or inside:
            problems.append(f"sources[{i}].path: glob {path!r} reaches into the data root {_resolve(base_dir, root)}, "
                            f"so the run's own outputs would be read back as input; move data_root out of the "
                            f"sources' folders or narrow the glob")
    return problems


def path_problems(data: Any, base_dir: Path, needs: Needs) -> list[str]:
    """Input paths of the raw config that name nothing, or that match what cannot be read."""
    problems: list[str] = []
    dynamic = _value(data, "partitions", "dynamic") is True
    if needs.sources:
        for i, src in enumerate(_items(data, "sources")):
            path = src.get("path") if isinstance(src, dict) else None
            if not isinstance(path, str) or "://" in path:
                continue
            matched = sorted(glob.glob(_resolve(base_dir, path)))
            if not matched and not dynamic:  # dynamic batches are registered as files arrive
                where = "" if os.path.isabs(path) else f" (relative to the config's folder: {_resolve(base_dir, path)})"
                problems.append(f"sources[{i}].path: glob {path!r} matches no file{where}")
            problems += source_file_problems(src, i, matched, source_folder(_resolve(base_dir, path)))
    if needs.sources or needs.writes:  # what a command writes there (validate's schedule plot too) lands in an input folder
        problems += data_root_in_source_problems(data, base_dir)
    if needs.eval_sets:
        for i, es in enumerate(_items(data, "contamination", "eval_sets")):
            path = es.get("path") if isinstance(es, dict) else None
            if isinstance(path, str) and not os.path.isfile(_resolve(base_dir, path)):
                problems.append(f"contamination.eval_sets[{i}].path: {_resolve(base_dir, path)} is not a file; "
                                f"give a JSONL file of {{\"id\", \"text\"}} lines (a relative path starts at the "
                                f"config's folder)")
        for i, path in enumerate(_items(data, "ablations", "eval_sets")):
            if isinstance(path, str) and not os.path.isfile(_resolve(base_dir, path)):
                problems.append(f"ablations.eval_sets[{i}]: {_resolve(base_dir, path)} is not a file; give a JSONL "
                                f"file of {{\"id\", \"text\"}} lines (a relative path starts at the config's folder)")
    if needs.sources:
        for keys in FILE_FIELDS:
            field, path = dotted(keys), _value(data, *keys)
            if isinstance(path, str) and not os.path.isfile(_resolve(base_dir, path)):
                problems.append(f"{field}: {_resolve(base_dir, path)} is not a file (nothing is downloaded; "
                                f"give a local file, or remove {field} for the default)")
            elif isinstance(path, str) and field == "stages.difficulty.model_path":
                from refinery.models.difficulty import DifficultyModelError, check_model_file

                try:
                    check_model_file(_resolve(base_dir, path))
                except DifficultyModelError as err:
                    problems.append(f"{field}: {err}")
        problems += shipped_labelled_problems(data)
    return problems


def shipped_labelled_problems(data: Any) -> list[str]:
    """The shipped labelled pages a config without stages.quality.labelled_set trains on must be
    there (an install without the checkout's data/ folder lacks them)."""
    quality = _value(data, "stages", "quality")
    quality = quality if isinstance(quality, dict) else {}
    if quality.get("enabled", True) is False or quality.get("labelled_set") or quality.get("shipped_labelled_pages") is False:
        return []
    missing = [str(CHECKOUT / path) for path, _ in SHIPPED_LABELLED_SETS if not (CHECKOUT / path).is_file()]
    if not missing:
        return []
    return [f"stages.quality.shipped_labelled_pages: {', '.join(missing)} not found (an install without the checkout's "
            "data/ folder); give stages.quality.labelled_set, or set shipped_labelled_pages: false to train on the "
            "buckets alone"]


def custom_filter_problems(data: Any, base_dir: Path) -> list[str]:
    """Import and build every custom filter of the raw config now, so a wrong path, a class on
    another base or bad params fail before any work, naming the field, not in the middle of a run.
    An entry the schema rejects is not built: the schema's problem names it already."""
    entries = _items(data, "stages", "custom_filters")
    if not entries:
        return []  # nothing to build: a command on a config without custom filters skips the stages' imports (polars)
    from refinery.stages.custom import CustomFilterError, build_custom_filter

    problems: list[str] = []
    for i, raw in enumerate(entries):
        try:
            spec = CustomFilterConfig.model_validate(raw)
        except ValidationError:
            continue
        try:
            build_custom_filter(spec, str(base_dir))
        except CustomFilterError as err:
            problems.append(f"stages.custom_filters[{i}].{err.field}: {err}")
    return problems


def data_root_problems(data: Any, base_dir: Path, needs: Needs) -> list[str]:
    root = _value(data, "data_root")
    if not isinstance(root, str) or root.startswith("s3://"):
        return []  # the schema reports a missing one; S3 is not probed (no network calls here)
    path = Path(_resolve(base_dir, root))
    if path.exists() and not path.is_dir():
        return [f"data_root: {path} is a file; point data_root at a folder (it is created when missing)"]
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return [f"data_root: {existing} is a file, so {path} cannot be created; point data_root at a folder"]
    if not needs.writes:
        return []
    try:  # access(2) says yes to root on a read-only mount's neighbours and ignores ACLs: try it
        os.rmdir(tempfile.mkdtemp(prefix=".refinery-preflight-", dir=existing))
    except OSError as err:
        return [f"data_root: {path} is not writable: making a folder in {existing} failed ({err.strerror}); "
                f"choose a folder you can write to"]
    return []


def needs_problems(cfg: RefineryConfig, needs: Needs) -> list[str]:
    """What this command needs of a config that is valid on its own: a quality classifier with data,
    a curriculum that phase manifests can be built from."""
    problems: list[str] = []
    if needs.schedule and cfg.curriculum is not None:
        from refinery.curriculum import structure_findings  # here: only a command that builds phases pays for it

        problems += [str(f) for f in structure_findings(cfg)]
    q = cfg.stages.quality
    fed = {s.bucket for s in cfg.sources}
    if q.enabled and needs.sources:
        for field in ("positive_buckets", "negative_buckets"):
            buckets = getattr(q, field)
            if not fed & set(buckets):
                which = "is the default" if field not in q.model_fields_set else "names"
                problems.append(
                    f"stages.quality.{field}: {buckets} {which}, and no source feeds any of those buckets (sources feed "
                    f"{sorted(fed)}); set stages.quality.{field} to buckets of your sources, or stages.quality.enabled: "
                    f"false to run without a quality classifier"
                )
    for field, on_ray in (("execution.engine", cfg.execution.engine == "ray"),
                          ("training.launch", cfg.training.launch == "ray")):
        if on_ray and importlib.util.find_spec("ray") is None:
            problems.append(f"{field}: ray, and the `ray` package is not installed here; install it "
                            f"(pip install 'refinery[ray]') or use {field.split('.')[1]}: local")
    if cfg.training.launch == "ray" and cfg.execution.address is None:
        problems.append(f"training.launch: ray needs the cluster's address in execution.address (host:port of the "
                        f"head, ray://host:port or {HOST_CLUSTER})")
    return problems + cluster_problems(cfg, needs) + difficulty_problems(cfg, needs)


def cluster_problems(cfg: RefineryConfig, needs: Needs) -> list[str]:
    """The Ray cluster a command will send work to, when no Ray head answers there (one gRPC call,
    PROBE_TIMEOUT_S at most: `unreachable`) or `host-cluster` finds none registered here."""
    address = cfg.execution.address
    if not needs.cluster or address is None or "ray" not in (cfg.execution.engine, cfg.training.launch):
        return []
    if importlib.util.find_spec("grpc") is None:
        return []  # no Ray here (Ray brings grpc): `needs_problems` says so
    field = "execution.engine" if cfg.execution.engine == "ray" else "training.launch"
    try:
        resolved = resolve_address(address)
    except ValueError as err:
        return [f"execution.address: {err} ({field}: ray)"]
    why = unreachable(resolved)
    if why is None:
        return []
    named = address if resolved == address else f"{address} ({resolved})"
    return [f"execution.address: no Ray cluster answers at {named}: {why} ({field}: ray); start the head "
            f"(`ray start --head --port`) or correct the address"]


def difficulty_problems(cfg: RefineryConfig, needs: Needs) -> list[str]:
    """Reference buckets of the difficulty model that are not declared, or (for a graph run that
    trains the model) that no source feeds."""
    d = cfg.stages.difficulty
    field = "stages.difficulty.reference_buckets"
    unknown = [b for b in d.reference_buckets or [] if b not in cfg.buckets]
    if unknown:
        return [f"{field}: unknown bucket(s) {unknown}; use buckets of `buckets:` ({sorted(cfg.buckets)})"]
    buckets = d.reference_buckets if d.reference_buckets is not None else cfg.stages.quality.positive_buckets
    fed = {s.bucket for s in cfg.sources}
    if d.enabled and needs.sources and d.model_path is None and not fed & set(buckets):
        which = "names" if d.reference_buckets is not None else "is stages.quality.positive_buckets by default,"
        return [f"{field}: {buckets} {which} and no source feeds any of those buckets (sources feed {sorted(fed)}), "
                f"so the difficulty model has nothing to train on; set {field} to buckets of your sources, name a "
                f"model in stages.difficulty.model_path, or set stages.difficulty.enabled: false"]
    return []


def _without(data: dict, locations: list[tuple]) -> tuple[dict, list[str]]:
    """A copy of `data` without the values the schema rejected, and their paths: a YAML boolean
    becomes the word it was read from (`no`, `yes`), anything else loses its deepest mapping key
    (a bad list item drops its list) and takes the default."""
    out = copy.deepcopy(data)
    removed = []
    for loc in locations:
        node, parent, last, path, walked = out, None, None, [], True
        for key in loc:
            if isinstance(node, dict) and key in node:
                last = (node, key, len(path) + 1)
            elif not (isinstance(node, list) and isinstance(key, int) and key < len(node)):
                walked = False
                break
            parent, path, node = node, [*path, key], node[key]
        if walked and isinstance(node, bool):
            parent[path[-1]] = "yes" if node else "no"
            removed.append(field_path(path))
        elif last is not None:
            mapping, key, depth = last
            mapping.pop(key, None)
            removed.append(field_path(path[:depth]))
    return out, removed


def _beyond_the_schema(data: dict, base_dir: Path, origin: str, err: ConfigError, needs: Needs) -> list[str]:
    """The cross-reference and command problems of a config whose schema failed: checked again with
    the rejected fields left at their defaults, leaving out what concerns those fields."""
    if not err.locations or not isinstance(data, dict) or any(not loc for loc in err.locations):
        return []  # a whole-config check failed: the fields passed, and its problems are all there
    retry, removed = _without(data, err.locations)
    try:
        found = needs_problems(parse_config(retry, base_dir=str(base_dir), origin=origin), needs)
    except ConfigError as again:
        found = again.problems
    return [p for p in found if not p.startswith(tuple(removed))]


def check(path: str | os.PathLike, needs: Needs = READ_ONLY) -> tuple[RefineryConfig | None, list[str]]:
    """The loaded config (None when it does not load) and every problem found, `field: message` each."""
    p = Path(path)
    try:
        data = read_yaml(p)
    except ConfigError as err:
        return None, err.problems
    base_dir = p.resolve().parent
    cfg, problems = None, []
    try:
        cfg = parse_config(data, base_dir=str(base_dir), origin=str(p))
    except ConfigError as err:
        problems.extend(err.problems)
        problems += [q for q in _beyond_the_schema(data, base_dir, str(p), err, needs) if q not in problems]
    problems += custom_filter_problems(data, base_dir)
    problems += path_problems(data, base_dir, needs)
    problems += data_root_problems(data, base_dir, needs)
    if needs.curriculum and _value(data, "curriculum") is None:
        problems.append("curriculum: no curriculum declared; add a `curriculum:` section with total_tokens and phases "
                        "(see configs/demo.yaml): this command trains on it or checks it")
    if cfg is not None:
        problems += needs_problems(cfg, needs)
    return cfg, problems


def require(path: str | os.PathLike, needs: Needs = READ_ONLY) -> RefineryConfig:
    """The loaded config, or PreflightError listing every problem."""
    cfg, problems = check(path, needs)
    if problems or cfg is None:
        raise PreflightError(str(path), problems)
    return cfg
