"""The Dagster UI, looked at as a person would: dagster-webserver on 127.0.0.1 and headless Chromium.

It uses the demo instance (.dagster_home after `make demo`) when that holds funnel materializations;
otherwise it materializes the funnel into a temporary instance first. Screenshots land in
$REFINERY_ARTIFACTS (default: the test's tmp dir); docs/img/ holds committed copies.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import free_port

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FUNNEL = ["raw_documents", "extracted_text", "language_filtered", "heuristic_filtered"]
METADATA_ASSET = "heuristic_filtered"
METADATA_PARTITION = "web-b0"  # the batch of web files (demo: one per source); the heuristics remove pages from it
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic",
]
SERVER_START_TIMEOUT_S = 180


def has_funnel_materializations(home: Path) -> bool:
    import dagster as dg

    if not (home / "dagster.yaml").exists() and not (home / "history").exists():
        return False
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return instance.get_latest_materialization_event(dg.AssetKey(METADATA_ASSET)) is not None


def populate_instance(tmp_path: Path) -> tuple[Path, str]:
    """A fresh instance and local data root holding every partition of the funnel assets."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph

    data = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    data["data_root"] = "../out"
    (tmp_path / "configs").mkdir()
    (tmp_path / "data").symlink_to(REPO / "data")
    config = tmp_path / "configs" / "ui.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        materialize_graph(build_definitions(str(config)), instance, selection=[dg.AssetKey(k) for k in FUNNEL])
    return home, str(config)


def wait_for_server(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dagster-webserver exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/server_info", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"dagster-webserver not up after {SERVER_START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def webserver(tmp_path):
    demo_home = REPO / ".dagster_home"
    if has_funnel_materializations(demo_home):
        home, config = demo_home, str(REPO / "configs" / "demo.yaml")
    else:
        home, config = populate_instance(tmp_path)
    port = free_port()
    log = tmp_path / "webserver.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "REFINERY_CONFIG": config, "DAGSTER_DISABLE_TELEMETRY": "yes"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster-webserver")), "-w", "workspace.yaml",
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url, process, log)
        yield url, home
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


@pytest.fixture
def browser_page(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="install the test extra (playwright)")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1600, "height": 1000},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


def artifacts_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("REFINERY_ARTIFACTS", tmp_path / "artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def dismiss_welcome_dialog(page) -> None:
    """A fresh browser profile gets Dagster's newsletter dialog over the page; a person clicks Skip."""
    skip = page.get_by_text("Skip", exact=True)
    if skip.count():
        skip.first.click()


def partition_metadata(home: Path, asset: str, partition: str) -> dict:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1).records
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


@pytest.mark.slow
def test_asset_graph_and_funnel_metadata_in_chromium(webserver, browser_page, tmp_path):
    url, home = webserver
    page = browser_page
    shots = artifacts_dir(tmp_path)

    page.goto(f"{url}/locations/refinery/asset-groups/funnel", wait_until="domcontentloaded")
    page.get_by_text(FUNNEL[0], exact=True).first.wait_for(timeout=120_000)
    dismiss_welcome_dialog(page)
    for name in FUNNEL:
        page.get_by_text(name, exact=True).first.wait_for(timeout=30_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=str(shots / "asset-graph.png"))

    metadata = partition_metadata(home, METADATA_ASSET, METADATA_PARTITION)
    top_rule = max(metadata["removed_by_rule"], key=metadata["removed_by_rule"].get)
    page.goto(f"{url}/assets/{METADATA_ASSET}?view=events&partition={METADATA_PARTITION}", wait_until="domcontentloaded")
    page.get_by_text(f"Partition {METADATA_PARTITION} materialized", exact=False).first.wait_for(timeout=60_000)
    dismiss_welcome_dialog(page)
    page.wait_for_timeout(1000)
    body = page.inner_text("body")
    page.screenshot(path=str(shots / "funnel-metadata.png"), full_page=True)
    assert 0 < metadata["retention"] < 1, "the partition chosen shows a real removal"
    for key in ("docs_in", "docs_out", "retention"):
        shown = f"{metadata[key]:.6f}".rstrip("0") if isinstance(metadata[key], float) else str(metadata[key])
        assert re.search(rf"{key}\s+{re.escape(shown)}\s", body), f"{key} = {shown} not shown"
    assert f'"{top_rule}": {metadata["removed_by_rule"][top_rule]}' in body, f"top removal reason {top_rule} not shown"
    for png in ("asset-graph.png", "funnel-metadata.png"):
        assert (shots / png).stat().st_size > 10_000
    if os.environ.get("REFINERY_UPDATE_DOC_IMAGES") == "1":
        for png in ("asset-graph.png", "funnel-metadata.png"):
            shutil.copyfile(shots / png, REPO / "docs" / "img" / png)
