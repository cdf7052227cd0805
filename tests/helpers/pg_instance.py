"""A real multi-process Dagster instance on one machine, for tests and bench/backfill_concurrency.py.

    PostgresServer   Debian's `postgres` on 127.0.0.1 and a free port, its data in a fresh temp dir
    LocalInstance    deploy/local/dagster.yaml in a temp DAGSTER_HOME, a code server
                     (`dagster api grpc`) and a `dagster-daemon run`, both on that Postgres
    BackfillDriver   submits one run per (asset group, partition key) through GraphQL's launchRun,
                     the way the UI does, and waits; the daemon dequeues and launches every run

Every process is started in its own session, so `stop()` ends it with everything it spawned (run
workers and their step processes are children of the code server).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.configs import read_demo, write_beside_sample
from helpers.ports import free_port
from orchestration.demo import QUIET_RUN_CONFIG

REPO = Path(__file__).resolve().parents[2]
INSTANCE_YAML = REPO / "deploy" / "local" / "dagster.yaml"
LOCATION = "refinery"
START_TIMEOUT_S = 120
# The sample's three whole web files: exact copies and near duplicates (Jaccard 0.88 and 0.95)
# cross them, and there are partitions enough for runs to overlap.
INPUT_FILES = "../data/sample/web/web-0[0-9].warc.gz"
# The last asset of the backfill; the selection is it and everything upstream.
THROUGH = "near_dup_clusters"
# Every run: the multiprocess executor, its step processes forked from a server that imported the
# Definitions once per run instead of each importing them again (7-10 s a step on this machine).
RUN_CONFIG = {**QUIET_RUN_CONFIG, "execution": {"config": {"multiprocess": {
    "max_concurrent": 2, "start_method": {"forkserver": {"preload_modules": ["orchestration.definitions"]}}}}}}


class MissingPostgres(RuntimeError):
    pass


def postgres_bin_dir() -> Path:
    """The folder holding `initdb` and `postgres`: from PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    versions = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    candidates += [Path(p).parent for p in sorted(versions, key=lambda p: int(Path(p).parts[-3]), reverse=True)]
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "postgres").exists():
            return folder
    raise MissingPostgres("no initdb/postgres binaries on PATH or in /usr/lib/postgresql/*/bin: "
                          "apt-get install -y postgresql (.ci/run installs it)")


def stop_process_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = 20) -> None:
    """Send `sig` to the process's session, SIGKILL it when the leader outlives `grace_s`, and
    SIGKILL whatever of the group is left (children that outlived their parent)."""
    if proc is None:
        return
    _signal_group(proc.pid, sig)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)
    _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, read from /proc (no psutil here)."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class PostgresServer:
    """A throwaway Postgres cluster. Postgres refuses to run as root, so under root it runs as
    `postgres` (Debian's package creates it) or `nobody`, in a temp dir that user owns."""

    port: int = field(default_factory=free_port)
    db_name: str = "dagster"
    user_name: str = "dagster"
    workdir: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; dagster-postgres ships psycopg2.
        return f"postgresql+psycopg2://{self.user_name}@127.0.0.1:{self.port}/{self.db_name}"

    def _run_as(self) -> dict:
        if os.geteuid() != 0:
            return {}
        import pwd

        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        raise MissingPostgres("running as root and neither a `postgres` nor a `nobody` user exists to run Postgres as")

    def start(self) -> None:
        bins = postgres_bin_dir()
        as_user = self._run_as()
        # Not under pytest's tmp_path: its parents are root-only, and the server's user must reach the dir.
        self.workdir = Path(tempfile.mkdtemp(prefix="refinery-pg-"))
        if as_user:
            os.chown(self.workdir, as_user["user"], as_user["group"])
        data, log = self.workdir / "data", self.workdir / "postgres.log"
        subprocess.run([str(bins / "initdb"), "-D", str(data), "-U", self.user_name, "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, **as_user)
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [str(bins / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.workdir),
                 "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300",
                 # A test cluster: durability buys nothing and costs fsyncs on a shared disk.
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **as_user,
            )
        self._wait_ready(log)

    def _wait_ready(self, log: Path) -> None:
        import psycopg2

        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user_name, dbname="postgres")
            except psycopg2.OperationalError as e:
                last = e
                time.sleep(0.2)
                continue
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{self.db_name}"')
            conn.close()
            return
        tail = log.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"postgres did not accept connections in {START_TIMEOUT_S}s ({last}); log:\n{tail}")

    def stop(self) -> None:
        # SIGINT is Postgres's "fast" shutdown: roll back sessions, checkpoint, exit.
        stop_process_group(self.process, signal.SIGINT)
        self.process = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


