"""`refinery demo --changed`: materialize only the assets and partitions that are missing or stale,
saying first what will run and why.

Staleness is Dagster's own (`CachingStaleStatusResolver`, what the UI's "stale" badge shows): a
partition never materialized is missing; one whose asset's code version differs from the one it was
materialized with (an edited stage, an edited custom filter: assets/funnel.py puts the filters'
source in heuristic_filtered's version; an edited config value the asset reads: `CONFIG_READ` in
assets/provenance.py) has a new code version; one whose inputs' data versions
moved since has changed upstream. Dagster reports only direct causes, so what depends on a planned
partition is planned too ("upstream reruns"): after the rerun its input may change. Data versions are
the hash of what each partition wrote (assets/factory.py), so a rerun that writes the same bytes
stops the wave there when the plan is made again.

Dagster does not see the input files themselves: raw_documents has no upstream asset. Each batch's
raw_documents materialization therefore records its files' sizes and modification times
(`input_file_state`), and a batch whose files differ now (one edited, added or removed) is planned
as "input files changed", naming them. A batch whose files are all gone is no partition any more:
the assets that read every batch are planned ("input files removed"), and once the plan has run
each gone batch is recorded as observed empty, so the instance matches the inputs again. Every
doc_key holds its file's shard ordinal among all inputs: a batch whose files' ordinals moved (an
input added or removed before them) has its dedup signatures planned ("input files moved").

A new code version names what changed: each asset's config values, by the digest its version
carries, are kept in the instance folder once it is materialized (`record_config_values`,
`config_versions/<asset>-<digest>.json`), so the plan names each config field that moved (dotted
path, old -> new), and beside them the code parts each version was hashed from
(`assets.provenance.CODE_PARTS`, `config_versions/code-<version>.json`), so it names the modules
whose source changed. `--until ASSET` plans only ASSET and what it reads
(`until_selection`), and says what it leaves stale past it.

A phase's files (its manifest, selection and band files, schedule plot) are checked against the
sha256s its latest phase_manifests materialization recorded: one edited or removed since makes the
trainer refuse the phase, so the plan rebuilds it ("its files changed since written", naming them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from dagster import AssetKey

if TYPE_CHECKING:
    import dagster as dg

MISSING, CODE_CHANGED, UPSTREAM_CHANGED, UPSTREAM_RERUNS = (
    "missing", "code or config changed", "upstream data changed", "upstream reruns")
INPUTS_CHANGED, INPUTS_REMOVED, INPUTS_MOVED = "input files changed", "input files removed", "input files moved"
WRITTEN_CHANGED = "its files changed since written"
DROPPED_NEEDED = "its files were dropped once read, and a planned step reads them"
NAMED = 10  # input files a plan line names before "and N more"
CONFIG_VERSIONS = "config_versions"  # under the instance folder: each asset's config values by digest
CODE_EDITED = "code edited"


@dataclass
class PlannedAsset:
    """One asset of the plan: the partitions to materialize (None for an unpartitioned asset) and
    why, each reason with the partitions it applies to."""

    key: dg.AssetKey
    partitions: list[str] | None
    reasons: dict[str, list[str | None]]
    details: list[str] = field(default_factory=list)  # the input files behind the reasons, named

    def line(self) -> str:
        why = "; ".join(f"{reason} ({_partition_count(keys)})" for reason, keys in self.reasons.items())
        shown = self.details[:NAMED] + ([f"and {len(self.details) - NAMED} more"] if len(self.details) > NAMED else [])
        return f"  {self.key.to_user_string()}: {why}" + (f": {', '.join(shown)}" if shown else "")


# The group of the proxy-model ablations (assets/ablations.py, assets/ablation_schedules.py): they
# read the main graph and nothing of it reads them, so they run after all of it.
ABLATIONS_GROUP = "ablations"


def materializable_in_order(graph, selection: list[dg.AssetKey] | None = None) -> Iterator[tuple[dg.AssetKey, Any]]:
    """The graph's materializable assets (of `selection`), with their nodes, in dependency order, by
    name within a level: the order a plan is made and run in. The ablation assets come last, so a
    variant the data cannot fill (refused, exit 2) or a slow proxy run never keeps the main graph's
    training from running first."""
    nodes = [(key, graph.get(key)) for level in graph.toposorted_asset_keys_by_level
             for key in sorted(level, key=lambda k: k.to_user_string())]
    wanted = [(key, node) for key, node in nodes if node.is_materializable and (selection is None or key in selection)]
    yield from (item for item in wanted if item[1].group_name != ABLATIONS_GROUP)
    yield from (item for item in wanted if item[1].group_name == ABLATIONS_GROUP)


def _partition_count(keys: list[str | None]) -> str:
    return "unpartitioned" if keys == [None] else f"{len(keys)} partition(s)"


def _stale_reason(resolver, key: dg.AssetKey, partition: str | None) -> str | None:
    from dagster._core.definitions.data_version import StaleCauseCategory, StaleStatus

    status = resolver.get_status(key, partition)
    if status == StaleStatus.MISSING:
        return MISSING
    if status == StaleStatus.FRESH:
        return None
    causes = resolver.get_stale_causes(key, partition)
    if any(c.category == StaleCauseCategory.CODE and c.asset_key == key for c in causes):
        return CODE_CHANGED
    return UPSTREAM_CHANGED


def stale_plan(defs: dg.Definitions, instance: dg.DagsterInstance,
               selection: list[dg.AssetKey] | None = None) -> list[PlannedAsset]:
    """Every materializable (selected) asset with a missing or stale partition, a batch whose input
    files changed, or a partition that reads one that will rerun, in dependency order."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._core.loader import LoadingContextForTest

    graph = defs.resolve_asset_graph()
    cfg = defs.resources["refinery"].config
    # The loading context Dagster gives a caller outside a UI request.
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    changed_inputs = input_changes(defs, instance)
    changed_manifests = changed_manifest_files(defs, instance)
    moved = moved_ordinals(defs, instance)
    removed = removed_batches(defs, instance)
    readers = readers_of_every_batch(graph) if removed else set()
    # A plan that runs a reader of a dropped store plans the partitions that store it back first: once
    # more, since they read and mark stale what they feed.
    forced: dict[dg.AssetKey, dict[str, list[str]]] = {}
    while True:
        planned: dict[dg.AssetKey, set[str | None]] = {}
        plan: list[PlannedAsset] = []
        for key, node in materializable_in_order(graph, selection):
            keys = node.partitions_def.get_partition_keys(dynamic_partitions_store=instance) \
                if node.partitions_def else [None]
            reasons: dict[str, list[str | None]] = {}
            details: list[str] = []
            for partition in keys:
                reason = _stale_reason(resolver, key, partition)
                if reason == CODE_CHANGED:
                    details += [c for c in version_changes(instance, graph, key, partition, cfg) if c not in details]
                if reason is None and key == RAW_DOCUMENTS and partition in changed_inputs:
                    reason = INPUTS_CHANGED
                    details += changed_inputs[partition]
                if reason is None and key == DEDUP_SIGNATURES and partition in moved:
                    reason = INPUTS_MOVED
                    details += moved[partition]
                if reason is None and key in readers:
                    reason = INPUTS_REMOVED
                if reason is None and key == PHASE_MANIFESTS and partition in changed_manifests:
                    reason = WRITTEN_CHANGED
                    details += changed_manifests[partition]
                if reason is None and partition in forced.get(key, {}):
                    reason = DROPPED_NEEDED
                    details += forced[key][partition]
                if reason is None and _reads_planned(graph, planned, key, partition):
                    reason = UPSTREAM_RERUNS
                if reason is not None:
                    reasons.setdefault(reason, []).append(partition)
            if INPUTS_REMOVED in reasons:
                details += [f"{batch} gone" for batch in removed]
            if reasons:
                chosen = [p for p in keys if any(p in ps for ps in reasons.values())]
                planned[key] = set(chosen)
                plan.append(PlannedAsset(key, None if chosen == [None] else chosen, reasons, details))
        more = dropped_stores_needed(defs, planned, forced)
        if not more:
            break
        for key, partitions in more.items():
            forced.setdefault(key, {}).update(partitions)
    restarts = training_restarts(defs.resources["refinery"].config, plan)
    for planned in plan:
        if planned.key == TRAINING_RUN:
            planned.details += [f"{phase} starts a new run: its checkpoints in {run_dir} were trained on phase manifests "
                                f"this plan rebuilds, and move to {run_dir}.archived-<UTC time>"
                                for phase, run_dir in restarts.items()]
    return plan


