"""The cron re-scan of the anneal phase for eval-set contamination.

Anneal replays its corpus when the model is most receptive (seed 000), so its contamination scan is
repeated on a schedule (`contamination.rescan_cron`) while earlier phases train: an eval set that
changed, or a manifest rebuilt since, is caught before anneal starts rather than after.
"""

import dagster as dg

from refinery.config import RefineryConfig

RESCAN_JOB = "contamination_rescan"


def anneal_phase(cfg: RefineryConfig) -> str:
    return cfg.contamination.anneal_phase or cfg.curriculum.phases[-1].name


def rescan_job(parts):
    return dg.define_asset_job(RESCAN_JOB, selection=dg.AssetSelection.assets("contamination_scan"),
                               partitions_def=parts.phases,
                               description="Re-scan one phase's manifest against the eval sets")


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()
    phase = anneal_phase(cfg)

    @dg.schedule(name="anneal_rescan_schedule", cron_schedule=cfg.contamination.rescan_cron, job_name=RESCAN_JOB,
                 default_status=dg.DefaultScheduleStatus.RUNNING,
                 description=f"Re-scan phase {phase!r} for eval-set contamination ({cfg.contamination.rescan_cron})")
    def anneal_rescan_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        return dg.RunRequest(partition_key=phase, tags={"refinery/trigger": "schedule"})

    return dg.Definitions(jobs=[rescan_job(parts)], schedules=[anneal_rescan_schedule])