@dataclass
class LocalInstance:
    """DAGSTER_HOME with deploy/local/dagster.yaml on `postgres_url`, a code server for the
    Definitions of `config_path`, and the daemon. `instance()` opens it from the test process."""

    home: Path
    postgres_url: str
    config_path: str
    max_concurrent_runs: int
    grpc_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_PG_URL": self.postgres_url,
            "REFINERY_MAX_CONCURRENT_RUNS": str(self.max_concurrent_runs),
            "REFINERY_CONFIG": self.config_path,
        }

    @property
    def workspace(self) -> Path:
        return self.home / "workspace.yaml"

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(INSTANCE_YAML, self.home / "dagster.yaml")
        self.workspace.write_text(
            f"load_from:\n  - grpc_server:\n      host: 127.0.0.1\n      port: {self.grpc_port}\n"
            f"      location_name: {LOCATION}\n"
        )
        bin_dir = Path(sys.executable).parent
        self._spawn("code-server", [str(bin_dir / "dagster"), "api", "grpc", "--module-name", "orchestration.definitions",
                                    "--host", "127.0.0.1", "--port", str(self.grpc_port), "--location-name", LOCATION])
        self._wait_for_code_server()
        self._spawn("daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", str(self.workspace)])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.home / f"{name}.log", "ab") as out:
            self.processes[name] = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=out,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_for_code_server(self) -> None:
        from dagster._grpc.client import DagsterGrpcClient

        client = DagsterGrpcClient(port=self.grpc_port, host="127.0.0.1")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.processes["code-server"].poll() is None:
            try:
                client.ping("ready")
                return
            except Exception:  # the server is still importing the Definitions
                time.sleep(0.5)
        raise RuntimeError(f"the code server did not answer in {START_TIMEOUT_S}s; log:\n{self.log_tail('code-server')}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; log:\n{self.log_tail(name)}")

    def instance(self):
        """The instance as this process sees it. Dagster reads the yaml's variables whenever it
        builds a part (the run coordinator at the first submission), so they stay set until stop()."""
        import dagster as dg

        names = {"DAGSTER_PG_URL": self.postgres_url, "REFINERY_MAX_CONCURRENT_RUNS": str(self.max_concurrent_runs)}
        self._saved_env = {name: os.environ.get(name) for name in names}
        os.environ.update(names)
        return dg.DagsterInstance.from_config(str(self.home))

    def stop(self) -> None:
        # The daemon first, so it launches nothing more; then the code server and the runs below it.
        # Five seconds each: the daemon's shutdown, waiting out its loops, took the whole 20 s grace.
        for name in ("daemon", "code-server"):
            stop_process_group(self.processes.pop(name, None), grace_s=5)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}


