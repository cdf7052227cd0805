"""A real Ray cluster on 127.0.0.1 for the tests: a head and worker nodes, each its own `ray start
--block` process group (its raylet, its workers), one CPU each, as a user starts one per host.

One cluster serves the whole test session (the `ray_cluster` fixture in conftest.py); a test that
kills a worker node (`kill_worker`) starts a fresh one in its place (`replace_worker`), and the
fixture waits (`ready`) until the next test finds the same shape. The nodes' workers import this checkout (PYTHONPATH), not whatever
copy of the package is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A node joins in 5-30 s here; a machine loaded by other tests (twice this, at a load of 8) needs more.
START_TIMEOUT_S = 240
LAST_ANSWER: dict[str, str] = {}  # address -> why the last `cluster_nodes` got no answer


@dataclass
class RayNode:
    process: subprocess.Popen
    node_manager_port: int
    log: Path

    def node_id(self, address: str) -> str | None:
        """This node's Ray id while it is alive in the cluster at `address` (None until it joined)."""
        for node in cluster_nodes(address):
            if node["NodeManagerPort"] == self.node_manager_port and node["Alive"]:
                return node["NodeID"]
        return None


@dataclass
class RayCluster:
    address: str
    workdir: Path
    head: RayNode
    workers: list[RayNode] = field(default_factory=list)
    log_monitor: bool = True

    def node_ids(self) -> list[str]:
        return [n.node_id(self.address) for n in [self.head, *self.workers]]

    def kill_worker(self, index: int) -> str:
        """SIGKILL every process of worker node `index` (its raylet and the workers running its
        tasks, all in its process group); returns the node's id."""
        node = self.workers[index]
        node_id = node.node_id(self.address)
        os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=30)
        return node_id

    def replace_worker(self, index: int) -> None:
        """Start a new worker node in place of worker `index` (`ready` waits for it to join)."""
        self.workers[index] = start_node(self.workdir, f"worker{index}-{time.monotonic_ns()}", ["--address", self.address],
                                         self.log_monitor)

    def ready(self) -> "RayCluster":
        """Wait until every node has joined (a killed node may count as alive a while, so each
        node is looked up by its own port), starting again a worker node whose `ray start` ended."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while None in self.node_ids():
            for index, node in enumerate(self.workers):
                # `ray start` gives a raylet a fixed 30 s to register, then exits: on a loaded
                # machine a worker node can miss that, and one started again joins.
                if node.process.poll() is not None:
                    self.replace_worker(index)
            if time.monotonic() > deadline:
                logs = ", ".join(str(n.log) for n in [self.head, *self.workers])
                raise RuntimeError(f"the Ray cluster at {self.address} did not get all its nodes in {START_TIMEOUT_S} s; "
                                   f"see {logs}; last answer: {LAST_ANSWER.get(self.address, 'none')}")
            time.sleep(1)
        return self

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            if node.process.poll() is None:
                os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait(timeout=30)


def ray_binary() -> str:
    return str(Path(sys.executable).with_name("ray"))


def node_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"), str(REPO),
                                                                      os.environ.get("PYTHONPATH")])),
           "RAY_USAGE_STATS_ENABLED": "0",
           # Ray 2.60 turns token authentication on for a head started while ~/.ray/auth_token exists
           # (any local `ray.init()` on the machine writes one); these clusters run without it.
           "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return env


def start_node(workdir: Path, name: str, extra: list[str], log_monitor: bool = True) -> RayNode:
    """A node of its own process group; without `log_monitor`, no process of the node tails its
    workers' log files for drivers (refinery's drivers read none: `log_to_driver` is off)."""
    log = workdir / f"{name}.log"
    # Every port a node binds, chosen free and distinct: nodes sharing a host would otherwise collide
    # on the defaults (metrics, agents, object manager) and the second raylet would die at start.
    flags = ("node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port")
    ports = distinct_free_ports(len(flags))
    command = [ray_binary(), "start", "--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
               *(f"--{flag}={port}" for flag, port in zip(flags, ports)), "--disable-usage-stats",
               f"--include-log-monitor={str(log_monitor).lower()}", *extra]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=node_env(),
                                   start_new_session=True)
    return RayNode(process, ports[0], log)


def distinct_free_ports(count: int) -> list[int]:
    """`count` free ports, all different: each socket stays bound until every port is chosen."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_nodes(address: str) -> list[dict]:
    """`ray.nodes()` of the cluster, asked from a short-lived process (this one stays no driver);
    [] while the cluster does not answer (its last words in `LAST_ANSWER`)."""
    # The answer is the line marked NODES: Ray prints to stdout what log_to_driver does not stop (a
    # loaded machine's "Job ... already started", "The node ... has been marked dead" and its
    # continuation lines), before or after it.
    code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
            "print('NODES ' + json.dumps(ray.nodes()), flush=True)" % address)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=node_env(), timeout=60)
    except subprocess.TimeoutExpired:
        LAST_ANSWER[address] = "ray.init did not return in 60 s"
        return []
    if out.returncode != 0:
        LAST_ANSWER[address] = out.stderr[-2000:]
        return []
    answers = [line for line in out.stdout.splitlines() if line.startswith("NODES ")]
    if not answers:
        LAST_ANSWER[address] = f"no NODES line in: {out.stdout[-2000:]}"
        return []
    return json.loads(answers[-1].removeprefix("NODES "))


def start_cluster(workdir: Path, workers: int = 2, log_monitor: bool = True) -> RayCluster:
    """A head and `workers` worker nodes on 127.0.0.1, one CPU each, dashboard off, each with its log
    monitor or not (`start_node`)."""
    if shutil.which(ray_binary()) is None:
        raise RuntimeError(f"{ray_binary()} is missing: install the test extra (pip install -e '.[test]')")
    workdir.mkdir(parents=True, exist_ok=True)
    gcs_port, client_port = distinct_free_ports(2)
    address = f"127.0.0.1:{gcs_port}"
    # A short temp dir of its own: Ray's socket paths must stay under 108 bytes, and another
    # session's cluster on this machine keeps its files apart.
    temp_dir = Path(f"/tmp/ray-{gcs_port}")
    head = start_node(workdir, "head", ["--head", "--port", str(gcs_port), "--include-dashboard", "false",
                                        "--ray-client-server-port", str(client_port), "--temp-dir", str(temp_dir)],
                      log_monitor)
    cluster = RayCluster(address, workdir, head, log_monitor=log_monitor)
    try:
        cluster.ready()
        for i in range(workers):  # one at a time: raylets starting together have collided on a port
            cluster.workers.append(start_node(workdir, f"worker{i}", ["--address", address], log_monitor))
            cluster.ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster
