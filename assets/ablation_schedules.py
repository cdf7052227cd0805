"""The schedule-ablation assets, present when the `ablations` section has `schedules`
(docs/ablations.md, "Schedule variants"):

- `ablation_schedule_runs`, one partition per schedule variant and seed: its derived curriculum
  and manifests written beside the `funnel` variant's (refinery/ablations/schedule_runs.py), then
  its phases trained as `training_run` trains them, each from the previous phase's boundary
  checkpoint in a run directory of its own, in one launch (a Pipes subprocess here or on a Ray node,
  relaunched from the latest checkpoint when it dies: a launch costs more than a short phase trains),
  then the model's bits per byte on the held-out evaluation set (training/schedule_run.py).
- `ablation_anneal_runs`, one partition per anneal mixture and seed, with `ablations.anneal_search`:
  the last phase only, from the pre-anneal boundary checkpoint of the seed's `curriculum` run. A
  killed branch resumes from its own latest checkpoint; a finished one is not trained again.
- `ablation_schedule_report`: the variants' training loss per bucket over tokens (seed 0), phase
  boundaries marked, and the schedule part of `refinery ablations` (refinery/ablations/schedule_report.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import dagster as dg

from assets.ablations import result_tables
from assets.factory import StepResult, global_step_asset
from assets.provenance import Provenance, code_version, image_markdown
from assets.resource import RefineryResource
from assets.training import POOL, launches_metadata, train_through_pipes, training_curves
from refinery.ablations import schedule_runs, schedules
from refinery.ablations.report import markdown_table, results_key
from refinery.ablations.schedule_report import format_schedule_report, schedule_report
from refinery.ablations.schedules import ANNEAL, SCHEDULE, ScheduleError, run_name
from refinery.config import RefineryConfig

SEED = "seed"
DIMENSION = {SCHEDULE: "schedule", ANNEAL: "mixture"}
ASSET = {SCHEDULE: "ablation_schedule_runs", ANNEAL: "ablation_anneal_runs"}
REPORT_ASSET = "ablation_schedule_report"
CURVES_PLOT_KEY = "ablations/schedule_curves.png"


def run_names(cfg: RefineryConfig, kind: str) -> list[str]:
    ab = cfg.ablations
    assert ab is not None
    if kind == SCHEDULE:
        return list(ab.schedules)
    return list(ab.anneal_search.mixtures) if ab.anneal_search is not None else []


def partitions(cfg: RefineryConfig, kind: str) -> dg.MultiPartitionsDefinition | None:
    names = run_names(cfg, kind) if cfg.ablations is not None else []
    if not names:
        return None
    assert cfg.ablations is not None
    return dg.MultiPartitionsDefinition({
        DIMENSION[kind]: dg.StaticPartitionsDefinition(names),
        SEED: dg.StaticPartitionsDefinition([str(s) for s in range(cfg.ablations.seeds)])})


def child_args(config_path: str, kind: str, name: str, seed: int, phase: str, resume: str) -> list[str]:
    """The interpreter's arguments of one launch from `phase` through the last (assets/pipes_ablation.py's
    schedule child)."""
    return ["-m", "assets.pipes_ablation", "schedule", "--config", config_path, "--kind", kind, "--name", name,
            "--seed", str(seed), "--phase", phase, "--resume", resume]


def run_schedule(kind: str, version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        from training.phase_runs import phase_run_dir
        from training.schedule_run import first_unfinished

        cfg, root = refinery.config, refinery.root
        keys = context.partition_key.keys_by_dimension
        name, seed = keys[DIMENSION[kind]], int(keys[SEED])
        try:
            curriculum = schedule_runs.prepare_run(root, cfg, kind, name)
        except ScheduleError as err:
            raise dg.Failure(description=str(err), allow_retries=False) from err
        vcfg = schedule_runs.run_config(root, cfg, kind, name, seed)
        first = first_unfinished(vcfg, kind)
        config_path = os.path.abspath(refinery.config_path)
        training, checkpoints, nodes = train_through_pipes(
            context, cfg, vcfg, first, lambda resume, _: child_args(config_path, kind, name, seed, first, resume))
        last = vcfg.curriculum.phases[-1]
        key = results_key(run_name(kind, name), seed)
        results = root.read_json(key)
        context.log.info(f"{ASSET[kind]}[{name}, seed {seed}]: {results['bpb']:.4f} bits per byte")
        extra = {"share_of_run": dg.MetadataValue.float(round(last.tokens / vcfg.curriculum.total_tokens, 6)),
                 "start_checkpoint_sha256": dg.MetadataValue.text(results["start_checkpoint_sha256"])} \
            if kind == ANNEAL else {}
        return StepResult(
            Provenance(version, {"curriculum": curriculum, "seed": seed, "model": results["model"]}, {key: root.sha256(key)}),
            {
                "bpb": dg.MetadataValue.float(round(results["bpb"], 6)),
                **result_tables(results),
                "phases": dg.MetadataValue.md(phase_table(curriculum)),
                "tokens_trained": dg.MetadataValue.int(int(results["tokens_trained"])),
                "steps": dg.MetadataValue.int(int(results["steps"])),
                "model_sha256": dg.MetadataValue.text(results["model_sha256"]),
                "results": dg.MetadataValue.path(root.display(key)),
                **extra,
                **launches_metadata(training, checkpoints, nodes),
                **training_curves(phase_run_dir(vcfg, last.name), last.name),
            },
        )
    return step


def phase_table(curriculum: dict[str, Any]) -> str:
    rows = ["| phase | tokens | seq_len | lr_scale | weights |", "| --- | ---: | ---: | ---: | --- |"]
    for p in curriculum["phases"]:
        weights = ", ".join(f"{b} {w:.3f}" for b, w in p["weights"].items())
        rows.append(f"| {p['name']} | {p['tokens']:,} | {p['seq_len']} | {p['lr_scale']:g} | {weights} |")
    return "\n".join(rows)


def loss_curves(cfg: RefineryConfig, root) -> dict[str, list[dict[str, Any]]]:
    """Seed 0's step records (tokens, phase, loss per bucket) of every schedule run that has them."""
    from training.metrics import JsonLines
    from training.phase_runs import phase_run_dir

    out = {}
    for kind in (SCHEDULE, ANNEAL):
        for name in run_names(cfg, kind):
            try:
                vcfg = schedule_runs.run_config(root, cfg, kind, name, 0)
            except ScheduleError:
                continue  # not prepared yet
            records = []
            for phase in vcfg.curriculum.phases:
                path = phase_run_dir(vcfg, phase.name) / "metrics.jsonl"
                records += JsonLines(path).read() if path.is_file() else []
            if records:
                out[run_name(kind, name)] = records
    return out


