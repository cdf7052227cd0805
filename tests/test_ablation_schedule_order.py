"""Difficulty order in the schedule variants (issue 48, item 1): the `funnel` variant's documents
carry the main graph's difficulty scores, `curriculum` keeps each phase's `order` and serves its
entries in difficulty order, `uniform_order` drops the order and only it, and the preflight takes a
curriculum with an order (refused before the funnel variant carried scores) and refuses a bad one."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl
import pytest
import yaml

from helpers.schedule_runs import BUDGET, PHASES, ROWS, schedule_folder, train, with_schedules
from helpers.served import served_pieces
from helpers.verdict_corpus import write_verdict_corpus
from orchestration.cli import main
from refinery.ablations import build
from refinery.ablations.schedule_runs import funnel_root, prepare_run, run_config
from refinery.ablations.schedules import SCHEDULE, variant_phases
from refinery.config import load_config
from refinery.curriculum import read_manifest
from refinery.documents import input_shards
from refinery.global_steps.tokenize import encode_texts, read_tokenizer, series_fields
from refinery.layout import documents_key, final_index_key
from refinery.models.difficulty import score_documents
from refinery.models.difficulty_published import build_reference_model
from refinery.storage import LocalDataRoot
from training.data import CurriculumData
from training.status import read_status
from training.phase_runs import phase_run_dir

# Bands of about ten entries, so each ordered phase reads several of each bucket's.
EASY = {"by": "difficulty", "direction": "easy_first", "bands": 8}
HARD = {"by": "difficulty", "direction": "hard_first", "bands": 8}
# Few enough documents that the curriculum reads most of each bucket (and enough for its plan and a
# row of slack per phase).
DOCUMENTS = {"web": 90, "docs": 70}
# The helper's curriculum with main ordered easy first and the anneal hard first.
ORDERED = [{**p, **({"order": EASY} if p["name"] == "main" else {"order": HARD} if p["name"] == "anneal" else {})}
           for p in PHASES]
SCHEDULES = {"curriculum": {}, "uniform_order": {}, "no_anneal": {}, "iid": {},
             "hard_main": {"base": "uniform_order", "phases": {"main": {"order": HARD}}}}


@pytest.fixture(scope="module")
def ordered(tmp_path_factory):
    """A scored funnel variant under the ordered curriculum, with the manifests of `curriculum` and
    `uniform_order` written."""
    folder = tmp_path_factory.mktemp("ordered")
    path = schedule_folder(folder, phases=ORDERED, scored=True, documents=DOCUMENTS)
    data = yaml.safe_load(path.read_text())
    data["ablations"]["schedules"] = SCHEDULES
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    root = LocalDataRoot(folder / "main")
    for name in ("curriculum", "uniform_order"):
        prepare_run(root, cfg, SCHEDULE, name)
    return cfg, root


def plan(cfg, root, name: str):
    """The run's data as the trainer opens it, and every piece of every row it serves, in order."""
    vcfg = run_config(root, cfg, SCHEDULE, name, 0)
    data = CurriculumData.open(vcfg, funnel_root(root), ROWS)
    sampler, plans = data.sampler(False), []
    while not sampler.done():
        plans.append(sampler.plan_steps(1))
    return vcfg, data, served_pieces(data, plans)


def first_reads(data, pieces, phase: int) -> dict[tuple[str, int], list[int]]:
    """(bucket, pass) -> the entries whose first token phase `phase` served from its own entry set
    (not the previous phase's, in its blend window), in serving order."""
    bucket_of = {es.key: b for b, es in data.sets_by_phase[phase].items()}
    out: dict[tuple[str, int], list[int]] = defaultdict(list)
    for ph, key, epoch, entry, a, _ in pieces:
        if ph == phase and a == 0 and key in bucket_of:
            out[(bucket_of[key], epoch)].append(entry)
    return dict(out)


def entry_scores(root, bucket: str) -> np.ndarray:
    table = pl.read_parquet(funnel_root(root).local_path(f"shards/final/{bucket}/entries.parquet"))
    return table["difficulty"].to_numpy().astype(np.float64)


def bands_of(root, phase: str, bucket: str) -> dict[int, int]:
    """entry -> its band in the phase's manifest."""
    froot = funnel_root(root)
    pinned = read_manifest(froot, phase).order["buckets"][bucket]
    ids = np.load(froot.local_path(pinned["file"]))
    return {int(e): band for band, part in enumerate(np.split(ids, np.cumsum(pinned["entries"])[:-1]))
            for e in part.tolist()}