def _history(instance: dg.DagsterInstance) -> Path:
    return Path(instance.root_directory) / CONFIG_VERSIONS


def record_config_values(defs: dg.Definitions, instance: dg.DagsterInstance, keys: list[dg.AssetKey]) -> None:
    """Keep the config values each of `keys` read (`CONFIG_READ`), under the digest its code version
    carries, once it has been materialized: what a later plan names a changed field against. One
    small JSON file per asset and config digest, written once (temp name, then rename)."""
    from assets.provenance import CODE_PARTS, CONFIG_READ, config_digest, config_values

    cfg = defs.resources["refinery"].config
    graph = defs.resolve_asset_graph()
    folder = _history(instance)
    folder.mkdir(parents=True, exist_ok=True)
    for key in keys:
        name = key.to_user_string()
        if name not in CONFIG_READ:
            continue
        _write_once(folder / f"{name}-{config_digest(cfg, CONFIG_READ[name])}.json", config_values(cfg, CONFIG_READ[name]))
        code = (graph.get(key).code_version or "").rsplit("-c", 1)[0]
        if code in CODE_PARTS:
            _write_once(folder / f"code-{code}.json", CODE_PARTS[code])


def _write_once(path: Path, value: Any) -> None:
    """`value` as JSON at `path` unless it is there already (temp name, then rename)."""
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value, sort_keys=True))
        os.replace(tmp, path)


