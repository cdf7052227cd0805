"""`refinery demo`: materialize the whole graph on the bundled sample, in-process, into a real
Dagster instance (so `make ui` shows every run afterwards), then print the funnel table, the
curriculum contract and the training summary.

The graph mixes partition schemes (input batches, hash ranges, LSH bands, buckets, phases), so it
is run step by step in dependency order: consecutive assets that share a partitions definition and a
single-run backfill policy (the per-batch funnel, ranges, bands) are one run over all their
partitions, as a backfill in the UI makes them; the others run once per partition key. Every run
has its own SQLite bookkeeping (a run database, an event per step), which is why fewer runs is the
cheapest orchestration. The in-process executor is used on purpose: the multiprocess one spends
7-10 s starting every step.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import dagster as dg

    from refinery.storage import DataRoot


@dataclass
class PlanStep:
    """Assets that run together over one partitions definition (and unpartitioned assets, in a step
    that covers every partition in one run), in runs of `per_run` partition keys (None: all)."""

    keys: list[dg.AssetKey]
    partitions_def: dg.PartitionsDefinition | None
    per_run: int | None


def _per_run(node) -> int | None:
    """Partition keys one run of this asset may take, from its backfill policy (none: one key)."""
    if node.partitions_def is None:
        return None
    policy = node.backfill_policy
    return 1 if policy is None else policy.max_partitions_per_run


def _joins(step: PlanStep, node, per_run: int | None) -> bool:
    """Whether `node` can run in `step`'s runs: only when both take every partition in one run (an
    unpartitioned asset, or one with a single-run backfill policy over the same partitions). Steps
    of one run per key stay apart, since an asset may need every key of the one before it in ways
    Dagster does not see (the trainer reads every phase's manifest)."""
    if step.per_run is not None or per_run is not None:
        return False
    return node.partitions_def is None or step.partitions_def in (None, node.partitions_def)


def execution_plan(defs: dg.Definitions, selection: list[dg.AssetKey] | None = None) -> list[PlanStep]:
    """Steps in dependency order; each asset joins the step before it when `_joins` allows."""
    from orchestration.changed import materializable_in_order

    graph = defs.resolve_asset_graph()
    wanted = set(selection) if selection is not None else None
    steps: list[PlanStep] = []
    for key, node in materializable_in_order(graph, wanted):
        per_run = _per_run(node)
        if steps and _joins(steps[-1], node, per_run):
            steps[-1].keys.append(key)
            steps[-1].partitions_def = steps[-1].partitions_def or node.partitions_def
        else:
            steps.append(PlanStep([key], node.partitions_def, per_run))
    return steps


# Dagster's console prints nothing: a failed step is one summary line (orchestration/runs.py) with
# its tracebacks in a log file, and a step's warnings are echoed one line each after its run
# (`run_warnings`). `--verbose` runs with Dagster's console at its default level instead.
QUIET_RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def materialize_step(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    step: PlanStep,
    run_config: dict | None = None,
    only: set[str] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[int, int]:
    """Materialize one plan step over all its partitions (or those in `only`), raising StepsFailed
    (orchestration/runs.py: a line per failed step) on the first failed run; returns the partition
    keys it covered and the Dagster runs it took. A step whose assets take many partitions per run
    gets one run per partition range, tagged as a backfill's ranged run is; a range is contiguous,
    so partitions left out of `only` split it. A step whose assets need a pool slot waits for one
    first, boundedly (`wait_for_pools`)."""
    import dagster as dg

    from orchestration.runs import record_failure, run_tags, run_warnings, wait_for_pools

    assets = list(defs.assets or []) + list(defs.asset_checks or [])
    every = step.partitions_def.get_partition_keys(dynamic_partitions_store=instance) if step.partitions_def else []
    spans = contiguous_spans(every, only)
    keys = [k for span in spans for k in span]
    per_run = step.per_run or max(len(keys), 1)
    chunks = [span[i : i + per_run] for span in spans for i in range(0, len(span), per_run)] or [[]]
    graph = defs.resolve_asset_graph()
    pools = {pool for key in step.keys for pool in graph.get(key).pools or ()}
    for chunk in chunks:
        if pools:
            wait_for_pools(instance, pools, log)
        single = chunk[0] if len(chunk) == 1 else None
        tags = {**run_tags(), **({RANGE_START: chunk[0], RANGE_END: chunk[-1]} if len(chunk) > 1 else {})}
        result = dg.materialize(
            assets, selection=step.keys, partition_key=single, instance=instance, resources=defs.resources or {},
            run_config=run_config, tags=tags, raise_on_error=False,
        )
        if run_config == QUIET_RUN_CONFIG:
            for line in run_warnings(instance, result.run_id):
                log(line)
        if not result.success:
            raise record_failure(instance, result, single or (f"{chunk[0]}..{chunk[-1]}" if chunk else ""))
    from orchestration.changed import record_config_values

    record_config_values(defs, instance, step.keys)
    return len(keys) or 1, len(chunks)


def contiguous_spans(keys: list[str], only: set[str] | None) -> list[list[str]]:
    """`keys` (in partition order) cut into runs of consecutive keys that are in `only` (all: one)."""
    if only is None:
        return [keys] if keys else []
    spans: list[list[str]] = [[]]
    for key in keys:
        if key in only:
            spans[-1].append(key)
        elif spans[-1]:
            spans.append([])
    return [span for span in spans if span]


def materialize_graph(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    selection: list[dg.AssetKey] | None = None,
    log: Callable[[str], None] = print,
    run_config: dict | None = None,
) -> int:
    """Materialize every (selected) asset and partition, step by step (`materialize_step`), raising
    on the first failure; returns the number of Dagster runs it took."""
    runs = 0
    for step in execution_plan(defs, selection):
        start = time.perf_counter()
        partitions, step_runs = materialize_step(defs, instance, step, run_config, log=log)
        runs += step_runs
        names = ", ".join(k.to_user_string() for k in step.keys)
        log(f"  {names}: {partitions} partition(s) in {step_runs} run(s), {time.perf_counter() - start:.1f}s")
    return runs


def until_selection(defs: dg.Definitions, target: str) -> list[dg.AssetKey]:
    """`target` and every asset it reads, directly or not: what `--until target` materializes."""
    import dagster as dg

    graph = defs.resolve_asset_graph()
    key = dg.AssetKey(target)
    if key not in graph.materializable_asset_keys:
        names = sorted(k.to_user_string() for k in graph.materializable_asset_keys)
        raise ValueError(f"--until {target}: no such asset; use one of {', '.join(names)}")
    return sorted(dg.AssetSelection.assets(key).upstream().resolve(graph), key=lambda k: k.to_user_string())


def run_changed(defs: dg.Definitions, instance: dg.DagsterInstance, log: Callable[[str], None] = print,
                run_config: dict | None = None, selection: list[dg.AssetKey] | None = None) -> list:
    """Print the plan, then materialize it step by step (orchestration/demo.py's steps, limited to
    the planned assets and partitions); returns the plan. A training phase whose checkpoints the
    plan's manifests invalidate has its run directory archived right before training starts
    (`training_restarts`), and input batches that are gone are recorded as gone once the plan has run."""
    from orchestration.changed import (TRAINING_RUN, record_removed_batches, removed_batches, stale_plan,
                                       training_restarts)
    from training.run_store import archive_run

    cfg = defs.resources["refinery"].config
    plan = stale_plan(defs, instance, selection)
    left = [] if selection is None else [p for p in stale_plan(defs, instance) if p.key not in selection]
    if not plan:
        log("Nothing to run: every asset and partition is materialized and up to date.")
    else:
        log(f"Will materialize {len(plan)} asset(s), missing or stale:")
    for planned in plan:
        log(planned.line())
    if left:
        log(f"Left stale past --until ({len(left)} asset(s); `refinery demo --changed` runs them):")
        for planned in left:
            log(planned.line())
    if not plan:
        return plan
    removed = removed_batches(defs, instance)
    restarts = training_restarts(cfg, plan)
    partitions = {p.key: p.partitions for p in plan}
    for step in execution_plan(defs, list(partitions)):
        if TRAINING_RUN in step.keys:
            for phase, run_dir in restarts.items():
                log(f"  training_run[{phase}]: the old run is kept at {archive_run(cfg, run_dir)}")
        wanted = {k for key in step.keys for k in (partitions[key] or [])}
        materialize_step(defs, instance, step, run_config, wanted or None, log)
        log(f"  ran {', '.join(k.to_user_string() for k in step.keys)}")
    if selection is None:  # past --until, the readers of a gone batch have not run yet
        record_removed_batches(instance, removed)
    return plan


def scan_summary(root: DataRoot, phase: str) -> str:
    """One phase's latest contamination scan, in the words of its asset check and `refinery scan`,
    and every document the drop policy has removed from the phase, by this scan and earlier ones."""
    from refinery.contamination import verdict
    from refinery.layout import scan_report_key
    from refinery.reports.exclusions import excluded_doc_ids

    if not root.exists(scan_report_key(phase)):
        return f"{phase:<10} never scanned; materialize contamination_scan[{phase}]"
    report = root.read_json(scan_report_key(phase))
    line = f"{phase:<10} {verdict(report)}"
    if report.get("found_before_policy"):
        line += f"; {report['found_before_policy']} found before policy {report['policy']}"
    return (f"{line}; {len(excluded_doc_ids(root, phase))} dropped from the phase so far "
            f"({len(report['dropped'])} by this scan)")


def demo_summary(config_path: str) -> str:
    """What the demo made: the funnel, the curriculum contract, the contamination scans and the
    per-phase, per-bucket training tokens and loss."""
    from refinery.config import load_config
    from refinery.curriculum import validate_data_root
    from refinery.reports.funnel import build_report, bytes_per_token, format_report, load_stage_totals
    from refinery.storage import open_data_root
    from refinery.reports.contract import render_text
    from training.cli import format_table
    from training.phase_runs import phase_names, phase_run_dir
    from training.status import read_status

    cfg = load_config(config_path)
    root = open_data_root(cfg.resolve(cfg.data_root))
    phases = phase_names(cfg)
    out = ["== Funnel (refinery funnel)", format_report(build_report(
        load_stage_totals(root), cfg.curriculum.total_tokens, bytes_per_token(root, list(cfg.buckets))))]
    out += ["", "== Curriculum contract (refinery validate)", render_text(validate_data_root(cfg, root)[0])]
    out += ["", "== Contamination scans"]
    out += [scan_summary(root, phase) for phase in phases]
    status = read_status(phase_run_dir(cfg, phases[-1])) or {}
    summary = status.get("summary") or {}
    ordered = {**status, "summary": {p: summary[p] for p in phases if p in summary}}
    out += ["", "== Training (training_run, one Pipes launch per phase)", format_table(ordered) if status else "not trained"]
    return "\n".join(out)


# `refinery demo`'s exit status when a step of the graph failed (cli.py lists every status).
STEP_FAILED = 4


def run_demo(args: argparse.Namespace) -> int:
    import sys
    import warnings

    import dagster as dg

    from refinery import ray_pool
    from assets.partitions import register_input_batches
    from assets.training import POOL
    from orchestration.definitions import build_definitions
    from orchestration.instance import prepare_instance_dir
    from orchestration.runs import PoolBusy, StepsFailed, release_dead_runs
    from refinery.config import load_config

    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    cfg = load_config(args.config)
    # One instance per data root (orchestration/instance.py): this config sees only its own history.
    home = str(prepare_instance_dir(cfg))
    defs = build_definitions(args.config)
    with dg.DagsterInstance.from_config(home) as instance:
        # The UI then shows the pool that keeps two training runs off one accelerator.
        instance.event_log_storage.set_concurrency_slots(POOL, 1)
        print(f"Materializing the asset graph from {args.config} into the Dagster instance at {home}")
        release_dead_runs(instance)
        if cfg.partitions.dynamic:
            print(f"Registered {register_input_batches(cfg, instance)} new input batch(es)")
        start = time.perf_counter()
        run_config = None if args.verbose else QUIET_RUN_CONFIG
        try:
            selection = until_selection(defs, args.until) if args.until else None
        except ValueError as err:
            print(f"refinery demo: {err}", file=sys.stderr)
            return 2
        try:
            if args.changed:
                run_changed(defs, instance, run_config=run_config, selection=selection)
                print(f"Missing and stale assets materialized in {time.perf_counter() - start:.0f}s\n")
            else:
                runs = materialize_graph(defs, instance, selection, run_config=run_config)
                print(f"Graph materialized in {runs} Dagster runs, {time.perf_counter() - start:.0f}s\n")
        except StepsFailed as failed:
            for line in failed.lines:
                print(line, file=sys.stderr)
            if args.verbose:
                print(failed.log_file.read_text(), file=sys.stderr)
            print(f"Run {failed.run_id} failed: the errors in full are in {failed.log_file} (--verbose prints them), "
                  f"and its events in the UI (`make ui CONFIG={args.config}`, Runs)", file=sys.stderr)
            return 2 if failed.input_problem else STEP_FAILED
        except PoolBusy as busy:
            print(f"refinery demo: {busy}", file=sys.stderr)
            return STEP_FAILED
        finally:
            ray_pool.close()  # the run's Ray workers, if any: the run has ended
    if args.until:  # the contract, scans and training may not be there yet: the funnel alone
        print(demo_summary(args.config).split("\n\n== Curriculum contract")[0])
        print(f"\nStopped at {args.until} (--until): what reads it is left as it was")
    else:
        print(demo_summary(args.config))
    print(f"\nOpen the UI on these runs with `make ui CONFIG={args.config}` (http://127.0.0.1:3000; PORT=N for another).")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from refinery.preflight import GRAPH

    p = subparsers.add_parser(
        "demo", help="materialize the whole graph on a config (the bundled sample by default)",
        description="Materialize every asset of the graph (funnel, dedup, quality, tokens, curriculum, contamination "
                    "scans and training, phase by phase) on the config's sources into the Dagster instance of its "
                    "data root, a folder under $DAGSTER_HOME (default .dagster_home), in dependency order, then print the funnel, the "
                    "curriculum contract, the scans and the training summary. It is how a config of your own "
                    "data runs end to end; `make ui` then shows every run.",
        epilog="examples:\n  refinery demo                       # configs/demo.yaml on data/sample/\n"
               "  refinery demo --config my.yaml      # your own data\n"
               "  refinery demo --changed             # only what is missing or stale, after an edit\n"
               "  refinery demo --changed --until phase_manifests   # the same, stopping before training\n"
               "  make ui CONFIG=my.yaml              # the runs in the Dagster UI",
    )
    p.add_argument("--config", default="configs/demo.yaml", help="the run's YAML config (default configs/demo.yaml)")
    p.add_argument("--changed", action="store_true",
                   help="materialize only the assets and partitions that are missing or stale (new code version, "
                        "changed upstream data, or reading one that reruns), printing each and why first")
    p.add_argument("--until", metavar="ASSET", default=None,
                   help="materialize only ASSET and what it reads (e.g. phase_manifests: every data step, no "
                        "training); with --changed the plan also names what it leaves stale past ASSET")
    p.add_argument("--verbose", action="store_true",
                   help="print every Dagster event and a failed step's tracebacks (otherwise one line per failed "
                        "step, naming the log file that holds them)")
    p.set_defaults(func=run_demo, needs=GRAPH)