def tokens_by_phase(data, pieces) -> dict[tuple[int, str], int]:
    bucket_of = {es.key: b for phase in data.sets_by_phase for b, es in phase.items()}
    out: dict[tuple[int, str], int] = defaultdict(int)
    for ph, key, _, _, a, b in pieces:
        out[(ph, bucket_of[key])] += b - a
    return dict(out)


def test_the_tables_keep_drop_and_patch_the_order(ordered):
    cfg, _ = ordered
    orders = {name: [p.order for p in variant_phases(cfg, name, BUDGET)] for name in SCHEDULES}
    assert orders["curriculum"] == [None, EASY, None, HARD]
    assert orders["uniform_order"] == [None] * 4
    assert orders["no_anneal"] == [None, EASY, None, EASY]  # the last phase as main, its order too
    assert orders["iid"] == [None, None]
    assert orders["hard_main"] == [None, HARD, None, None]
    cur, uni = variant_phases(cfg, "curriculum", BUDGET), variant_phases(cfg, "uniform_order", BUDGET)
    assert [{**vars(p), "order": None} for p in cur] == [vars(p) for p in uni]  # the order, and only it


@pytest.mark.parametrize("phase, direction", [("s_curriculum__main", 1), ("s_curriculum__anneal", -1)])
def test_an_ordered_phase_serves_each_bucket_in_difficulty_order(ordered, phase, direction):
    cfg, root = ordered
    vcfg, data, pieces = plan(cfg, root, "curriculum")
    index = [p.name for p in vcfg.curriculum.phases].index(phase)
    reads = first_reads(data, pieces, index)
    assert {b for b, _ in reads} == {"web", "docs"}
    spanned = []
    for (bucket, epoch), entries in reads.items():
        score, band = entry_scores(root, bucket), bands_of(root, phase, bucket)
        read = [band[e] for e in entries]
        assert read == sorted(read), f"{bucket} pass {epoch}: bands out of order"
        # band after band, each band's scores all past the previous one's: in difficulty order
        # up to the shuffle within a band
        by_band = [score[[e for e in entries if band[e] == k]] for k in sorted(set(read))]
        for lower, upper in zip(by_band, by_band[1:]):
            assert (direction * lower).max() <= (direction * upper).min()
        spanned.append(len(by_band))
    assert max(spanned) >= 2, spanned  # the phase reads across bands (the anneal's four web entries do not)


def test_uniform_order_serves_the_same_entries_and_tokens_in_another_order(ordered):
    cfg, root = ordered
    cur_cfg, cur_data, cur_pieces = plan(cfg, root, "curriculum")
    uni_cfg, uni_data, uni_pieces = plan(cfg, root, "uniform_order")
    froot = funnel_root(root)
    for cur_phase, uni_phase in zip(cur_cfg.curriculum.phases, uni_cfg.curriculum.phases):
        a, b = read_manifest(froot, cur_phase.name), read_manifest(froot, uni_phase.name)
        assert (a.order is not None) == (cur_phase.order is not None) and b.order is None
        # every field pinned but the name and the order: budget, seq_len, LR, mixture, each bucket's entries
        pinned = [{k: v for k, v in m.to_json().items() if k not in ("phase", "order", "validation",
                                                                      "config_fingerprint")} for m in (a, b)]
        assert pinned[0] == pinned[1]
    for j in range(len(ORDERED)):
        assert {b: sorted(es.ids.tolist()) for b, es in cur_data.sets_by_phase[j].items()} == \
               {b: sorted(es.ids.tolist()) for b, es in uni_data.sets_by_phase[j].items()}
    assert tokens_by_phase(cur_data, cur_pieces) == tokens_by_phase(uni_data, uni_pieces)
    main = [p["name"] for p in ORDERED].index("main")
    band = bands_of(root, "s_curriculum__main", "web")
    read = [band[e] for e in first_reads(uni_data, uni_pieces, main)[("web", 0)]]
    assert read != sorted(read), "uniform_order's main is a shuffle"