def code_changes(instance: dg.DagsterInstance, old_code: str, new_code: str) -> str:
    """`code edited: <parts>`, naming the modules (a package's files, a stage's registry record) whose
    source differs between the two code versions, or `code edited` when the old version's parts were
    not recorded."""
    from assets.provenance import CODE_PARTS

    recorded = _history(instance) / f"code-{old_code}.json"
    if not recorded.exists() or new_code not in CODE_PARTS:
        return CODE_EDITED
    old, new = json.loads(recorded.read_text()), CODE_PARTS[new_code]
    moved = sorted(part for part in old.keys() | new.keys() if old.get(part) != new.get(part))
    return f"{CODE_EDITED}: {', '.join(moved)}" if moved else CODE_EDITED


def _leaves(value: Any, path: str) -> dict[str, Any]:
    """A config value as dotted paths to its leaves (a list is one leaf)."""
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in _leaves(sub, f"{path}.{key}").items()}
    return {path: value}


def version_changes(instance: dg.DagsterInstance, graph, key: dg.AssetKey, partition: str | None, cfg) -> list[str]:
    """What moved in `key`'s code version since this partition's latest materialization: each config
    field (`stages.heuristic.gopher_quality.min_words 50 -> 30`), and `code edited: <modules>` when its
    code's part of the version differs."""
    import dagster as dg

    from assets.provenance import CONFIG_READ, config_values

    records = instance.fetch_materializations(dg.AssetRecordsFilter(
        asset_key=key, asset_partitions=None if partition is None else [partition]), limit=1).records
    entry = records[0].asset_materialization.metadata.get("code_version") if records else None
    now = graph.get(key).code_version or ""
    if entry is None or "-c" not in now or "-c" not in str(entry.value):
        return []
    (old_code, old_digest), (new_code, new_digest) = str(entry.value).rsplit("-c", 1), now.rsplit("-c", 1)
    out = [code_changes(instance, old_code, new_code)] if old_code != new_code else []
    if old_digest != new_digest:
        name = key.to_user_string()
        recorded = _history(instance) / f"{name}-{old_digest}.json"
        if not recorded.exists():
            return out + ["config it read changed (its values then were not recorded)"]
        cfg_now = config_values(cfg, CONFIG_READ[name])
        old = {k: v for path, value in json.loads(recorded.read_text()).items() for k, v in _leaves(value, path).items()}
        new = {k: v for path, value in cfg_now.items() for k, v in _leaves(value, path).items()}
        out += [f"{path} {json.dumps(old.get(path))} -> {json.dumps(new.get(path))}"
                for path in sorted(old.keys() | new.keys()) if old.get(path) != new.get(path)]
    return out


