"""The sensor that evaluates the assets' automation conditions (docs/automation.md says which
condition each asset has and why).

Every asset but `training_run` and the ablation assets carries a condition: the per-batch funnel,
dedup, tokens, manifests and scans follow their upstream (`eager`), the tokenizer and the quality
model are built once (`on_missing`). `training_run` has none: it spends accelerator time and is
gated by the contamination checks, so a person launches it; so do the ablations (proxy models
trained per variant and seed), which a person runs when a stage's effect is the question.

The sensor starts stopped, as Dagster's own default automation sensor does: a deployment turns it on
once (UI: Automation, or `dagster sensor start refinery_automation`), and a daemon started for a
one-off backfill or a test launches nothing of its own.
"""

import dagster as dg

from refinery.config import RefineryConfig

SENSOR_NAME = "refinery_automation"
SENSOR_INTERVAL_S = 60
MANUAL = ("training_run",)  # assets no condition may launch
ABLATIONS = ("ablation_variants", "ablation_runs", "ablation_report")  # a person launches these too
# ... and the schedule ablations', where the section has `schedules` (assets/ablation_schedules.py)
SCHEDULE_ABLATIONS = ("ablation_schedule_runs", "ablation_anneal_runs", "ablation_schedule_report")


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    # A config without a curriculum has no training_run, one without `ablations` no ablation assets.
    manual = (MANUAL if parts.phases is not None else ()) + (ABLATIONS if parts.ablation_runs is not None else ())
    if cfg.ablations is not None and cfg.ablations.schedules:
        manual += SCHEDULE_ABLATIONS if cfg.ablations.anneal_search else tuple(a for a in SCHEDULE_ABLATIONS
                                                                               if a != "ablation_anneal_runs")
    sensor = dg.AutomationConditionSensorDefinition(
        SENSOR_NAME,
        target=dg.AssetSelection.all() - dg.AssetSelection.assets(*manual),
        default_status=dg.DefaultSensorStatus.STOPPED,
        minimum_interval_seconds=SENSOR_INTERVAL_S,
        description="Materializes new input batches through the funnel, dedup, tokens, phase manifests and "
                    "contamination scans; never training_run or the ablations",
    )
    return dg.Definitions(sensors=[sensor])