def test_the_ordered_curriculum_trains_the_tokens_its_plan_serves(ordered):
    cfg, root = ordered
    vcfg, data, pieces = plan(cfg, root, "curriculum")
    assert train(cfg, SCHEDULE, "curriculum") == 0
    last = vcfg.curriculum.phases[-1].name
    summary = read_status(phase_run_dir(vcfg, last))["summary"]
    names = [p.name for p in vcfg.curriculum.phases]
    trained = {(names.index(ph), b): int(acc["tokens"]) for ph, buckets in summary.items() for b, acc in buckets.items()}
    assert trained == tokens_by_phase(data, pieces)


def test_the_funnel_variant_carries_the_main_graphs_difficulty_scores(tmp_path):
    c = write_verdict_corpus(tmp_path, variants={"funnel": {}, "raw": {"base": "raw"}})
    data = yaml.safe_load(c.config_path.read_text())
    data["stages"]["difficulty"] = {"enabled": True, "reference_buckets": ["wiki"]}
    c.config_path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(c.config_path)
    tokenizer = read_tokenizer(c.root, cfg.tokenizer.eod_token)
    published = build_reference_model(c.root, cfg, tokenizer)
    summaries = build.build_variants(c.root, cfg)
    assert summaries["funnel"]["difficulty_model_sha256"] == published.sha256
    assert "difficulty_model_sha256" not in summaries["raw"]
    clean = pl.concat([pl.read_parquet(c.root.local_path(documents_key("pii_redacted", s.key)))
                       for s in input_shards(cfg)])
    dtype = np.dtype(series_fields(cfg, tokenizer)["dtype"])
    text = dict(zip(clean["doc_id"].to_list(), clean["text"].to_list()))
    for name in ("funnel", "raw"):
        vroot = build.variant_root(c.root, name)
        for bucket in cfg.buckets:
            table = pl.read_parquet(vroot.local_path(vroot.read_json(final_index_key(bucket))["entries_table"]["key"]))
            docs = table.unique("doc_id", keep="first", maintain_order=True)
            assert docs.height > 5
            if name == "raw":
                assert docs["difficulty"].null_count() == docs.height
                continue
            expected = score_documents(published.model, encode_texts(tokenizer, [text[d] for d in docs["doc_id"]], dtype))
            np.testing.assert_array_equal(docs["difficulty"].to_numpy(), expected)  # the same float, NaN as null
    # another published reference model rebuilds the funnel variant alone
    before = {n: build.variant_root(c.root, n).sha256(build.SUMMARY_KEY) for n in ("funnel", "raw")}
    bigram = cfg.model_copy(update={"stages": cfg.stages.model_copy(update={
        "difficulty": cfg.stages.difficulty.model_copy(update={"order": 2})})})
    assert build_reference_model(c.root, bigram, tokenizer).sha256 != published.sha256
    build.build_variants(c.root, cfg)
    after = {n: build.variant_root(c.root, n).sha256(build.SUMMARY_KEY) for n in ("funnel", "raw")}
    assert after["raw"] == before["raw"] and after["funnel"] != before["funnel"]


def test_the_curriculum_with_an_order_once_refused_passes_the_preflight(tmp_path):
    def order_main(data):
        data["curriculum"]["phases"][1]["order"] = EASY

    path = with_schedules(tmp_path, {"curriculum": {}, "uniform_order": {}, "no_anneal": {}, "iid": {}},
                          {"mixtures": {"web": {"web": 1.0}}}, edit=order_main)
    assert main(["validate", "--config", str(path)]) == 0


@pytest.mark.parametrize("order, difficulty, field", [
    ({"by": "difficulty", "direction": "sideways"}, True, "ablations.schedules.mine.phases.main.order.direction"),
    ({"by": "perplexity"}, True, "ablations.schedules.mine.phases.main.order.by"),
    ({"by": "difficulty", "bands": 0}, True, "ablations.schedules.mine.phases.main.order.bands"),
    (EASY, False, "ablations.schedules.mine: phases ['main'] order by difficulty"),
])
def test_a_bad_order_in_a_schedule_patch_exits_2_naming_the_field(tmp_path, capsys, order, difficulty, field):
    def set_difficulty(data):
        data["stages"]["difficulty"]["enabled"] = difficulty

    path = with_schedules(tmp_path, {"curriculum": {}, "mine": {"base": "uniform_order", "phases": {"main": {
        "order": order}}}}, edit=set_difficulty)
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err, err