RAW_DOCUMENTS, PHASE_MANIFESTS, TRAINING_RUN = AssetKey("raw_documents"), AssetKey("phase_manifests"), AssetKey("training_run")
DEDUP_SIGNATURES = AssetKey("dedup_signatures")
TOKENIZED_SHARDS, SHUFFLED_SHARDS, NEAR_DEDUPED = AssetKey("tokenized_shards"), AssetKey("shuffled_shards"), AssetKey("near_deduped")


def dropped_stores_needed(defs: dg.Definitions, planned: dict, forced: dict) -> dict[dg.AssetKey, dict[str, list[str]]]:
    """Batch partitions not yet planned whose store was dropped (refinery/dropped.py) while a planned
    step reads it: the token series of a bucket whose shuffle is planned, the bottom-k sketches
    when a band of near_deduped is. Each with the files behind it, named."""
    from refinery.documents import input_batches
    from refinery.dropped import series_refusal, sketches_refusal

    cfg, root = defs.resources["refinery"].config, defs.resources["refinery"].root
    buckets = planned.get(SHUFFLED_SHARDS, set())
    readers = [(TOKENIZED_SHARDS, lambda s: s.bucket in buckets and series_refusal(root, s.bucket, s.key, "")),
               (DEDUP_SIGNATURES, lambda s: NEAR_DEDUPED in planned and sketches_refusal(root, s.key, ""))]
    out: dict[dg.AssetKey, dict[str, list[str]]] = {}
    for key, dropped in readers:
        for batch in input_batches(cfg):
            if batch.key in planned.get(key, set()) or batch.key in forced.get(key, {}):
                continue
            files = [f"{s.key} dropped" for s in batch.shards if dropped(s)]
            if files:
                out.setdefault(key, {})[batch.key] = files
    return out


def latest_entry(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str, entry: str):
    """The value of metadata `entry` of the partition's latest materialization (None: none, or
    recorded before the entry was)."""
    import dagster as dg

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1).records
    value = records[0].asset_materialization.metadata.get(entry) if records else None
    return None if value is None else value.value


def training_restarts(cfg, plan: list[PlannedAsset]) -> dict[str, Path]:
    """Phase -> its run directory, for each planned training_run phase holding checkpoints that a
    planned phase_manifests rebuild invalidates: those of a phase at or before it (the trainer
    refuses to resume across changed manifests; `refinery train` says so after the data work)."""
    from training.phase_runs import checkpoints, phase_names, phase_run_dir

    partitions = {p.key: p.partitions or [] for p in plan}
    if TRAINING_RUN not in partitions or PHASE_MANIFESTS not in partitions:
        return {}
    names = phase_names(cfg)
    first = min(names.index(p) for p in partitions[PHASE_MANIFESTS])
    return {phase: phase_run_dir(cfg, phase) for phase in partitions[TRAINING_RUN]
            if names.index(phase) >= first and checkpoints(phase_run_dir(cfg, phase)).complete()}


def input_changes(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, list[str]]:
    """Batch -> its input files that differ from those its latest raw_documents recorded
    (`<file key> edited|added|removed`); batches never materialized, or recorded before the input
    state was, are left to Dagster's own status."""
    from assets.funnel import INPUT_STATE
    from refinery.documents import input_batches, input_file_state

    out = {}
    for batch in input_batches(defs.resources["refinery"].config):
        then = latest_entry(instance, RAW_DOCUMENTS, batch.key, INPUT_STATE)
        if then is None:
            continue
        now = input_file_state(list(batch.shards))
        named = [f"{k} {'added' if k not in then else 'removed' if k not in now else 'edited'}"
                 for k in sorted(then.keys() | now.keys()) if then.get(k) != now.get(k)]
        if named:
            out[batch.key] = named
    return out


