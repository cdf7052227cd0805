"""The sensors: one registers the input batches of new files, one re-scans the anneal phase as
training approaches it.

`input_batches_sensor` exists with dynamic batches (`partitions.dynamic: true`): it lists the input
and adds the keys the instance does not hold yet, `partitions.register_chunk` per request.

`anneal_rescan_sensor` reads the phase run directories' status files (the trainer's progress) and
the phase manifests (where anneal begins, in steps), and requests `contamination_scan[anneal]` once
training is within `contamination.sensor_steps_before_anneal` steps of that boundary. The run key
names the anneal manifest's bytes, so each version of the manifest is re-scanned once per approach,
not every tick.
"""

import dagster as dg

from assets.partitions import INPUT_BATCHES, Partitions, chunked, unregistered_batches
from assets.resource import RefineryResource
from orchestration.schedules import RESCAN_JOB, anneal_phase
from refinery.config import RefineryConfig
from refinery.layout import manifest_key

INPUT_SENSOR_INTERVAL_S = 300
RESCAN_SENSOR_INTERVAL_S = 30


def input_batches_sensor(cfg: RefineryConfig) -> dg.SensorDefinition:
    @dg.sensor(name="input_batches_sensor", minimum_interval_seconds=INPUT_SENSOR_INTERVAL_S,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description="Adds the batch keys of new input files to the input_batches partitions, "
                           f"{cfg.partitions.register_chunk} keys per request")
    def _input_batches_sensor(context: dg.SensorEvaluationContext, refinery: RefineryResource):
        new = unregistered_batches(refinery.config, context.instance)
        if not new:
            return dg.SkipReason("every input batch is registered")
        context.log.info(f"input_batches_sensor: registering {len(new)} new batch(es)")
        return dg.SensorResult(dynamic_partitions_requests=[
            dg.AddDynamicPartitionsRequest(INPUT_BATCHES, chunk)
            for chunk in chunked(new, refinery.config.partitions.register_chunk)
        ])

    return _input_batches_sensor


def anneal_rescan_sensor(cfg: RefineryConfig) -> dg.SensorDefinition:
    phase = anneal_phase(cfg)

    @dg.sensor(name="anneal_rescan_sensor", job_name=RESCAN_JOB, minimum_interval_seconds=RESCAN_SENSOR_INTERVAL_S,
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Re-scan phase {phase!r} when training comes within "
                           f"{cfg.contamination.sensor_steps_before_anneal} steps of it")
    def _anneal_rescan_sensor(context: dg.SensorEvaluationContext, refinery: RefineryResource):
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

    return _anneal_rescan_sensor


def build_definitions(cfg: RefineryConfig, parts: Partitions) -> dg.Definitions:
    sensors = []
    if cfg.partitions.dynamic:
        sensors.append(input_batches_sensor(cfg))
    if parts.phases is not None:
        sensors.append(anneal_rescan_sensor(cfg))
    return dg.Definitions(sensors=sensors)
