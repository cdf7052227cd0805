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

import numpy as np

from refinery.config import RefineryConfig, load_config
from refinery.curriculum import (CurriculumError, Schedule, ValidationReport, manifest_differences, stored_manifests,
                                 validate, validate_data_root, warmup_tokens)
from refinery.curriculum.bands import served_difficulty
from refinery.preflight import Needs
from refinery.shard_format import ShardFormatError
from refinery.throughput import ThroughputContract, throughput_contract
from refinery.storage import DataRoot, atomic_path, open_data_root
from refinery.layout import SCHEDULE_PLOT_KEY

PLOT_POINTS = 800


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "unknown"
    return f"{x:,.{digits}f}"


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)]


def markdown_table(header: list[str], rows: list[list[str]], bold_first: str | None = None) -> list[str]:
    """A markdown table; the row whose first cell is `bold_first` is set in bold."""
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        cells = [f"**{c}**" if r[0] == bold_first and c else c for c in r]
        out.append("| " + " | ".join(cells) + " |")
    return out


def phase_rows(contract: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Tokens per bucket per phase, and in total."""
    buckets = list(contract["buckets"])
    rows = []
    for p in contract["phases"]:
        rows.append(
            [p["name"], _num(p["tokens"]), f"{p['share']:.1%}", str(p["seq_len"]), f"{p['lr_scale']:g}", _num(p["blend_tokens"]),
             "-" if p["quality_top_fraction"] is None else f"top {p['quality_top_fraction']:.0%}"]
            + [_num(p["bucket_tokens"][b]) for b in buckets]
        )
    rows.append(["total", _num(contract["schedule_tokens"]), "", "", "", "", ""] + [_num(contract["buckets"][b]["tokens"]) for b in buckets])
    return ["phase", "tokens", "share", "seq_len", "lr_scale", "blend", "quality"] + buckets, rows


def bucket_rows(contract: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Inventory, effective epochs and predicted shortfall per bucket."""
    rows = [
        [b, _num(v["tokens"]), _num(v["inventory_tokens"]), f"{v['max_epochs']:g}", _num(v["effective_epochs"], 2), _num(v["shortfall"])]
        for b, v in contract["buckets"].items()
    ]
    return ["bucket", "demand", "inventory", "max_epochs", "epochs", "shortfall"], rows


# One line under each table of `render_text`, naming what its columns that do not say it themselves hold.
PHASE_LEGEND = ("blend: tokens at the start of the phase over which the mixture moves from the previous phase's "
                "weights to its own; quality: the top share of each bucket by quality score the phase reads (- every "
                "document); each bucket's column: the tokens the phase reads from it")
BUCKET_LEGEND = ("demand: tokens the whole curriculum reads from the bucket; inventory: its tokens in the final shards "
                 "times max_epochs (the passes allowed over it); epochs: the passes the demand makes; shortfall: "
                 "demand beyond inventory")


def summary_lines(contract: dict[str, Any]) -> list[str]:
    a = contract["attention"]
    longest = max(p["seq_len"] for p in contract["phases"])
    return [
        f"mean seq_len (share-weighted): {contract['mean_seq_len']:,.1f}",
        f"attention compute saved by length warmup vs all at {longest}: {a['saved_fraction']:.1%} "
        f"({a['ratio']:.2f}x less; per token {a['per_token_ratio']:.2f}x)",
    ]


def order_lines(contract: dict[str, Any]) -> list[str]:
    """Each phase's order within its buckets, and for ordered phases the mean difficulty served at
    each tenth of the phase (the mixture-weighted mean of the band each bucket is reading)."""
    lines = ["ordering within buckets:"]
    for p in contract["phases"]:
        o = p.get("order")
        lines.append(f"  {p['name']}: " + ("uniform" if o is None else
                                           f"{o['direction']} by {o['by']}, {o['bands']} band{'s' if o['bands'] != 1 else ''}"))
    difficulty = contract.get("difficulty")
    for name, values in (difficulty or {}).get("progress", {}).items():
        served = ("unknown (no final shards yet)" if values is None else
                  " ".join("-" if v is None else f"{v:.3f}" for v in values))
        lines.append(f"mean difficulty served in {name}, at each tenth of the phase: {served}")
    return lines


def quality_cut_lines(contract: dict[str, Any]) -> list[str]:
    """Per phase with a quality cut, per bucket: each language's share of the bucket's documents and
    of the documents the cut kept."""
    lines = []
    for phase, cut in contract.get("quality_cut", {}).items():
        lines += ["", f"quality cut of {phase} ({cut['cut'].replace('_', ' ')}): each language's share of the "
                      "bucket's documents -> of those kept (kept/documents)"]
        for bucket, languages in cut["buckets"].items():
            shares = ", ".join(f"{lang} {v['share_of_bucket']:.1%} -> {v['share_of_selection']:.1%} "
                               f"({v['kept']}/{v['documents']})" for lang, v in (languages or {}).items())
            lines.append(f"  {bucket}: {shares or 'no documents'}")
    return lines


def render_text(report: ValidationReport) -> str:
    lines: list[str] = []
    c = report.contract
    if c is not None:
        lines.append(
            f"curriculum: {len(c['phases'])} phases, {c['schedule_tokens']:,} tokens "
            f"(total_tokens {c['total_tokens']:,}, temperature {c['temperature']:g})"
        )
        lines += ["", *text_table(*phase_rows(c)), PHASE_LEGEND, "", *text_table(*bucket_rows(c)), BUCKET_LEGEND, "",
                  *summary_lines(c), *order_lines(c), *quality_cut_lines(c)]
    for w in report.warnings:
        lines.append(f"warning: {w}")
    for e in report.errors:
        lines.append(f"error: {e}")
    lines.append("OK: the curriculum is valid" if report.ok else f"FAILED: {len(report.errors)} blocking error(s)")
    return "\n".join(lines)


def plot_schedule(cfg: RefineryConfig, schedule: Schedule, path: str | Path, bands: dict[str, Any] | None = None) -> None:
    """Mixture over progress (stacked area), seq_len and LR, one panel each, phase edges marked.
    With `bands` (the contract's difficulty bands of ordered phases) the mixture panel gains the
    mean difficulty served, on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.linspace(0, schedule.total_tokens, PLOT_POINTS, endpoint=False).astype(np.int64)
    mixture = np.stack([schedule.weights_at(int(x)) for x in t], axis=1)
    seq = [schedule.seq_len_at(int(x)) for x in t]
    tr = cfg.training
    wt = warmup_tokens(cfg, schedule)
    lr = [tr.lr * schedule.lr_multiplier(int(x), wt, tr.stable_schedule, tr.min_lr_ratio) for x in t]

    fig, (ax_mix, ax_seq, ax_lr) = plt.subplots(3, 1, figsize=(9, 7), sharex=True, height_ratios=[3, 1, 1])
    ax_mix.stackplot(t, mixture, labels=list(schedule.buckets))
    ax_mix.set_ylim(0, 1)
    ax_mix.set_ylabel("mixture")
    if bands:
        ax_difficulty = ax_mix.twinx()
        ax_difficulty.plot(t, served_difficulty(cfg, schedule, bands, t), color="black", linewidth=1.2)
        ax_difficulty.set_ylabel("mean difficulty served (line)")
    # beside the second axis' labels when there is one
    ax_mix.legend(loc="upper left", bbox_to_anchor=(1.1 if bands else 1.0, 1.0), fontsize=8)
    ax_seq.step(t, seq, where="post")
    ax_seq.set_ylabel("seq_len")
    ax_lr.plot(t, lr)
    ax_lr.set_ylabel("LR")
    ax_lr.set_xlabel("tokens consumed")
    for p in schedule.phases:
        for ax in (ax_mix, ax_seq, ax_lr):
            ax.axvline(p.start, color="black", linewidth=0.6, alpha=0.5)
        ax_mix.text(p.start + p.tokens / 2, 1.02, p.name, ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        # No "Software" tag: the same schedule gives the same PNG bytes across matplotlib builds.
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def write_schedule_plot(cfg: RefineryConfig, root: DataRoot, schedule: Schedule, bands: dict[str, Any] | None = None) -> str:
    """Draw the schedule into the data root at SCHEDULE_PLOT_KEY; returns the PNG's sha256."""
    with root.writer(SCHEDULE_PLOT_KEY) as tmp:
        plot_schedule(cfg, schedule, tmp, bands)
    return root.sha256(SCHEDULE_PLOT_KEY)


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
