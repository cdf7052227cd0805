"""docs/scale-out.md's one-host walk-through, run as written: its bash block, taken from the doc, with
only its two settings (the config, the port) given values of the test's. A head and a worker node
on 127.0.0.1, the graph locally and on them, `refinery compare` saying every output is the same,
and the nodes stopped by their process ids, leaving no process of theirs behind.

The config is a small one (one bucket, one phase of a few steps), so the two whole-graph runs stay
short; the nodes are the walk-through's own, not the session's `ray_cluster`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.configs import write_config
from helpers.ray_cluster import node_env
from synthetic.crawl import generate_corpus

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "scale-out.md"
HEADING = "### One host first: two Ray nodes on 127.0.0.1, checked against a local run"
PORTS_USED = 16  # the doc's port and the 15 above it
WALKTHROUGH_TIMEOUT_S = 1200

pytest.importorskip("ray", reason="install the test extra: pip install -e '.[test]' (ray)")


def walkthrough() -> str:
    """The bash block under the doc's heading."""
    text = DOC.read_text()
    return re.search(r"```bash\n(.*?)```", text[text.index(HEADING):], re.S).group(1)


def free_port_run(count: int) -> int:
    """A port with the `count - 1` above it free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sockets.append(socket.socket())
                sockets[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no run of {count} free ports")


def small_config(folder: Path) -> Path:
    (folder / "web").mkdir(parents=True)
    docs = list(generate_corpus(40, seed=5, dup_fraction=0.1, near_dup_fraction=0.1))
    for part in range(4):
        (folder / "web" / f"part-{part}.jsonl").write_text(
            "".join(json.dumps({"text": text, "url": url}) + "\n" for url, text in docs[part::4]))
    return write_config(folder, {
        "seed": 3, "data_root": "out", "buckets": ["web"],
        "sources": [{"name": "web", "path": "web/*.jsonl", "format": "jsonl", "bucket": "web"}],
        "partitions": {"by": "hash", "count": 2},
        "stages": {"quality": {"enabled": False}},
        "shards": {"max_seq_len": 64, "overlap": 0},
        "training": {"micro_batch_size": 2},
        "curriculum": {"total_tokens": 512, "buckets": {"web": {"max_epochs": 4}},
                       "phases": [{"name": "main", "share": 1.0, "weights": {"web": 1.0}, "seq_len": 64}]},
    }, "small.yaml")


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out


def session_processes(sid: int) -> list[int]:
    """Every process still in session `sid` (the walk-through's shell, the nodes and what they started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    out.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return out


# What Ray says when a node's raylet does not register in time: a host too busy (other jobs' load) to
# start a node, not a fault of the walk-through; the test then runs it once more on fresh ports.
NODE_START_TIMEOUT = "The current node timed out during startup"


def run_walkthrough(script: str, config: Path, work: Path) -> tuple[int, str, str]:
    """The walk-through in `work` at a free port: its exit status, output and the nodes' logs; its
    nodes' processes are checked gone after its own `kill`, and killed by the test otherwise."""
    port = free_port_run(PORTS_USED)
    script, settings = re.subn(r"^CONFIG=\S+", f"CONFIG={config}", script, flags=re.M)
    script, ports = re.subn(r"^port=\d+", f"port={port}", script, flags=re.M)
    assert (settings, ports) == (1, 1), "the doc's two settings are where the test expects them"
    work.mkdir()
    env = {**node_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DAGSTER_HOME": str(work / "dagster_home"), "REFINERY_PROGRESS": "0"}
    # Its own session, so that whatever the nodes leave behind can be found (and, failing, cleaned up).
    shell = subprocess.Popen(["bash", "-e", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = shell.communicate(timeout=WALKTHROUGH_TIMEOUT_S)
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in work.glob("ray-*.log"))
        if shell.returncode == 0:
            node_pids = [int((work / f"ray-{name}.pid").read_text()) for name in ("head", "worker")]
            deadline = time.monotonic() + 60
            while (left := session_processes(shell.pid)) and time.monotonic() < deadline:
                time.sleep(1)
            assert not alive(node_pids) and not left, f"processes of the nodes left after the kill: {left}"
        return shell.returncode, out, logs
    finally:
        for pid in session_processes(shell.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if shell.poll() is None:
            shell.kill()
            shell.wait()


@pytest.mark.slow
def test_the_single_host_walkthrough_runs_as_written(tmp_path):
    script = walkthrough()
    assert "ray stop" not in script, "the walk-through stops its own nodes only"
    config = small_config(tmp_path / "data")
    code, out, logs = run_walkthrough(script, config, tmp_path / "work")
    if code != 0 and NODE_START_TIMEOUT in logs:
        code, out, logs = run_walkthrough(script, config, tmp_path / "work-again")
    assert code == 0, out[-6000:] + logs

    assert "SAME: every compared output is identical" in out, out[-6000:]
    compared = out[out.index("comparing "):]
    identical = int(re.search(r"^identical: ([\d,]+) file\(s\)", compared, re.M).group(1).replace(",", ""))
    assert identical > 50 and "differ: 0 file(s)" in compared
    for folder in ("documents/pii_redacted/", "shards/final/web/", "manifests/", "runs/demo/main/checkpoints/"):
        assert f"  {folder}: " in compared, f"{folder} compared"


def test_the_walkthrough_derives_two_configs_from_one_init_wrote(tmp_path):
    """Step 1 of the walk-through, as written, on a config `refinery init` wrote (its data root line
    ends in a comment): two configs that load, with data roots of their own, the second on Ray."""
    from orchestration.cli import main as refinery
    from refinery.config import load_config

    script = walkthrough()
    step = script[script.index("# 1."):script.index("# 2.")]
    data = tmp_path / "data"
    (data / "web").mkdir(parents=True)
    docs = list(generate_corpus(12, seed=5, dup_fraction=0.0, near_dup_fraction=0.0))
    (data / "web" / "part-0.jsonl").write_text("".join(json.dumps({"text": t, "url": u}) + "\n" for u, t in docs))
    config = tmp_path / "refinery.yaml"
    assert refinery(["init", str(data), "--config", str(config)]) == 0
    assert re.search(r"^data_root: \S+ +#", config.read_text(), re.M), "init's data root line ends in a comment"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-e", "-c", f"CONFIG={config}\nport=6390\n{step}"], cwd=tmp_path, env=env, check=True)
    local, ray = load_config(tmp_path / "refinery-local.yaml"), load_config(tmp_path / "refinery-ray.yaml")
    original = load_config(config)
    roots = {original.resolve(original.data_root), local.resolve(local.data_root), ray.resolve(ray.data_root)}
    assert len(roots) == 3, "each config has a data root of its own"
    assert (local.execution.engine, ray.execution.engine, ray.execution.address) == ("local", "ray", "127.0.0.1:6390")
    assert local.model_dump(exclude={"data_root", "base_dir"}) == original.model_dump(exclude={"data_root", "base_dir"})