def curves_png(curves: dict[str, list[dict[str, Any]]], boundaries: list[int], buckets: list[str]) -> bytes:
    """One panel per bucket: each run's training loss on that bucket over tokens, the curriculum's
    phase boundaries as dotted lines."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(buckets), figsize=(5 * len(buckets), 3.6), squeeze=False)
    for ax, bucket in zip(axes[0], buckets):
        for name, records in sorted(curves.items()):
            points = [(r["tokens"], r[f"loss/{bucket}"]) for r in records if f"loss/{bucket}" in r]
            if points:
                ax.plot(*zip(*points), linewidth=1, label=name)
        for boundary in boundaries:
            ax.axvline(boundary, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"training loss, bucket {bucket}", fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("loss")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})  # same records, same bytes
    plt.close(fig)
    return buf.getvalue()


def report_schedules(version: str):
    def step(context: dg.AssetExecutionContext, refinery: RefineryResource) -> StepResult:
        cfg, root = refinery.config, refinery.root
        curves = loss_curves(cfg, root)
        if not curves:
            raise dg.Failure(f"no schedule run has trained yet; materialize {ASSET[SCHEDULE]} first")
        curriculum = schedule_runs.run_config(root, cfg, SCHEDULE, schedules.CURRICULUM, 0).curriculum \
            if f"{SCHEDULE}.{schedules.CURRICULUM}" in curves else None
        boundaries = [] if curriculum is None else [sum(p.tokens for p in curriculum.phases[:i + 1])
                                                    for i in range(len(curriculum.phases) - 1)]
        png = curves_png(curves, boundaries, list(cfg.buckets))
        hashes = {CURVES_PLOT_KEY: root.write_bytes(CURVES_PLOT_KEY, png)}
        table = schedule_report(root, cfg)
        tables = {} if table is None else {
            "table": dg.MetadataValue.md(markdown_table(table, {"all"})),
            "report_text": dg.MetadataValue.md(f"`refinery ablations` (schedule part):\n\n```\n"
                                               f"{format_schedule_report(table)}\n```"),
            "report": dg.MetadataValue.json(table)}
        return StepResult(
            Provenance(version, {"runs": sorted(curves)}, hashes),
            {"loss_curves": image_markdown(png, "training loss per bucket of every schedule run",
                                           f"seed 0, over tokens; dotted: the curriculum's phase boundaries "
                                           f"(`{root.display(CURVES_PLOT_KEY)}`)"),
             **tables,
             "runs": dg.MetadataValue.json(sorted(curves))},
        )
    return step


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    by_kind = {kind: partitions(cfg, kind) for kind in (SCHEDULE, ANNEAL)}
    if by_kind[SCHEDULE] is None:
        return dg.Definitions()
    from training import proxy_run, schedule_run

    group = "ablations"
    runs_version = code_version(sys.modules[__name__], schedules, schedule_runs, schedule_run, proxy_run,
                                train_through_pipes)
    upstream = {SCHEDULE: [dg.AssetDep("ablation_variants", partition_mapping=dg.AllPartitionMapping())],
                ANNEAL: [dg.AssetDep(ASSET[SCHEDULE], partition_mapping=dg.AllPartitionMapping())]}
    described = {SCHEDULE: "Per schedule variant and seed: the curriculum's phase table (or one derived from it) "
                           "scaled to the ablation budget, trained phase by phase on the funnel variant's data, then "
                           "its bits per byte on the held-out evaluation set.",
                 ANNEAL: "Per anneal mixture and seed: the last phase only, from the pre-anneal boundary checkpoint "
                         "of the seed's curriculum run, then its bits per byte."}
    assets = [global_step_asset(ASSET[kind], run_schedule(kind, runs_version), version=runs_version, group=group,
                                kinds={"pytorch"}, automation_condition=None, partitions_def=definition, pool=POOL,
                                deps=upstream[kind], description=described[kind])
              for kind, definition in by_kind.items() if definition is not None]
    from refinery.ablations import report, schedule_report as schedule_table

    report_version = code_version(sys.modules[__name__], report, schedule_table)
    assets.append(global_step_asset(
        REPORT_ASSET, report_schedules(report_version), version=report_version, group=group,
        kinds={"matplotlib"}, automation_condition=None,
        deps=[dg.AssetDep(ASSET[kind], partition_mapping=dg.AllPartitionMapping()) for kind, d in by_kind.items() if d],
        description="The schedule variants' and anneal branches' training loss per bucket over tokens, the "
                    "curriculum's phase boundaries marked."))
    return dg.Definitions(assets=assets)