LAUNCH_RUN = """
mutation LaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""

REEXECUTE = """
mutation Reexecute($parentRunId: String!) {
  launchRunReexecution(reexecutionParams: {parentRunId: $parentRunId, strategy: FROM_FAILURE}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on Error { message }
  }
}
"""


def run_groups(defs, selection) -> list[tuple[list, object]]:
    """The selected assets as groups that one run per partition key can materialize, in an order
    that puts every group after the groups it reads.

    An asset joins its parents' group when it shares their partitions definition, so a run covers
    a whole chain (raw_documents ... dedup_signatures for one partition) and its steps run in the
    multiprocess executor; a change of partitioning (shards -> hash ranges -> bands) starts a group.
    """
    graph = defs.resolve_asset_graph()
    wanted = set(selection)
    stage: dict = {}
    for key in graph.toposorted_asset_keys:
        if key not in wanted:
            continue
        pdef = graph.get(key).partitions_def
        stage[key] = max(
            (stage[p] + (0 if graph.get(p).partitions_def is pdef else 1)
             for p in graph.get(key).parent_keys if p in stage),
            default=0,
        )
    groups: dict[tuple[int, int], tuple[list, object]] = {}
    for key in graph.toposorted_asset_keys:
        if key in stage:
            pdef = graph.get(key).partitions_def
            groups.setdefault((stage[key], id(pdef)), ([], pdef))[0].append(key)
    return [groups[k] for k in sorted(groups, key=lambda k: k[0])]


@dataclass
class BackfillDriver:
    """Submits runs the way the UI does (GraphQL `launchRun` against the code server) into the
    queue, and waits for the daemon to finish them."""

    local: LocalInstance
    instance: object
    run_config: dict = field(default_factory=dict)
    poll_s: float = 0.5

    def __post_init__(self):
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget

        self._workspace = WorkspaceProcessContext(self.instance, WorkspaceFileTarget(paths=[str(self.local.workspace)]))

    def close(self) -> None:
        self._workspace.__exit__(None, None, None)

    def _graphql(self, query: str, variables: dict, field_name: str) -> str:
        from dagster_graphql.test.utils import execute_dagster_graphql

        result = execute_dagster_graphql(self._workspace.create_request_context(), query, variables)
        if result.errors:
            raise RuntimeError(f"GraphQL {field_name} failed: {result.errors}")
        answer = result.data[field_name]
        if answer["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"GraphQL {field_name} answered {answer}")
        return answer["run"]["runId"]

    def submit(self, keys: list, partition_key: str | None) -> str:
        tags = [{"key": "dagster/partition", "value": partition_key}] if partition_key is not None else []
        params = {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "jobName": "__ASSET_JOB",
                "assetSelection": [{"path": k.path} for k in keys],
            },
            "runConfigData": self.run_config,
            "executionMetadata": {"tags": tags},
        }
        return self._graphql(LAUNCH_RUN, {"executionParams": params}, "launchRun")

    def reexecute_from_failure(self, run_id: str) -> str:
        return self._graphql(REEXECUTE, {"parentRunId": run_id}, "launchRunReexecution")

    def wait(self, run_ids: list[str], timeout_s: float, on_poll=None) -> list:
        """The finished runs, in `run_ids` order; raises when one is still unfinished at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = [self.instance.get_run_by_id(r) for r in run_ids]
            if all(r.is_finished for r in runs):
                return runs
            if on_poll is not None:
                on_poll(runs)
            self.local.check_alive()
            if time.monotonic() > deadline:
                pending = {r.run_id: r.status.value for r in runs if not r.is_finished}
                raise TimeoutError(f"runs unfinished after {timeout_s:.0f}s: {pending}\n"
                                   f"daemon log:\n{self.local.log_tail('daemon')}")
            time.sleep(self.poll_s)

    def backfill(self, defs, selection, timeout_s: float, on_poll=None) -> list:
        """Every partition of every group, one run each, group after group; returns the runs."""
        done = []
        for keys, pdef in run_groups(defs, selection):
            partition_keys = pdef.get_partition_keys(dynamic_partitions_store=self.instance) if pdef else [None]
            if not partition_keys:
                raise RuntimeError(f"no partition keys for {[k.to_user_string() for k in keys]}")
            ids = [self.submit(keys, pk) for pk in partition_keys]
            done += self.wait(ids, timeout_s, on_poll)
        return done


def sample_config(workdir: Path, name: str) -> str:
    """configs/demo.yaml reading three sample files into its own data root, `workdir/out/<name>`."""
    data = read_demo()
    data["data_root"] = f"../out/{name}"
    data["sources"] = [{**data["sources"][0], "path": INPUT_FILES}]
    assert data["sources"][0]["name"] == "web"
    # Every range and band is a run of its own; fewer of them than the demo keeps the test to a few
    # minutes. 4 bands of 8 rows still put the LSH threshold near the configured 0.8.
    data["stages"]["exact_dedup"]["hash_ranges"] = 2
    data["stages"]["near_dedup"].update(bands=4, rows=8)
    # Web alone: no curated bucket to train a classifier or the difficulty model on.
    data["stages"]["quality"] = {"enabled": False}
    data["stages"]["difficulty"] = {"enabled": False}
    return write_beside_sample(workdir, name, data)


def backfill_selection(defs):
    import dagster as dg

    return list(dg.AssetSelection.assets(THROUGH).upstream().resolve(defs.resolve_asset_graph()))


def max_overlap(runs, instance) -> int:
    """The most runs that were in STARTED at one moment, from their run records' start/end times."""
    edges = []
    for run in runs:
        record = instance.get_run_record_by_id(run.run_id)
        edges += [(record.start_time, 1), (record.end_time, -1)]
    # At equal times an end sorts before a start, so back-to-back runs do not count as overlapping.
    level = best = 0
    for _, step in sorted(edges):
        level += step
        best = max(best, level)
    return best


def started_pid(instance, run_id: str, message_prefix: str) -> int | None:
    """The pid in the run's engine event whose message starts with `message_prefix` ("Started
    process for run" is the run worker, 'Executing step' a step process)."""
    import re

    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is not None and event.message and event.message.startswith(message_prefix):
            found = re.search(r"pid: (\d+)", event.message)
            if found:
                return int(found.group(1))
    return None
