"""The contamination gate on the bundled sample, through Dagster: the clean sample scans clean, eval
text planted into anneal documents is found (every planted leak, nothing else), the blocking check
fails and training_run[anneal] is refused; under the drop policy the scan passes and every phase
trains."""

import json
import random
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from assets.provenance import ALWAYS_KEYS, PROVENANCE_KEYS
from orchestration.definitions import build_definitions
from orchestration.demo import QUIET_RUN_CONFIG, materialize_graph
from refinery.config import load_config
from refinery.contamination_tasks import phase_doc_ids
from refinery.layout import exclusions_key, scan_report_key
from refinery.documents import CLEAN_STAGE
from refinery.layout import documents_key
from refinery.curriculum import read_manifest
from refinery.storage import LocalDataRoot
from training.phase_runs import phase_run_dir
from training.status import read_status

from helpers.configs import demo_config, with_quarter_curriculum, write_config
from helpers.materialize import in_memory_instance, materialize_in_workspace

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PHASES = ["warmup", "main", "reasoning", "anneal"]
# Held-out items of our own: none of this text is in the sample.
LEAKED_ITEMS = [
    {"id": "leak-1", "text": "A lighthouse keeper winds the lamp clock every four hours and logs each passing ship, "
                             "so how many entries does she write if eleven ships pass between two windings?"},
    {"id": "leak-2", "text": "The orchard sends nine crates of pears to the market on Friday and keeps back a "
                             "third of the harvest for cider pressing in the stone barn near the river."},
    {"id": "leak-3", "text": "Which of the four glaciers named in the survey retreated fastest after the warm "
                             "summers, given the measured loss of ice along each valley floor?"},
    {"id": "leak-4", "text": "Tomas paints the fence along the lane in three coats of green and finishes the last "
                             "coat two days before the village fair opens its gates to visitors."},
]
NGRAM = 13


def plant(text: str, item: dict, how: str) -> str:
    words = item["text"].split()
    if how == "appended":
        return f"{text}\n\n{item['text']}"
    if how == "shouted_mid_text":  # case and punctuation must not hide a leak
        cut = len(text) // 2
        return text[:cut] + " " + item["text"].upper().replace(",", ";").replace("?", "!") + " " + text[cut:]
    if how == "exact_span":  # the shortest leak the scan is configured to catch: one 13-word window
        return " ".join(words[5:5 + NGRAM]) + ". " + text
    if how == "split_over_lines":
        return text + "\n" + " ".join(words[:9]) + "\n" + " ".join(words[9:])
    if how == "one_word_short":  # 12 consecutive words: below the n-gram, not a leak by this measure
        return text + " " + " ".join(words[5:5 + NGRAM - 1]) + "."
    raise ValueError(how)


def write_contaminated_config(tmp: Path, eval_sets: list[dict], policy: str) -> Path:
    demo = with_quarter_curriculum(demo_config(tmp / "out"))
    demo["contamination"].update(eval_sets=eval_sets, policy=policy, ngram=NGRAM, max_contaminated_docs=0)
    return write_config(tmp, demo)


def check_passed(result: dg.ExecuteInProcessResult, phase: str) -> bool:
    """The scan's check verdict, after asserting the evaluation records and names its phase."""
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.partition == phase and evaluation.metadata["phase"].value == phase
    assert evaluation.description.startswith(f"phase {phase}: ")
    return evaluation.passed


