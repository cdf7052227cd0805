"""The funnel and the global dedup stages backfilled on a real multi-process instance: Postgres
storage, the QueuedRunCoordinator, a `dagster-daemon run` process, runs launched by the code server
and executed by the multiprocess executor (fixtures in conftest.py, machinery in helpers/pg_instance.py).

One test, because every check needs the same slow backfill: at least two runs overlap in time,
every run succeeds, the outputs are byte-identical to the in-process demo path on a second data
root, and a run killed mid-way (SIGKILL of its run worker and step processes) re-executes from
failure to the same bytes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import polars as pl
import pytest
from dagster import job, op

from orchestration.demo import QUIET_RUN_CONFIG
from helpers.digests import digests
from helpers.materialize import in_memory_instance
from helpers.pg_instance import (
    RUN_CONFIG, BackfillDriver, backfill_selection, descendants, max_overlap, run_groups, sample_config,
    started_pid,
)

REPO = Path(__file__).resolve().parents[1]
BACKFILL_TIMEOUT_S = 300
def content_digests(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root; JSON compared without its timing fields."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return digests((str(p.relative_to(root)), p.read_bytes()) for p in files)


def kill_run_at_step(instance, run, step_key: str) -> bool:
    """SIGKILL the run worker and every process below it once the executor is launching `step_key`
    (its upstream steps are done): the node running it died. False until then."""
    if run.is_finished:
        return False
    # STEP_WORKER_STARTING is the executor launching the step's process (planned-materialization
    # events carry the step key too, but come at run start).
    launching = any(e.step_key == step_key and e.dagster_event is not None
                    and e.dagster_event.event_type_value == "STEP_WORKER_STARTING"
                    for e in instance.all_logs(run.run_id))
    worker = started_pid(instance, run.run_id, "Started process for run")
    if not launching or worker is None:
        return False
    for pid in [worker, *descendants(worker)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


@pytest.mark.slow
def test_backfill_on_postgres_with_daemon(local_instance_factory, tmp_path):
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph

    # Reference: the in-process demo path, on its own data root and a throwaway in-memory instance.
    reference_config = sample_config(tmp_path, "in_process")
    reference_defs = build_definitions(reference_config)
    with in_memory_instance(tmp_path / "reference_home") as reference:
        materialize_graph(reference_defs, reference, backfill_selection(reference_defs), log=lambda line: None,
                          run_config=QUIET_RUN_CONFIG)
    expected = content_digests(tmp_path / "out" / "in_process")
    # Every global stage wrote its files, and near dedup found clusters: the comparison below has teeth.
    for prefix in ("dedup/signatures/", "dedup/exact/", "dedup/near/edges/", "dedup/near/clusters"):
        assert any(k.startswith(prefix) for k in expected), (prefix, sorted(expected))
    dedup = tmp_path / "out" / "in_process" / "dedup"
    assert pl.read_parquet(dedup / "near" / "clusters.parquet").height > 0
    assert pl.read_parquet(dedup / "exact" / "*.parquet").height > 0

    config = sample_config(tmp_path, "backfill")
    defs = build_definitions(config)
    selection = backfill_selection(defs)
    groups = run_groups(defs, selection)
    first_group_keys = {k.to_user_string() for k in groups[0][0]}
    assert {"raw_documents", "heuristic_filtered"} <= first_group_keys, groups
    # Hash ranges and bands each get a run per partition, as the global stages are meant to scale.
    by_name = {k.to_user_string(): pdef for keys, pdef in groups for k in keys}
    assert len(by_name["exact_deduped"].get_partition_keys()) >= 2
    assert len(by_name["near_deduped"].get_partition_keys()) >= 2

    local = local_instance_factory(config, max_concurrent_runs=2)
    instance = local.instance()
    # Polled often, so the kill below lands while the first funnel run is still going on a fast machine.
    driver = BackfillDriver(local, instance, run_config=RUN_CONFIG, poll_s=0.2)
    try:
        # The first funnel run dies as its second stage starts.
        killed: list[str] = []
        second_step = groups[0][0][1].to_python_identifier()

        def kill_first_funnel_run(runs):
            if not killed and kill_run_at_step(instance, runs[0], second_step):
                killed.append(runs[0].run_id)
                # Nothing reports a SIGKILLed worker under the default launcher; an operator marks it.
                instance.report_run_failed(instance.get_run_by_id(runs[0].run_id), "run worker SIGKILLed by the test")

        runs = []
        start = time.monotonic()
        for i, (keys, pdef) in enumerate(groups):
            ids = [driver.submit(keys, pk) for pk in (pdef.get_partition_keys() if pdef else [None])]
            finished = driver.wait(ids, BACKFILL_TIMEOUT_S, kill_first_funnel_run if i == 0 else None)
            failed = [r for r in finished if r.status != dg.DagsterRunStatus.SUCCESS]
            if i == 0:
                assert [r.run_id for r in failed] == killed, [(r.run_id, r.status) for r in finished]
                retried = driver.wait([driver.reexecute_from_failure(r.run_id) for r in failed], BACKFILL_TIMEOUT_S)
                finished = [r for r in finished if r.status == dg.DagsterRunStatus.SUCCESS] + retried
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in finished), [
                (r.run_id, r.status, r.tags.get("dagster/partition")) for r in finished]
            runs += finished
            print(f"{[k.to_user_string() for k in keys]}: {len(finished)} run(s), {time.monotonic() - start:.0f}s since start")
    finally:
        driver.close()

    assert killed, "the first funnel run finished before the test could kill it"
    retries = [r for r in runs if r.tags.get("dagster/parent_run_id") == killed[0]]
    assert len(retries) == 1 and retries[0].tags.get("dagster/partition") == \
        instance.get_run_by_id(killed[0]).tags.get("dagster/partition")
    # From failure: the step that had finished before the kill is not run again.
    assert groups[0][0][0].to_python_identifier() not in retries[0].step_keys_to_execute
    assert max_overlap(runs, instance) >= 2
    # Every step ran in its own process: the multiprocess executor, not the in-process one.
    assert started_pid(instance, runs[-1].run_id, "Executing steps using multiprocess executor") is not None

    assert content_digests(tmp_path / "out" / "backfill") == expected


@op
def noop() -> None:
    pass


@job
def noop_job() -> None:
    noop()


def test_local_instance_yaml_on_postgres(postgres_server, tmp_path, monkeypatch):
    """deploy/local/dagster.yaml opens on the fixture's Postgres with the queue in front of the
    launcher and its limit from the environment; a run's record and events round-trip through Postgres."""
    import dagster as dg
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

    from helpers.pg_instance import INSTANCE_YAML

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML.read_text())
    monkeypatch.setenv("DAGSTER_PG_URL", postgres_server.url)
    monkeypatch.setenv("REFINERY_MAX_CONCURRENT_RUNS", "3")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert instance.run_coordinator.get_run_queue_config().max_concurrent_runs == 3
        result = noop_job.execute_in_process(instance=instance)
        assert result.success
        stored = instance.get_run_by_id(result.run_id)
        assert stored.status == dg.DagsterRunStatus.SUCCESS
        steps = [e.dagster_event.event_type_value for e in instance.all_logs(result.run_id) if e.step_key == "noop"]
        assert "STEP_START" in steps and steps[-1] == "STEP_SUCCESS"


def test_run_groups_follow_the_partitioning(tmp_path):
    """One group per change of partitions definition, in dependency order; a run of the first
    group covers the funnel chain of one input partition."""
    from orchestration.definitions import build_definitions

    defs = build_definitions(sample_config(tmp_path, "groups"))
    groups = run_groups(defs, backfill_selection(defs))
    names = [[k.to_user_string() for k in keys] for keys, _ in groups]
    assert names == [
        ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered", "dedup_signatures"],
        ["exact_deduped"], ["near_deduped"], ["near_dup_clusters"],
    ]
    assert [len(pdef.get_partition_keys()) if pdef else 1 for _, pdef in groups][1:] == [2, 4, 1]
