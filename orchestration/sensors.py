"""The sensor that re-scans the anneal phase as training approaches it.

It reads the phase run directories' status files (the trainer's progress) and the phase manifests
(where anneal begins, in steps), and requests `contamination_scan[anneal]` once training is within
`contamination.sensor_steps_before_anneal` steps of that boundary. The run key names the anneal
manifest's bytes, so each version of the manifest is re-scanned once per approach, not every tick.
"""

import dagster as dg

from orchestration.resources import RefineryResource
from orchestration.schedules import RESCAN_JOB, anneal_phase
from refinery.config import RefineryConfig
from refinery.manifest import manifest_key

SENSOR_INTERVAL_S = 30


def build_definitions(cfg: RefineryConfig, parts) -> dg.Definitions:
    if parts.phases is None:
        return dg.Definitions()
    phase = anneal_phase(cfg)

    @dg.sensor(name="anneal_rescan_sensor", job_name=RESCAN_JOB, minimum_interval_seconds=SENSOR_INTERVAL_S,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Re-scan phase {phase!r} when training comes within "
                           f"{cfg.contamination.sensor_steps_before_anneal} steps of it")
    def anneal_rescan_sensor(context: dg.SensorEvaluationContext, refinery: RefineryResource):
        from training.phase_runs import rescan_due

        root = refinery.root
        if not root.exists(manifest_key(phase)):
            return dg.SkipReason(f"no manifest for phase {phase!r} yet; materialize phase_manifests[{phase}]")
        due, where = rescan_due(refinery.config, root, phase)
        if not due:
            return dg.SkipReason(where)
        context.log.info(f"anneal_rescan_sensor: {where}; requesting contamination_scan[{phase}]")
        return dg.RunRequest(run_key=f"{phase}:{root.sha256(manifest_key(phase))[:16]}", partition_key=phase,
                             tags={"refinery/trigger": "sensor"})

    return dg.Definitions(sensors=[anneal_rescan_sensor])