def changed_manifest_files(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, list[str]]:
    """Phase -> the files its latest phase_manifests materialization wrote (the manifest, its
    selection and band files, the schedule plot) whose sha256 differs now from the one recorded, or
    that are gone (`<key> changed|missing`): the trainer refuses such a phase, so the plan rebuilds it.
    Each file is read once a plan; they hold at most 8 bytes per entry the phase serves, and the
    trainer hashes the same files at every start."""
    root = defs.resources["refinery"].root
    out = {}
    for phase in sorted(instance.get_materialized_partitions(PHASE_MANIFESTS)):
        recorded = latest_entry(instance, PHASE_MANIFESTS, phase, "content_hashes") or {}
        named = [f"{key} {'missing' if not root.exists(key) else 'changed'}" for key, sha in sorted(recorded.items())
                 if not root.exists(key) or root.sha256(key) != sha]
        if named:
            out[phase] = named
    return out


def moved_ordinals(defs: dg.Definitions, instance: dg.DagsterInstance) -> dict[str, list[str]]:
    """Batch -> its files whose shard ordinal (in every doc_key its signatures hold) moved since its
    dedup_signatures were computed, because an input before them was added or removed
    (`<file key> <then>-><now>`)."""
    from assets.dedup import SHARD_ORDINALS
    from refinery.documents import input_batches
    from refinery.global_steps.dedup_compute import shard_ordinals

    cfg = defs.resources["refinery"].config
    ordinals = shard_ordinals(cfg)
    out = {}
    for batch in input_batches(cfg):
        then = latest_entry(instance, DEDUP_SIGNATURES, batch.key, SHARD_ORDINALS)
        named = [f"{s.key} {then[s.key]}->{ordinals[s.key]}" for s in batch.shards
                 if then is not None and s.key in then and then[s.key] != ordinals[s.key]]
        if named:
            out[batch.key] = named
    return out


def removed_batches(defs: dg.Definitions, instance: dg.DagsterInstance) -> list[str]:
    """Batches raw_documents was materialized for whose input files are all gone, and that no plan
    has run for since (`record_removed_batches`)."""
    import dagster as dg

    from refinery.documents import input_batches

    current = {b.key for b in input_batches(defs.resources["refinery"].config)}
    out = []
    for batch in sorted(set(instance.get_materialized_partitions(RAW_DOCUMENTS)) - current):
        records = dg.AssetRecordsFilter(asset_key=RAW_DOCUMENTS, asset_partitions=[batch])
        made = instance.fetch_materializations(records, limit=1).records
        seen = instance.fetch_observations(records, limit=1).records
        if not (seen and made and seen[0].timestamp > made[0].timestamp):
            out.append(batch)
    return out


def readers_of_every_batch(graph) -> set[dg.AssetKey]:
    """The assets not partitioned by input batch that read a per-batch asset: each reads every
    batch, so a batch gone changes what it reads."""
    batches = graph.get(RAW_DOCUMENTS).partitions_def
    return {key for key in graph.materializable_asset_keys
            if graph.get(key).partitions_def != batches
            and any(graph.get(p).partitions_def == batches for p in graph.get(key).parent_keys)}


def record_removed_batches(instance: dg.DagsterInstance, removed: list[str]) -> None:
    """Once the plan that stopped reading them has run, record each gone batch as observed empty
    (Dagster's SQLite storage cannot wipe one partition), so the next plan sees no removal; a batch
    whose files come back is materialized again and seen anew."""
    import dagster as dg

    from assets.funnel import INPUT_STATE

    for batch in removed:
        instance.report_runless_asset_event(dg.AssetObservation(
            asset_key=RAW_DOCUMENTS, partition=batch,
            metadata={INPUT_STATE: dg.MetadataValue.json({}), "removed": "every input file of this batch is gone"}))


def _reads_planned(graph, planned: dict, key: dg.AssetKey, partition: str | None) -> bool:
    """Whether this partition of `key` reads a partition of a parent that the plan reruns."""
    for parent in graph.get(key).parent_keys:
        if parent not in planned:
            continue
        if None in planned[parent] or partition is None:
            return True
        upstream = graph.get_parent_partition_keys_for_child(partition, parent, key).partitions_subset
        if planned[parent] & set(upstream.get_partition_keys()):
            return True
    return False
