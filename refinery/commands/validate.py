"""`refinery validate --config CONFIG [--json] [--plot PATH] [--inventory JSON]`: the curriculum's
contract, printed before any compute is spent (seed 000), and a picture of the schedule.

Inventory comes from the final shuffled shards when the data root has them; `--inventory` takes
tokens per bucket from a JSON file instead (`{"web": 12000000000000, ...}`), to check a plan
before the corpus exists; with neither, the inventory is unknown and only the schedule is checked.
Exits 1 on a blocking error, 2 when the config or the data cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from refinery.config import RefineryConfig, load_config
from refinery.curriculum import (CurriculumError, Schedule, manifest_differences, stored_manifests,
                                 validate, validate_data_root)
from refinery.layout import SCHEDULE_PLOT_KEY
from refinery.preflight import Needs
from refinery.reports.contract import plot_schedule, render_text, write_schedule_plot
from refinery.shard_format import ShardFormatError
from refinery.storage import DataRoot, open_data_root
from refinery.throughput import ThroughputContract, throughput_contract


def load_inventory_file(path: str, buckets: list[str]) -> dict[str, int]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: inventory file not found") from None
    except json.JSONDecodeError as err:
        raise CurriculumError(f"{path}: not valid JSON ({err}); give an object of bucket -> tokens") from None
    if not isinstance(data, dict) or not all(isinstance(v, int) and v >= 0 for v in data.values()):
        raise CurriculumError(f"{path}: give an object of bucket -> token count (a non-negative integer)")
    unknown = sorted(set(data) - set(buckets))
    if unknown:
        raise CurriculumError(f"{path}: unknown buckets {unknown}; the config declares {buckets}")
    return {b: int(data.get(b, 0)) for b in buckets}


def run_validate(args: argparse.Namespace) -> int:
    config = args.config or args.config_file
    if config is None:
        print("refinery validate: give the config, e.g. `refinery validate --config configs/demo.yaml`", file=sys.stderr)
        return 2
    cfg = load_config(config)
    root = open_data_root(cfg.resolve(cfg.data_root))
    try:
        if args.inventory:
            report = validate(cfg, load_inventory_file(args.inventory, list(cfg.buckets)))
        else:
            report, _, _ = validate_data_root(cfg, root)
        plot = None
        schedule = report.schedule
        if schedule is not None:
            bands = ((report.contract or {}).get("difficulty") or {}).get("bands")
            if args.plot:
                plot_schedule(cfg, schedule, args.plot, bands)
                plot = str(Path(args.plot).resolve())
            else:
                write_schedule_plot(cfg, root, schedule, bands)
                plot = root.display(SCHEDULE_PLOT_KEY)
        manifests = manifest_check(cfg, root, schedule) if schedule is not None else None
    except (CurriculumError, ShardFormatError) as err:
        print(f"refinery validate: {err}", file=sys.stderr)
        return 2
    contract = run_contract(cfg, root)
    if args.json:
        print(json.dumps({**report.to_json(), "plot": plot, "manifests": manifests,
                          "throughput": contract.to_json() if contract else None}, indent=1, sort_keys=True))
    else:
        print(render_text(report))
        for line in contract.lines() if contract else []:
            print(line)
        if plot:
            print(f"schedule plot: {plot}")
        if manifests is not None:
            print("phase manifests: built from this curriculum" if manifests["match"] else
                  "phase manifests: built from another curriculum; `refinery train` refuses until phase_manifests is "
                  "rematerialized:\n" + "\n".join(f"  {d}" for d in manifests["differences"]))
    return 0 if report.ok else 1


def run_contract(cfg: RefineryConfig, root: DataRoot) -> ThroughputContract | None:
    """The throughput contract of `training.cluster` over the curriculum's budget (None: not stated)."""
    cluster = cfg.training.cluster
    if cluster is None or cfg.curriculum is None:
        return None
    return throughput_contract(cfg.curriculum.total_tokens, cluster.gpus, cluster.days, root, list(cfg.buckets))


def manifest_check(cfg: RefineryConfig, root: DataRoot, schedule: Schedule) -> dict[str, Any] | None:
    """Whether the data root's phase manifests were built from this curriculum (what `refinery train`
    checks before it starts); None when there are none yet."""
    assert cfg.curriculum is not None
    manifests = stored_manifests(root, {p.name for p in cfg.curriculum.phases})
    if not manifests:
        return None
    differences = manifest_differences(cfg, manifests, schedule)
    return {"match": not differences, "differences": differences}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help="check the config and the curriculum against the corpus, and print its contract",
        description="Check the config (every field, the eval sets and the data root) and the "
                    "curriculum against the corpus: tokens per phase and bucket, effective epochs per bucket, "
                    "predicted shortfalls, and whether the phase manifests were built from this curriculum. "
                    "Inventory comes from the final shards when the data root has them, or from --inventory. "
                    "Draws the schedule plot. Exit 1 on a blocking curriculum error, 2 on a config problem.",
        epilog="examples:\n  refinery validate --config configs/demo.yaml\n"
               "  refinery validate configs/demo.yaml --inventory tokens.json --plot schedule.png",
    )
    p.add_argument("config_file", nargs="?", metavar="CONFIG", help="the config file (the same as --config)")
    p.add_argument("--config", help="the run's YAML config (e.g. configs/demo.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", help="write the schedule PNG here instead of <data_root>/" + SCHEDULE_PLOT_KEY)
    p.add_argument("--inventory", help="JSON of bucket -> tokens to validate against instead of the final shards")
    # Not the sources: a plan is checked with --inventory before the corpus exists. Only the plot
    # is written to the data root, and --plot puts it elsewhere. The cluster: the run this config
    # plans sends its tasks there.
    p.set_defaults(func=run_validate, needs=lambda args: Needs(eval_sets=True, curriculum=True, writes=args.plot is None,
                                                               cluster=True))
