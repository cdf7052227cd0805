"""The provenance every asset's materialization records, and the metadata values it is drawn with.

`provenance_metadata` is the one function that turns what an asset did into metadata: every one of
the 20 assets carries the same `PROVENANCE_KEYS` (counts in and out, retention, bytes, wall time,
config, code version, content hashes, sample rows), under the same names and in the same order.
Where an asset has no such thing (a tokenizer has no sample rows, a manifest no bytes in, a training
phase no documents in and out) the key is left out rather than shown as a row of "n/a"; every asset
has `ALWAYS_KEYS`, and a document stage all of them, which the tests hold it to.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import dagster as dg
import polars as pl

from refinery.config.training import LAUNCH_FIELDS
from refinery.stages import registry
from refinery.stages.stage_tables import SAMPLE_ROWS
from refinery.stages.stats import StageStats
from refinery.storage.base import atomic_path

SAMPLE_CHARS = 160
TOP_REASONS = 10
# The asset page draws a markdown value in place below this length (dagster-webserver's MetadataEntry).
MARKDOWN_INLINE_CHARS = 1000
PLOTS_LOG_FOLDER = "refinery_plots"  # beside the instance's compute logs, where `/logs/` serves plots from

PROVENANCE_KEYS = (
    "docs_in", "docs_out", "retention", "bytes_in", "bytes_out", "byte_retention", "removed_by_rule", "counters",
    "wall_s", "docs_per_s", "config", "code_version", "content_hashes", "sample_rows",
)
ALWAYS_KEYS = ("wall_s", "config", "code_version", "content_hashes")  # every asset has these


def module_parts(module: ModuleType) -> dict[str, str]:
    """A module's source by its name; a package's, every module file under it by `<package>/<path>`,
    in path order (a rule family or a reader lives in its own file, and editing one must change the
    stage's version)."""
    if not hasattr(module, "__path__"):
        return {module.__name__: inspect.getsource(module)}
    folders = [Path(folder) for folder in module.__path__]
    files = sorted((p, folder) for folder in folders for p in folder.rglob("*.py"))
    return {f"{module.__name__}/{p.relative_to(folder).as_posix()}": p.read_text(encoding="utf-8") for p, folder in files}


# What each code version was hashed from: its parts (a module, a package's file, a stage's registry
# record) by name, each as a short hash of its text, so that `refinery demo --changed` can name the
# parts that moved between two versions (orchestration/changed.py). Filled as the definitions are
# built; a few entries per asset.
CODE_PARTS: dict[str, dict[str, str]] = {}


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# The config each asset's output depends on: dotted paths into the config (`stages.heuristic`,
# `seed`). Its Dagster code version carries their digest (`with_config_version`), so an edited value
# shows as a changed version in the UI and to `refinery demo --changed`, for the assets that read
# it and no others. Where the paths run to a section, a field added to it later is covered. The
# funnel's assets read what refinery/stages/registry.py says.
CONFIG_READ: dict[str, tuple[str, ...]] = {
    **registry.config_read(),
    "funnel_report": (),
    "tokenizer": ("seed", "buckets", "tokenizer"),
    "difficulty_model": ("seed", "stages.difficulty"),
    "tokenized_shards": ("tokenizer", "shards", "stages.difficulty"),
    "shuffled_shards": ("seed", "shards"),
    "lineage_index": ("shards",),
    "phase_manifests": ("seed", "buckets", "shards", "curriculum", "training"),
    "contamination_scan": ("curriculum", "contamination"),
    "training_run": ("seed", "curriculum", "training"),
    # A variant re-applies the safety filter and PII redaction to the documents it lets back in and
    # holds out documents by stages.quality's curated buckets (refinery/ablations/); the proxy runs
    # train a config derived from the training and ablations sections (build.py variant_config).
    "ablation_variants": ("seed", "buckets", "sources", "stages.language", "stages.custom_filters", "stages.quality",
                          "stages.pii", "stages.safety", "stages.record_timeout_s", "tokenizer", "shards",
                          "contamination.eval_sets", "ablations"),
    "ablation_runs": ("seed", "tokenizer", "training", "ablations"),
    "ablation_report": ("ablations",),
    # The schedule runs scale the curriculum's phase table (assets/ablation_schedules.py).
    "ablation_schedule_runs": ("seed", "tokenizer", "training", "curriculum", "ablations"),
    "ablation_anneal_runs": ("seed", "tokenizer", "training", "curriculum", "ablations"),
    "ablation_schedule_report": ("ablations",),
}


def config_values(cfg: Any, paths: tuple[str, ...]) -> dict[str, Any]:
    """The values at `paths` of the config, as JSON, less the trainer's launch fields: where the
    trainer runs changes none of its outputs."""
    data = cfg.model_dump(mode="json", exclude={"training": set(LAUNCH_FIELDS)})
    values = {}
    for path in paths:
        value = data
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        values[path] = value
    return values


def config_digest(cfg: Any, paths: tuple[str, ...]) -> str:
    """A short hash of `config_values` (each with its path)."""
    return hashlib.sha256(json.dumps(config_values(cfg, paths), sort_keys=True).encode()).hexdigest()[:8]


def config_versioned(cfg: Any) -> Callable[[dg.AssetSpec], dg.AssetSpec]:
    """What `Definitions.map_asset_specs` applies: an asset's spec whose code version is its code's
    and the digest of the config it reads (`CONFIG_READ`), `<code>-c<config>`."""
    def spec_with_config(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        if name not in CONFIG_READ:
            raise ValueError(f"asset {name!r} has no entry in assets/provenance.py CONFIG_READ: name the config "
                             f"paths its output depends on (an empty tuple when none)")
        return spec.replace_attributes(code_version=f"{spec.code_version}-c{config_digest(cfg, CONFIG_READ[name])}")

    return spec_with_config


def code_version(*objs: Any) -> str:
    """A short hash of the sources of the modules that define `objs` (modules, packages, classes,
    functions), in order: changes when the logic does. One object's hash is its module's source's alone."""
    modules = [o if inspect.ismodule(o) else sys.modules[o.__module__] for o in objs]
    parts = {name: src for m in modules for name, src in module_parts(m).items()}
    version = _short_hash("\n".join(src for m in modules for src in module_parts(m).values()))
    CODE_PARTS[version] = {name: _short_hash(src) for name, src in parts.items()}
    return version


def combined_version(*versions: str) -> str:
    """One version over several code versions (an asset built from several groups of modules), its
    parts theirs together."""
    version = _short_hash("".join(versions))
    CODE_PARTS[version] = {name: h for v in versions for name, h in CODE_PARTS.get(v, {}).items()}
    return version


def stage_code_version(name: str, version: str) -> str:
    """`version` (the code of a funnel stage's asset) with the stage's record in the registry folded in:
    editing that stage's upstream, verdicts or added columns changes its asset's version, no other's."""
    record = repr(registry.funnel_stage(name))
    staged = _short_hash(f"{version}\n{record}")
    CODE_PARTS[staged] = {**CODE_PARTS.get(version, {}), f"the registry's record of {name}": _short_hash(record)}
    return staged


def output_data_version(content_hashes: dict[str, str]) -> str:
    """The data version of what one materialization (or one partition of it) wrote: a sha256 over
    its files' keys and sha256s, so rewriting identical bytes gives the same version and marks
    nothing downstream stale, whatever else the run wrote."""
    lines = "".join(f"{key}\t{sha}\n" for key, sha in sorted(content_hashes.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


@dataclass
class Provenance:
    """What one materialization did. A field left None is one the asset has no such thing for, and
    has no metadata row; `retention` and `byte_retention` default to out / in when both counts are known."""

    code_version: str
    config: dict[str, Any] | None
    content_hashes: dict[str, str]
    wall_s: float | None = None  # None until the asset factory fills in the step's measured time
    docs_in: int | None = None
    docs_out: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    retention: float | None = None
    byte_retention: float | None = None
    removed_by_rule: dict[str, int] | None = None
    counters: dict[str, Any] | None = None
    sample: pl.DataFrame | None = None  # a few output rows with doc_id, url and text
    text_column: str = "text"

    @classmethod
    def of_stats(cls, stats: StageStats, config: dict[str, Any], version: str, hashes: dict[str, str],
                 sample: pl.DataFrame | None = None, text_column: str = "text") -> "Provenance":
        """A document stage's provenance from its merged stats: the top removal reasons by rule."""
        return cls(
            code_version=version, config=config, content_hashes=hashes, wall_s=stats.wall_s,
            docs_in=stats.docs_in, docs_out=stats.docs_out, bytes_in=stats.bytes_in, bytes_out=stats.bytes_out,
            retention=stats.retention, byte_retention=stats.byte_retention,
            removed_by_rule=dict(stats.dropped.most_common(TOP_REASONS)), counters=dict(sorted(stats.counters.items())),
            sample=sample, text_column=text_column,
        )


def _ratio(given: float | None, out: int | None, into: int | None) -> float | None:
    if given is not None:
        return given
    if out is None or into is None:
        return None
    return out / into if into else 1.0


def _int(value: int | None) -> dg.MetadataValue | None:
    return dg.MetadataValue.int(int(value)) if value is not None else None


def _float(value: float | None, digits: int) -> dg.MetadataValue | None:
    return dg.MetadataValue.float(round(value, digits)) if value is not None else None


def _json(value: dict | None) -> dg.MetadataValue | None:
    return dg.MetadataValue.json(value) if value is not None else None


def provenance_metadata(p: Provenance) -> dict[str, dg.MetadataValue]:
    """The metadata keys every asset shares (`PROVENANCE_KEYS`, in that order), less those it has no
    such thing for (`ALWAYS_KEYS` are always there)."""
    docs_per_s = None if p.docs_in is None else (p.docs_in / p.wall_s if p.wall_s > 0 else 0.0)
    sample = dg.MetadataValue.md(sample_rows_markdown(p.sample, p.text_column)) if p.sample is not None else None
    values = {
        "docs_in": _int(p.docs_in),
        "docs_out": _int(p.docs_out),
        "retention": _float(_ratio(p.retention, p.docs_out, p.docs_in), 6),
        "bytes_in": _int(p.bytes_in),
        "bytes_out": _int(p.bytes_out),
        "byte_retention": _float(_ratio(p.byte_retention, p.bytes_out, p.bytes_in), 6),
        "removed_by_rule": _json(p.removed_by_rule),
        "counters": _json(p.counters),
        "wall_s": dg.MetadataValue.float(round(p.wall_s, 4)),
        "docs_per_s": _float(docs_per_s, 1),
        "config": _json(p.config),
        "code_version": dg.MetadataValue.text(p.code_version),
        "content_hashes": dg.MetadataValue.json(p.content_hashes),
        "sample_rows": sample,
    }
    return {key: value for key, value in values.items() if value is not None}


def sample_rows_markdown(df: pl.DataFrame, text_column: str = "text") -> str:
    if df.height == 0:
        return "_no rows_"
    lines = ["| doc_id | url | text |", "| --- | --- | --- |"]
    for row in df.head(SAMPLE_ROWS).iter_rows(named=True):
        text = (row.get(text_column) or "")[:SAMPLE_CHARS].replace("\n", " ").replace("|", "\\|")
        lines.append(f"| {row['doc_id']} | {row.get('url') or ''} | {text} |")
    return "\n".join(lines)


def image_markdown(png: bytes, alt: str, caption: str) -> dg.MetadataValue:
    """A PNG with a caption, as markdown the asset page draws in place. The page shows a markdown
    value inline only under MARKDOWN_INLINE_CHARS (a longer one hides behind "[Show Markdown]"), and
    a PNG as a data URI is far longer; so, in a run of an instance that keeps its compute logs on
    this machine (`make ui`, `refinery demo`), the PNG is stored beside those logs under its sha256
    and the markdown names it by the webserver's `/logs/` route, which serves that folder. Elsewhere
    (an ephemeral instance, logs kept in the cloud, no run in scope) the PNG travels as a data URI."""
    url = _served_plot_url(png)
    if url is None:
        return dg.MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})\n\n{caption}")
    room = MARKDOWN_INLINE_CHARS - len(f"![{alt}]({url})\n\n") - 1
    return dg.MetadataValue.md(f"![{alt}]({url})\n\n{caption if len(caption) <= room else caption[:room - 1] + '…'}")


def _served_plot_url(png: bytes) -> str | None:
    """Where the webserver serves `png` from, once it is written beside the instance's compute logs."""
    from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager

    try:
        manager = dg.OpExecutionContext.get().instance.compute_log_manager
    except dg.DagsterInvariantViolationError:  # not inside a run
        return None
    if type(manager) is not LocalComputeLogManager:
        return None
    name = hashlib.sha256(png).hexdigest()
    path = Path(manager.get_captured_local_path([PLOTS_LOG_FOLDER, name], "png"))
    if not path.is_file():
        with atomic_path(path) as tmp:
            tmp.write_bytes(png)
    return f"/logs/{PLOTS_LOG_FOLDER}/{name}/png"