def launch_logs(cfg, phase: str) -> list[str]:
    return sorted(p.name for p in phase_run_dir(cfg, phase).glob("launch-*.log"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The sample through phase_manifests, the lineage index, the funnel report and a first
    contamination scan of every phase against the demo eval set, in one instance the tests below
    keep using."""
    tmp = tmp_path_factory.mktemp("contamination_graph")
    demo_eval = {"name": "demo_eval", "path": str(REPO / "data" / "evals" / "demo_eval.jsonl")}
    config = write_contaminated_config(tmp, [demo_eval], policy="none")
    defs = build_definitions(str(config))
    wanted = dg.AssetSelection.assets("contamination_scan", "lineage_index", "funnel_report").upstream()
    selection = list(wanted.resolve(defs.resolve_asset_graph()))
    with in_memory_instance(tmp / "dagster_home") as instance:
        materialize_graph(defs, instance, selection, log=lambda _: None, run_config=QUIET_RUN_CONFIG)
        cfg = load_config(config)
        yield {"tmp": tmp, "config": config, "demo_eval": demo_eval, "instance": instance, "cfg": cfg,
               "root": LocalDataRoot(cfg.resolve(cfg.data_root))}


def test_clean_sample_has_no_contamination_in_any_phase(sample):
    root = sample["root"]
    for phase in PHASES:
        report = root.read_json(scan_report_key(phase))
        assert report["docs_scanned"] > 0, phase
        assert (report["contaminated_docs"], report["hits"], report["passed"]) == (0, [], True), phase


def test_lineage_run_resolves_trained_tokens_to_documents_containing_the_decoded_window(sample, capsys):
    """`refinery lineage --run`: a token the trainer fed, named by (step, row, position), leads to a
    document whose clean text contains the decoded tokens around it."""
    from tokenizers import Tokenizer

    from orchestration.cli import main as refinery
    from training.data import CurriculumData
    from training.trainer import RunOptions, Trainer

    cfg, root, tmp = sample["cfg"], sample["root"], sample["tmp"]
    run_dir = tmp / "lineage-run"
    assert Trainer(cfg, RunOptions(run_dir=str(run_dir), stop_after_phase="warmup")).train()["state"] == "completed"
    tokenizer = Tokenizer.from_file(str(root.local_path("tokenizer/tokenizer.json")))
    data = CurriculumData.open(cfg, root, cfg.training.micro_batch_size * cfg.training.grad_accum_steps)
    rng = random.Random(5)
    steps = sorted(rng.sample(range(1, data.schedule.phase_starts[1] + 1), 6))
    sampler = data.sampler(False)
    checked = 0
    for step in range(1, max(steps) + 1):
        plan = sampler.plan_next()
        if step not in steps:
            continue
        batch = data.gather(plan, slice(0, data.schedule.global_batch))
        for _ in range(3):
            row, pos = rng.randrange(batch["tokens"].shape[0]), rng.randrange(4, plan.seq_len - 4)
            same_doc = batch["doc_ids"][row] == batch["doc_ids"][row, pos]
            window = [int(t) for t, keep in zip(batch["tokens"][row, pos - 4:pos + 5], same_doc[pos - 4:pos + 5]) if keep]
            assert refinery(["lineage", "--config", str(sample["config"]), "--run", str(run_dir), "--step", str(step),
                             "--row", str(row), "--pos", str(pos), "--json"]) == 0
            resolved = json.loads(capsys.readouterr().out)
            assert resolved["token_id"] == int(batch["tokens"][row, pos]), "the replayed token is the one trained on"
            # The decoded window comes with it, in the tokenizer the run trained with.
            assert resolved["text"]["token"] == tokenizer.decode([resolved["token_id"]], skip_special_tokens=False)
            partition = resolved["doc_id"].rsplit("/", 1)[0]
            docs = root.read_parquet(documents_key(CLEAN_STAGE, partition), columns=["doc_id", "text"])
            text = dict(zip(docs["doc_id"], docs["text"]))[resolved["doc_id"]]
            decoded = tokenizer.decode(window).strip()
            assert decoded and decoded in text, (decoded, resolved["doc_id"])
            checked += 1
    assert checked == 18
    assert refinery(["lineage", "--config", str(sample["config"]), "--run", str(run_dir), "--step", "9999",
                     "--row", "0", "--pos", "0"]) == 2
    assert "has no step 9999 in metrics.jsonl" in capsys.readouterr().err


def plant_into_anneal(root: LocalDataRoot) -> tuple[set[str], str]:
    """Plant LEAKED_ITEMS (four ways) and a 12-word near miss into anneal documents of different
    buckets, in the clean documents table the scan reads. Returns (planted doc ids, near-miss doc id)."""
    anneal = phase_doc_ids(root, read_manifest(root, "anneal"))
    buckets = sorted(b for b in anneal if anneal[b])
    assert len(buckets) >= 5, "the sample's anneal phase draws from every bucket"
    chosen = [sorted(anneal[b])[0] for b in buckets[:5]]
    ways = ["appended", "shouted_mid_text", "exact_span", "split_over_lines", "one_word_short"]
    plan = {doc: (LEAKED_ITEMS[i % len(LEAKED_ITEMS)], how) for i, (doc, how) in enumerate(zip(chosen, ways))}
    for partition in sorted({doc.rsplit("/", 1)[0] for doc in plan}):
        key = documents_key(CLEAN_STAGE, partition)
        table = root.read_parquet(key)
        texts = [plant(text, *plan[doc]) if doc in plan else text
                 for doc, text in zip(table["doc_id"].to_list(), table["text"].to_list())]
        root.write_parquet(key, table.with_columns(pl.Series("text", texts)))
    near_miss = chosen[ways.index("one_word_short")]
    return set(chosen) - {near_miss}, near_miss


def test_planted_leaks_block_anneal_until_the_drop_policy_removes_them(sample, capsys):
    tmp, instance, cfg, root = sample["tmp"], sample["instance"], sample["cfg"], sample["root"]
    planted, near_miss = plant_into_anneal(root)
    leaked_path = tmp / "leaked_eval.jsonl"
    leaked_path.write_text("".join(json.dumps(item) + "\n" for item in LEAKED_ITEMS))
    eval_sets = [sample["demo_eval"], {"name": "leaked", "path": str(leaked_path)}]
    config = write_contaminated_config(tmp, eval_sets, policy="none")

    # The stored scan no longer covers today's eval sets: training is refused before any launch.
    stale = materialize_in_workspace(config, instance, "training_run", "anneal", QUIET_RUN_CONFIG)
    assert not stale.success and "older than a change to eval_set/leaked" in str(stale.all_events)

    scan = materialize_in_workspace(config, instance, "contamination_scan", "anneal", QUIET_RUN_CONFIG)
    assert not check_passed(scan, "anneal"), "the blocking check fails on a contaminated anneal manifest"
    hits = root.read_parquet("contamination/anneal/hits.parquet")
    assert set(hits["doc_id"]) == planted, "every planted leak found, the 12-word near miss and clean docs not"
    assert near_miss not in set(hits["doc_id"])
    assert set(hits["eval_set"]) == {"leaked"}

    refused = materialize_in_workspace(config, instance, "training_run", "anneal", QUIET_RUN_CONFIG)
    assert not refused.success
    [failure] = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.step_failure_data.error.message
    assert "training_run[anneal] refused" in message and f"found {len(planted)} contaminated documents" in message
    assert launch_logs(cfg, "anneal") == [], "anneal training did not run"

    config = write_contaminated_config(tmp, eval_sets, policy="drop")
    for phase in PHASES:  # every phase's scan must be current with the new eval set before it trains
        result = materialize_in_workspace(config, instance, "contamination_scan", phase, QUIET_RUN_CONFIG)
        assert check_passed(result, phase), phase
        report = root.read_json(scan_report_key(phase))
        assert report["contaminated_docs"] == 0 and set(report["dropped"]) <= planted, phase
        remaining = set().union(*phase_doc_ids(root, read_manifest(root, phase)).values())
        assert not remaining & planted, f"{phase}: contaminated documents left the manifest"
    assert set(root.read_json(exclusions_key("anneal"))) == planted
    # `refinery scan` after the drop names what it removed, not only PASS.
    from orchestration.cli import main as refinery

    capsys.readouterr()
    assert refinery(["scan", "--config", str(config), "--phase", "anneal", "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)["dropped_by_policy"]
    assert [d["doc_id"] for d in dropped] == sorted(planted) and all(d["latest"] for d in dropped)
    assert {d["eval_item"].split("/")[0] for d in dropped} == {"leaked"}
    assert refinery(["scan", "--config", str(config), "--phase", "anneal"]) == 0
    text = capsys.readouterr().out
    assert f"drop policy: {len(planted)} document(s) removed from phase anneal, {len(planted)} by the latest" in text
    assert all(f"  * {doc}  " in text for doc in planted)
    assert near_miss in set().union(*phase_doc_ids(root, read_manifest(root, "anneal")).values())

    for phase in PHASES:
        assert materialize_in_workspace(config, instance, "training_run", phase, QUIET_RUN_CONFIG).success, phase
    status = read_status(phase_run_dir(cfg, "anneal"))
    assert status["state"] == "completed" and status["step"] == status["total_steps"]
    assert launch_logs(cfg, "anneal") == ["launch-1.log"]


def test_every_assets_materialization_carries_the_same_provenance_keys(sample):
    """All 21 assets of the graph (the demo config trains the difficulty model) record the provenance
    keys (assets/provenance.py) that apply to them, in one order and never as a row of "n/a", with
    their code version, config and content hashes;
    training_run's name its boundary checkpoint. Reads the
    materializations the tests above made (the graph, then every phase trained); run alone, it
    trains warmup first."""
    instance, config = sample["instance"], sample["config"]
    defs = build_definitions(str(config))
    graph = defs.resolve_asset_graph()
    keys = sorted(graph.materializable_asset_keys, key=lambda k: k.to_user_string())
    assert len(keys) == 21
    if instance.get_latest_materialization_event(dg.AssetKey("training_run")) is None:
        assert materialize_in_workspace(config, instance, "training_run", "warmup", QUIET_RUN_CONFIG).success
    for key in keys:
        event = instance.get_latest_materialization_event(key)
        assert event is not None, f"{key.to_user_string()} was never materialized"
        md = event.asset_materialization.metadata
        name = key.to_user_string()
        assert set(ALWAYS_KEYS) <= set(md), f"{name} lacks {set(ALWAYS_KEYS) - set(md)}"
        shared = [k for k in md if k in PROVENANCE_KEYS]
        assert shared == [k for k in PROVENANCE_KEYS if k in md], f"{name}: the shared keys in their one order"
        assert not [k for k, v in md.items() if v == dg.MetadataValue.text("n/a")], f"{name} has an n/a row"
        assert md["code_version"].value == graph.get(key).code_version, name
        assert isinstance(md["content_hashes"].value, dict), name
    training = instance.get_latest_materialization_event(dg.AssetKey("training_run")).asset_materialization.metadata
    assert list(training["content_hashes"].value) == [training["boundary_checkpoint"].value]


def test_a_phase_with_no_eval_set_is_not_scanned_and_the_summary_counts_earlier_drops(sample, capsys):
    """An earlier scan under the drop policy removes a warmup document (after the test above, the
    planted leaks are dropped from warmup already); then, with no eval set, the check warns "not
    scanned" (never "passed"), and the check, `refinery scan` and the demo summary say the same, the
    summary counting every earlier drop."""
    from orchestration.cli import main as refinery
    from orchestration.demo import demo_summary
    from refinery.contamination import verdict

    tmp, instance, root = sample["tmp"], sample["instance"], sample["root"]
    key = exclusions_key("warmup")
    before = set(root.read_json(key)) if root.exists(key) else set()
    warmup = sorted(set().union(*phase_doc_ids(root, read_manifest(root, "warmup")).values()))
    leaked_doc = warmup[0]
    table = root.read_parquet(documents_key(CLEAN_STAGE, leaked_doc.rsplit("/", 1)[0]), columns=["doc_id", "text"])
    leaked_text = " ".join(dict(zip(table["doc_id"], table["text"]))[leaked_doc].split()[:40])
    eval_path = tmp / "warmup_leak.jsonl"
    eval_path.write_text(json.dumps({"id": "w-1", "text": leaked_text}) + "\n")
    config = write_contaminated_config(tmp, [{"name": "warmup_leak", "path": str(eval_path)}], policy="drop")
    assert check_passed(materialize_in_workspace(config, instance, "contamination_scan", "warmup", QUIET_RUN_CONFIG),
                        "warmup")
    earlier = set(root.read_json(scan_report_key("warmup"))["dropped"]) | before
    assert leaked_doc in earlier and set(root.read_json(key)) == earlier

    config = write_contaminated_config(tmp, [], policy="drop")
    result = materialize_in_workspace(config, instance, "contamination_scan", "warmup", QUIET_RUN_CONFIG)
    assert result.success, "a warning does not fail the run"
    [evaluation] = result.get_asset_check_evaluations()
    report = root.read_json(scan_report_key("warmup"))
    unchecked = len(warmup) - len(earlier - before)
    said = verdict(report)
    assert said == ("not scanned: no eval sets configured (list JSONL files of {id, text} under contamination.eval_sets); "
                    f"none of the phase's {unchecked:,} documents was checked for contamination (a warning: training "
                    "is not held back for it)")
    assert (report["status"], report["passed"], report["docs_scanned"], report["dropped"]) == ("not scanned", False, 0, [])
    assert (evaluation.passed, evaluation.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert evaluation.description == f"phase warmup: {said}; policy drop"
    assert evaluation.metadata["status"].value == "not scanned"
    assert evaluation.metadata["dropped_so_far"].value == len(earlier)

    capsys.readouterr()
    assert refinery(["scan", "--config", str(config), "--phase", "warmup"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"phase warmup: {said}"
    assert lines[1] == f"drop policy: {len(earlier)} document(s) removed from phase warmup, 0 by the latest " \
                       "contamination_scan (marked *):"
    assert refinery(["scan", "--config", str(config), "--phase", "warmup", "--json"]) == 1
    scanned = json.loads(capsys.readouterr().out)
    assert (scanned["status"], scanned["docs_unscanned"]) == ("not scanned", unchecked)
    assert [d["doc_id"] for d in scanned["dropped_by_policy"]] == sorted(earlier)

    summary = demo_summary(str(config)).splitlines()
    assert f"warmup     {said}; {len(earlier)} dropped from the phase so far (0 by this scan)" in summary
