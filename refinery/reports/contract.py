"""The curriculum's contract as people read it (the tables `refinery validate` prints and the
curriculum report asset writes) and the picture of the schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from refinery.config import RefineryConfig
from refinery.curriculum import Schedule, ValidationReport, warmup_tokens
from refinery.curriculum.bands import served_difficulty
from refinery.storage import DataRoot, atomic_path
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
    """Per phase with a quality cut, per bucket: each language's share of the bucket's tokens and of
    the tokens the cut kept, and its kept tokens and documents."""
    lines = []
    for phase, cut in contract.get("quality_cut", {}).items():
        lines += ["", f"quality cut of {phase} ({cut['cut'].replace('_', ' ')}): each language's share of the "
                      "bucket's tokens -> of those kept (kept/tokens, kept/documents)"]
        for bucket, languages in cut["buckets"].items():
            shares = ", ".join(f"{lang} {v['share_of_bucket']:.1%} -> {v['share_of_selection']:.1%} "
                               f"({v['kept_tokens']:,}/{v['tokens']:,} tokens, {v['kept']}/{v['documents']} documents)"
                               for lang, v in (languages or {}).items())
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
