"""State you can trust (issue 38): the Dagster state around `refinery demo` runs matches the data
root. Two configs with different data roots in one $DAGSTER_HOME each plan, run and show only their
own history; `--changed` sees edited, added and removed input files and gives the shards of a clean
run; training after an upstream change starts a new run, said in the plan, the old one kept; a failed
step is one line with its log, exit 4; a demo SIGKILLed inside training_run leaves no pool slot
held (and, on a bare instance, a dead run's slot is freed and a live one's wait is bounded). One tiny
graph (tests/helpers/tiny_graph.py), run through `refinery demo --changed` a few times, serves the
slow tests of the module, in order."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from assets.training import POOL
from orchestration.changed import MISSING, WRITTEN_CHANGED, stale_plan
from orchestration.cli import main as refinery
from orchestration.definitions import build_definitions
from orchestration.instance import instance_dir, prepare_instance_dir
from orchestration.runs import FAILURES_DIR, HOST_TAG, PID_TAG, PoolBusy, release_dead_runs, wait_for_pools
from refinery.config import load_config
from refinery.layout import FINAL_SHARDS_PREFIX, manifest_key
from training.phase_runs import phase_run_dir
from training.status import read_status

from helpers.tiny_graph import tiny_graph_config, write_pages, write_records

REPO = Path(__file__).resolve().parents[1]
ASSETS = 20  # the tiny graph's materializable assets (no difficulty model)
KILL_WAIT_S = 300  # how long the killed demo may take to reach training_run on a loaded machine
RERUN_LIMIT_S = 60
HANG_S = 600  # where the demo after the kill counts as hung (on main's code it waits forever)


def demo(config: Path, *extra: str) -> tuple[int, str, str]:
    """`refinery demo --changed --config CONFIG` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = refinery(["demo", "--config", str(config), "--changed", *extra])
    return code, out.getvalue(), err.getvalue()


def plan_lines(stdout: str) -> dict[str, str]:
    """Asset -> its plan line, from a demo's output."""
    return dict(re.findall(r"^  (\w+): (.*)$", stdout.split("Will materialize", 1)[-1].split("\n  ran ", 1)[0], re.M))


def final_shards(data_root: Path) -> dict[str, bytes]:
    folder = data_root / FINAL_SHARDS_PREFIX
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tagged_run(instance: dg.DagsterInstance, pid: int, pool_slot: bool) -> str:
    """A STARTED run tagged as a demo process `pid`'s, holding a slot of POOL when asked."""
    import socket

    from dagster._core.storage.dagster_run import DagsterRun

    run = DagsterRun(job_name="__ephemeral_asset_job__", status=dg.DagsterRunStatus.STARTED,
                     tags={PID_TAG: str(pid), HOST_TAG: socket.gethostname()})
    instance.add_run(run)
    if pool_slot:
        instance.event_log_storage.claim_concurrency_slot(POOL, run.run_id, "training_run")
    return run.run_id


