"""The Dagster UI, looked at as a person would: dagster-webserver on 127.0.0.1 and headless Chromium.

It uses the demo instance (its folder in .dagster_home after `make demo`) when that holds a `funnel_report`
materialization and contamination check evaluations with their phase; otherwise it materializes
everything up to `funnel_report` and `contamination_scan` into a temporary instance first.
Screenshots land in $REFINERY_ARTIFACTS (default: the test's tmp dir); docs/img/ holds committed
copies (REFINERY_UPDATE_DOC_IMAGES=1 refreshes them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import json
import urllib.request
from pathlib import Path

import pytest

from helpers.configs import read_demo, write_beside_sample
from helpers.ports import free_port

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
REPORT_ASSET = "funnel_report"
SCAN_ASSET, SCAN_CHECK = "contamination_scan", "contamination_below_limit"


def has_what_the_tests_show(home: Path) -> bool:
    """The funnel, funnel_report, and a contamination check evaluation that records its phase (an
    instance made before checks were partitioned has none)."""
    import dagster as dg

    if not (home / "dagster.yaml").exists() and not (home / "history").exists():
        return False
    with dg.DagsterInstance.from_config(str(home)) as instance:
        if any(instance.get_latest_materialization_event(dg.AssetKey(a)) is None for a in (METADATA_ASSET, REPORT_ASSET)):
            return False
        records = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey(SCAN_ASSET), SCAN_CHECK), limit=1)
        return bool(records) and records[0].event is not None and \
            records[0].event.dagster_event.event_specific_data.partition is not None


def demo_instance_dir() -> Path:
    """The instance folder `make demo` records into (orchestration/instance.py)."""
    from orchestration.instance import instance_dir
    from refinery.config import load_config

    return instance_dir(load_config(REPO / "configs" / "demo.yaml"), str(REPO / ".dagster_home"))


def populate_instance(tmp_path: Path) -> tuple[Path, str]:
    """A fresh instance and local data root holding every partition of the assets up to
    funnel_report and contamination_scan (everything but the trainer and the lineage index)."""
    import dagster as dg

    from orchestration.definitions import build_definitions
    from orchestration.demo import materialize_graph

    data = read_demo()
    data["data_root"] = "../out"
    config = write_beside_sample(tmp_path, "ui", data)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        defs = build_definitions(str(config))
        wanted = dg.AssetSelection.assets(REPORT_ASSET, SCAN_ASSET).upstream()
        materialize_graph(defs, instance, selection=list(wanted.resolve(defs.resolve_asset_graph())), log=lambda _: None)
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


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    """One server (and at most one instance to populate) for every test of this module."""
    tmp_path = tmp_path_factory.mktemp("ui")
    demo_home = demo_instance_dir()
    if has_what_the_tests_show(demo_home):
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


def dismiss_welcome_dialog(page, wait_ms: int = 0) -> None:
    """A fresh browser profile gets Dagster's newsletter dialog over the page, some time after the
    page loads; a person clicks Skip. `wait_ms`: how long to wait for it to appear."""
    from playwright.sync_api import TimeoutError as NoDialog

    skip = page.get_by_text("Skip", exact=True)
    if wait_ms:
        try:
            skip.first.wait_for(timeout=wait_ms)
        except NoDialog:
            return
    if skip.count():
        skip.first.click()


def partition_metadata(home: Path, asset: str, partition: str | None) -> dict:
    """The latest materialization's metadata values (of one partition, or of an unpartitioned asset)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
            limit=1).records
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
    update_doc_images(shots, ["asset-graph.png", "funnel-metadata.png"])


def update_doc_images(shots: Path, names: list[str]) -> None:
    if os.environ.get("REFINERY_UPDATE_DOC_IMAGES") == "1":
        for png in names:
            shutil.copyfile(shots / png, REPO / "docs" / "img" / png)


def graphql(url: str, query: str, **variables) -> dict:
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.load(response)
    assert "errors" not in body, body
    return body["data"]


CHECK_EXECUTIONS = """
query($asset: [String!]!, $check: String!, $partition: String) {
  assetCheckExecutions(assetKey: {path: $asset}, checkName: $check, partition: $partition, limit: 1) {
    partition
    evaluation { partition description success metadataEntries { label ... on TextMetadataEntry { text } } }
  }
}"""


def latest_check_evaluation(url: str, partition: str | None = None) -> dict:
    [execution] = graphql(url, CHECK_EXECUTIONS, asset=[SCAN_ASSET], check=SCAN_CHECK, partition=partition)[
        "assetCheckExecutions"]
    return execution


def open_markdown(page, key: str):
    """Click a metadata row's [Show Markdown] and return the dialog it opens."""
    row = page.locator("tr", has=page.get_by_text(key, exact=True))
    row.get_by_text("[Show Markdown]").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text(key, exact=True).wait_for(timeout=30_000)
    return dialog


@pytest.mark.slow
def test_funnel_report_page_and_a_phase_check_in_chromium(webserver, browser_page, tmp_path):
    url, home = webserver
    page = browser_page
    shots = artifacts_dir(tmp_path)

    # GraphQL, as any client sees it: each evaluation carries its phase, as partition and in words
    for phase in ("warmup", "anneal"):
        execution = latest_check_evaluation(url, phase)
        evaluation = execution["evaluation"]
        assert execution["partition"] == evaluation["partition"] == phase
        assert evaluation["description"].startswith(f"phase {phase}: ")
        assert {"label": "phase", "text": phase} in evaluation["metadataEntries"]

    report = partition_metadata(home, REPORT_ASSET, None)["report"]
    page.set_viewport_size({"width": 1600, "height": 1400})  # the chart and the table in one dialog
    page.goto(f"{url}/assets/{REPORT_ASSET}", wait_until="domcontentloaded")
    page.get_by_text("records_in", exact=True).first.wait_for(timeout=120_000)
    dismiss_welcome_dialog(page, wait_ms=10_000)
    dialog = open_markdown(page, "funnel")
    chart = dialog.locator("img").first
    chart.wait_for(timeout=30_000)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=chart.element_handle(), timeout=30_000)
    shown = dialog.inner_text()
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "funnel-report.png"))
    first, last = report["stages"][0], report["stages"][-1]
    assert chart.get_attribute("alt") == f"corpus funnel: {first['docs_in']:,} records to {last['docs_out']:,} documents"
    for stage in report["stages"]:
        assert re.search(rf"^{stage['stage']}\s+{stage['partitions']}\s+{stage['docs_in']:,}\s+{stage['docs_out']:,}\s",
                         shown, re.M), f"{stage['stage']}'s row is not in the table shown"
    assert "Top removal reasons" in shown and "Budget: B0 = N * b_t / prod(r_j)" in shown
    for bucket in report["buckets"]:
        assert re.search(rf"^{bucket}\s+\d", shown, re.M), f"bucket {bucket} has no retention row"

    latest = latest_check_evaluation(url)
    phase = latest["partition"]
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(f"{url}/assets/{SCAN_ASSET}?view=checks", wait_until="domcontentloaded")
    page.get_by_text(latest["evaluation"]["description"], exact=True).wait_for(timeout=120_000)
    dismiss_welcome_dialog(page)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "contamination-check.png"))
    body = page.inner_text("body")
    assert re.search(rf"Partition\s+{phase}\s", body), "the latest evaluation shows its partition"
    assert re.search(rf"phase\s+{phase}\s", body), "and its metadata names the phase"
    for png in ("funnel-report.png", "contamination-check.png"):
        assert (shots / png).stat().st_size > 10_000
    update_doc_images(shots, ["funnel-report.png", "contamination-check.png"])