def test_a_run_whose_demo_process_is_gone_is_failed_and_its_slot_freed_a_live_ones_wait_is_bounded(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        instance.event_log_storage.set_concurrency_slots(POOL, 1)
        dead = tagged_run(instance, gone.pid, pool_slot=True)
        alive = tagged_run(instance, os.getppid(), pool_slot=False)
        said: list[str] = []
        assert release_dead_runs(instance, said.append) == [dead]
        assert instance.get_run_by_id(dead).status == dg.DagsterRunStatus.FAILURE
        assert instance.get_run_by_id(alive).status == dg.DagsterRunStatus.STARTED
        assert said == [f"Marked run {dead} failed and freed its pool slots: the process that ran it (pid {gone.pid} "
                        f"on {instance.get_run_by_id(dead).tags[HOST_TAG]}) is gone"]
        wait_for_pools(instance, {POOL}, said.append, timeout_s=0.1)  # free: no wait, nothing said
        assert len(said) == 1

        instance.event_log_storage.claim_concurrency_slot(POOL, alive, "training_run")
        start = time.monotonic()
        with pytest.raises(PoolBusy, match=f"pool 'training_accelerator' stayed full for 1s, held by run {alive} "
                                           r"\(training_run, STARTED\)"):
            wait_for_pools(instance, {POOL}, said.append, timeout_s=1)
        assert time.monotonic() - start < 5
        assert said[-1] == f"  waiting up to 1s for a slot of pool 'training_accelerator', held by run {alive} " \
                           "(training_run, STARTED)"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Configs A (inputs a/) and B (inputs b/: a/ with a record edited, one removed, a file added and
    one removed) with their own data roots, both run with `--changed` into one $DAGSTER_HOME."""
    tmp = tmp_path_factory.mktemp("state")
    files = write_pages(tmp / "a", 5)
    extra = write_pages(tmp / "new", 1, seed=11)[0]
    edited = [dict(files[0][0], text=files[0][0]["text"] + " An edited closing sentence of this page."),
              *files[0][1:]]
    b = tmp / "b"
    b.mkdir()
    write_records(b / "f0.jsonl", edited)
    write_records(b / "f1.jsonl", files[1][:-1])
    for i in (2, 3):
        shutil.copy(tmp / "a" / f"f{i}.jsonl", b / f"f{i}.jsonl")
    write_records(b / "f5.jsonl", extra)
    home = tmp / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        mp.chdir(tmp)
        world = {"tmp": tmp, "home": home, "a": tiny_graph_config(tmp, tmp / "a", tmp / "outA", "a.yaml"),
                 "b": tiny_graph_config(tmp, b, tmp / "outB", "b.yaml")}
        world["a1"] = demo(world["a"])
        world["b1"] = demo(world["b"])
        yield world


def instance_of(world, name: str) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(instance_dir(load_config(world[name]), str(world["home"]))))


ASSET_MATERIALIZATIONS = """
query($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) { ... on Asset { assetMaterializations { runId partition } } }
}"""


def ui_materializations(world, name: str, asset: str) -> list[dict]:
    """What the UI's GraphQL answers for `asset` when `make ui CONFIG=<name's config>` serves it."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    with pytest.MonkeyPatch.context() as mp, instance_of(world, name) as instance:
        mp.setenv("REFINERY_CONFIG", str(world[name]))
        mp.chdir(REPO)
        with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])) as ws:
            result = execute_dagster_graphql(ws.create_request_context(), ASSET_MATERIALIZATIONS, {"path": [asset]})
    assert not result.errors, result.errors
    return result.data["assetOrError"]["assetMaterializations"]


@pytest.mark.slow
def test_two_configs_in_one_instance_directory_see_only_their_own_data_root(world, monkeypatch):
    for name in ("a1", "b1"):  # each config planned its whole graph as missing: B saw none of A's runs
        code, out, _ = world[name]
        assert code == 0, out
        lines = plan_lines(out)
        assert len(lines) == ASSETS and all(line.startswith(MISSING) for line in lines.values()), out
    assert load_config(world["b"]).data_root != load_config(world["a"]).data_root

    monkeypatch.setenv("DAGSTER_HOME", str(world["home"]))
    code, out, _ = demo(world["a"])  # A again, after B: its own work is done
    assert code == 0 and "Nothing to run" in out, out

    with instance_of(world, "a") as a, instance_of(world, "b") as b:
        runs_a, runs_b = set(a.get_run_ids()), set(b.get_run_ids())
    assert runs_a and runs_b and not runs_a & runs_b
    for asset in ("raw_documents", "funnel_report", "training_run"):
        shown = {m["runId"] for m in ui_materializations(world, "a", asset)}
        assert shown and shown <= runs_a and not shown & runs_b, asset

    # A copy of the config pointed at a new, empty output folder plans everything as missing.
    fresh = tiny_graph_config(world["tmp"], world["tmp"] / "a", world["tmp"] / "outC", "c.yaml")
    with dg.DagsterInstance.from_config(str(prepare_instance_dir(load_config(fresh), str(world["home"])))) as instance:
        plan = stale_plan(build_definitions(str(fresh)), instance)
    assert len(plan) == ASSETS and all(list(p.reasons) == [MISSING] for p in plan)

    # `make ui CONFIG=a.yaml` serves A's instance directory.
    made = subprocess.run(["make", "-n", "ui", f"CONFIG={world['a']}", f"BIN={Path(sys.executable).parent}", "STAMP=",
                           f"DAGSTER_HOME={world['home']}"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert f"mkdir -p {instance_dir(load_config(world['a']), str(world['home']))}\n" in made.stdout, made


@pytest.fixture(scope="module")
def a_edited(world):
    """A's inputs changed into B's (a record edited, one removed, a file added, one removed), then
    `refinery demo --changed` on A."""
    tmp = world["tmp"]
    trained = {phase: sorted(p.name for p in (phase_run_dir(load_config(world["a"]), phase) / "checkpoints").iterdir())
               for phase in ("warmup", "main")}
    for name in ("f0", "f1", "f5"):
        shutil.copy(tmp / "b" / f"{name}.jsonl", tmp / "a" / f"{name}.jsonl")
    (tmp / "a" / "f4.jsonl").unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(world["home"]))
        mp.chdir(tmp)
        return {"run": demo(world["a"]), "trained": trained}


@pytest.mark.slow
def test_inputs_edited_added_and_removed_are_planned_by_name_and_give_a_clean_runs_shards(world, a_edited):
    code, out, err = a_edited["run"]
    assert code == 0, out + err
    ingest = plan_lines(out)["raw_documents"]
    assert ingest.startswith("input files changed"), ingest
    for named in ("web-f0 edited", "web-f1 edited", "web-f4 removed", "web-f5 added"):
        assert named in ingest, ingest
    assert final_shards(world["tmp"] / "outA") == final_shards(world["tmp"] / "outB") != {}


@pytest.mark.slow
def test_training_after_an_upstream_change_starts_a_new_run_said_in_the_plan(world, a_edited):
    code, out, _ = a_edited["run"]
    assert code == 0
    cfg = load_config(world["a"])
    planned = out.index("training_run: ")
    assert out.index("warmup starts a new run", planned) < out.index("  ran raw_documents")
    kept = dict(re.findall(r"^  training_run\[(\w+)\]: the old run is kept at (\S+)$", out, re.M))
    assert set(kept) == set(a_edited["trained"])
    for phase, old in a_edited["trained"].items():
        archived = Path(kept[phase])
        assert archived.parent == phase_run_dir(cfg, phase).parent and archived.name.startswith(f"{phase}.archived-")
        assert sorted(p.name for p in (archived / "checkpoints").iterdir()) == old
    assert read_status(phase_run_dir(cfg, "main"))["state"] == "completed"


@pytest.mark.slow
def test_a_manifest_file_changed_since_written_is_planned_by_name(world, a_edited):
    """A phase's files (its manifest, band and selection files, schedule plot) edited after
    phase_manifests wrote them: the trainer would refuse the phase, so the plan rebuilds it, naming the
    file (on main's code the plan said "Nothing to run")."""
    cfg = load_config(world["a"])
    manifest = Path(cfg.resolve(cfg.data_root)) / manifest_key("main")
    assert manifest.is_file()
    original = manifest.read_bytes()
    manifest.write_bytes(original.replace(b'"main"', b'"MAIN"', 1))
    try:
        with instance_of(world, "a") as instance:
            plan = {p.key.to_user_string(): p for p in stale_plan(build_definitions(str(world["a"])), instance)}
    finally:
        manifest.write_bytes(original)
    rebuilt = plan["phase_manifests"]
    assert rebuilt.partitions == ["main"] and list(rebuilt.reasons) == [WRITTEN_CHANGED], rebuilt.line()
    assert f"{manifest_key('main')} changed" in rebuilt.line()
    assert "training_run" in plan  # what reads the phase follows


@pytest.mark.slow
def test_a_failed_step_is_one_line_naming_its_log_and_exits_4(world, a_edited, monkeypatch):
    import refinery.stages.ingest as ingest

    def disk_on_fire(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ingest, "stream_input_shard", disk_on_fire)
    monkeypatch.setenv("DAGSTER_HOME", str(world["home"]))
    os.utime(world["tmp"] / "a" / "f2.jsonl")  # a new mtime: its batch is planned again
    code, out, err = demo(world["a"])
    assert code == 4, out + err
    [line] = [line for line in err.splitlines() if line.startswith("FAILED")]
    # The edited file's batch, and with it every batch whose bottom-k sketches near_deduped dropped
    # once read (orchestration/changed.py, dropped_stores_needed): its per-file chain runs again.
    found = re.fullmatch(r"FAILED raw_documents\[(web-b\d(?:\.\.web-b\d)?)\]: RuntimeError: disk on fire \(log: (\S+)\)", line)
    assert found, line
    log = Path(found.group(2))
    assert log.parent.name == FAILURES_DIR and "Stack Trace" in log.read_text() and "disk on fire" in log.read_text()
    assert "Traceback" not in out + err and "Stack Trace" not in out + err
    assert "(--verbose prints them)" in err


@pytest.mark.slow
def test_a_demo_killed_inside_training_run_frees_its_pool_slot(world, a_edited):
    tmp = world["tmp"]
    tiny_graph_config(tmp, tmp / "a", tmp / "outA", "a.yaml", warmup_steps=2)  # training and manifests rerun
    env = {**os.environ, "DAGSTER_HOME": str(world["home"]), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    command = [sys.executable, "-m", "orchestration.cli", "demo", "--config", str(world["a"]), "--changed"]
    killed = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    holder = None
    with instance_of(world, "a") as instance:
        deadline = time.monotonic() + KILL_WAIT_S
        while holder is None and killed.poll() is None and time.monotonic() < deadline:
            slots = instance.event_log_storage.get_concurrency_info(POOL).claimed_slots
            holder = slots[0].run_id if slots else None
            time.sleep(0.2)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        assert holder is not None, "the demo never reached training_run"
        assert instance.get_run_by_id(holder).status == dg.DagsterRunStatus.STARTED  # what a SIGKILL leaves

    start = time.monotonic()
    again = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=HANG_S)
    took = time.monotonic() - start
    assert again.returncode == 0, again.stdout + again.stderr
    assert took < RERUN_LIMIT_S, f"the demo after the kill took {took:.0f}s:\n{again.stdout}"
    assert f"Marked run {holder} failed and freed its pool slots" in again.stdout
    with instance_of(world, "a") as instance:
        assert instance.get_run_by_id(holder).status == dg.DagsterRunStatus.FAILURE
        assert not instance.event_log_storage.get_concurrency_info(POOL).claimed_slots
