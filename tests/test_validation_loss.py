"""The anneal playbook: per-bucket validation loss on held-out documents, the rule that halts a run
when a bucket's validation loss rises during anneal, and the planned vs served mixture in status."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestration.cli import main
from refinery.config import ConfigError, load_config
from refinery.storage import LocalDataRoot
from training.metrics import JsonLines
from training.status import read_status
from synthetic.curriculum import TINY_PHASES, SyntheticPhase, tiny_run
from training.checkpoint import ResumeRefused
from training.trainer import RunOptions, Trainer
from helpers.final_shards import bucket_entry_docs
from training.heldout import choose_heldout, doc_rank_keys
from training.halt import rising_buckets, val_rise

EVAL = {"eval_every_tokens": 256, "eval_entries_per_bucket": 8, "record_consumption": True}
# an anneal whose LR is 40x the main phase's: the validation loss of both buckets climbs
DIVERGING = TINY_PHASES[:2] + [SyntheticPhase("anneal", 2048, {"web": 0.5, "math": 0.5}, seq_len=64, lr_scale=40.0,
                                              interpolation=0.05)]
HALT_RULE = {"phase": "anneal", "patience": 2, "min_delta": 0.01}


@pytest.mark.parametrize("losses, patience, min_delta, fired", [
    ([3.0, 2.9, 2.95, 2.97], 2, 0.01, (2.9, [2.95, 2.97])),
    ([3.0, 2.9, 2.95, 2.85], 2, 0.01, None),  # fell back below the best: no longer rising
    ([3.0, 2.9, 2.905, 2.909], 2, 0.01, None),  # within min_delta of the best: noise
    ([3.0, 2.9, 2.95, 2.97], 3, 0.01, None),  # only two rising evaluations, three asked
    ([3.0, 3.1], 1, 0.0, (3.0, [3.1])),
    ([3.0], 1, 0.0, None),  # nothing to compare with yet
    ([2.0, 2.5, 2.2, 2.3], 3, 0.0, (2.0, [2.5, 2.2, 2.3])),  # each above the best before it, not the previous
])
def test_the_rise_rule_on_crafted_losses(losses, patience, min_delta, fired):
    assert val_rise(losses, patience, min_delta) == fired


def test_rising_buckets_names_only_the_rising_ones():
    history = {"web": [3.0, 2.9, 3.0, 3.1], "math": [2.0, 1.9, 1.8, 1.7]}
    assert rising_buckets(history, 2, 0.05) == {"web": (2.9, [3.0, 3.1])}


def test_heldout_entries_are_whole_documents_chosen_by_seed():
    docs = [f"d{i // 3}" for i in range(30)] + [f"e{i}" for i in range(20)]  # 10 documents of 3 windows, 20 of 1
    a = choose_heldout(docs, 5, seed=0)
    assert np.array_equal(a, choose_heldout(docs, 5, seed=0)), "the choice is deterministic"
    assert not np.array_equal(a, choose_heldout(docs, 5, seed=1))
    held_docs = {docs[i] for i in a}
    assert {i for i, d in enumerate(docs) if d in held_docs} == set(a.tolist()), "every window of a held-out document"
    # the held-out documents are a prefix of the seeded order, just long enough to reach 5 entries
    unique = sorted(set(docs))
    order = [unique[i] for i in np.argsort(doc_rank_keys(unique, 0), kind="stable")]
    assert set(order[: len(held_docs)]) == held_docs
    entries = [docs.count(d) for d in order[: len(held_docs)]]
    assert sum(entries) >= 5 > sum(entries[:-1])
    assert len(choose_heldout(docs, 0, seed=0)) == 0 and len(choose_heldout(docs, 10_000, seed=0)) == len(docs)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    trainer = Trainer(load_config(tiny_run(tmp, training=EVAL)))
    status = trainer.train()
    return tmp, trainer, status


def test_validation_loss_per_bucket_every_n_tokens(evaluated):
    _, trainer, status = evaluated
    assert status["state"] == "completed"
    metrics = trainer.metrics.read()
    evaluated_at = [m["step"] for m in metrics if "val_loss/web" in m]
    crossed = [m["step"] for i, m in enumerate(metrics)
               if m["tokens"] // 256 > (metrics[i - 1]["tokens"] if i else 0) // 256]
    assert evaluated_at == crossed and len(evaluated_at) >= 20
    for m in metrics:
        if "val_loss/web" in m:
            assert m["val_loss/math"] > 0 and np.isfinite(m["val_loss/web"]) and m["time/eval_s"] >= 0
    assert status["validation"]["step"] == evaluated_at[-1]
    assert set(status["validation"]["loss"]) == {"web", "math"}


def test_heldout_entries_never_appear_in_the_consumption_log(evaluated):
    tmp, trainer, _ = evaluated
    heldout = trainer.data.heldout
    assert all(len(ids) >= 8 for ids in heldout.values())
    served: dict[str, set[int]] = {"web": set(), "math": set()}
    for record in trainer.consumption.read():
        for bucket, entry in zip(record["bucket"], record["entry"]):
            served[bucket].add(entry)
    for bucket, ids in heldout.items():
        assert served[bucket] and not served[bucket] & set(ids.tolist()), bucket
    # and no other window of a held-out document was trained on either
    root = LocalDataRoot(tmp / "root")
    for bucket, ids in heldout.items():
        docs = bucket_entry_docs(root, trainer.data.schedule.manifests[0].buckets[bucket])
        held_docs = {docs[i] for i in ids}
        assert not {docs[e] for e in served[bucket]} & held_docs


def test_status_reports_planned_and_served_tokens_per_phase_and_bucket(evaluated):
    _, trainer, status = evaluated
    mixture = status["mixture"]
    assert set(mixture) == {"warmup", "main", "anneal"}
    for i, phase in enumerate(trainer.schedule.phase_names):
        planned = sum(b["planned"] for b in mixture[phase].values())
        assert planned == pytest.approx(trainer.schedule.manifests[i].token_budget)
        steps = trainer.schedule.phase_starts[i + 1] - trainer.schedule.phase_starts[i]
        assert sum(b["served"] for b in mixture[phase].values()) == steps * trainer.global_batch * trainer.schedule.manifests[i].seq_len
        for bucket, row in mixture[phase].items():
            assert row["served"] == status["summary"][phase][bucket]["tokens"]
    assert mixture["warmup"]["web"]["planned"] == pytest.approx(2048 * 0.8)


def test_a_rising_validation_loss_during_anneal_halts_the_run_with_the_reason(tmp_path, capsys):
    config = tiny_run(tmp_path, training={**EVAL, "anneal_halt_on_val_rise": HALT_RULE}, phases=DIVERGING)
    run_dir = tmp_path / "root/runs/demo"
    assert main(["train", "--config", str(config)]) == 3
    status = read_status(run_dir)
    assert status["state"] == "halted" and status["halt_kind"] == "val_loss_rise"
    assert status["reason"].startswith("val_loss_rise: validation loss of bucket(s)")
    assert "rose during phase 'anneal' for 2 evaluation(s) in a row by more than 0.01" in status["reason"]
    assert Path(status["checkpoint"]).name == f"step-{status['step']:08d}.pt"
    # the halt comes at the first anneal evaluation where the rule holds over the logged losses
    metrics = JsonLines(run_dir / "metrics.jsonl").read()
    anneal_start = min(m["step"] for m in metrics if m["phase_name"] == "anneal")
    history: dict[str, list[float]] = {"web": [], "math": []}
    first_fire = None
    for m in metrics:
        if m["step"] >= anneal_start and "val_loss/web" in m:
            for b in history:
                history[b].append(m[f"val_loss/{b}"])
            if first_fire is None and rising_buckets(history, 2, 0.01):
                first_fire = m["step"]
    assert status["step"] == first_fire == metrics[-1]["step"] < status["total_steps"]
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 3
    assert "the run halted: val_loss_rise" in capsys.readouterr().err


def test_the_rule_watches_only_its_phase(tmp_path):
    config = tiny_run(tmp_path, training={**EVAL, "anneal_halt_on_val_rise": {**HALT_RULE, "phase": "warmup"}},
                      phases=DIVERGING)
    assert Trainer(load_config(config)).train()["state"] == "completed", "anneal diverges, but the rule watches warmup"


def test_changing_the_heldout_entries_refuses_resume(tmp_path):
    config = tiny_run(tmp_path, training=EVAL)
    Trainer(load_config(config), RunOptions(stop_after_phase="warmup")).train()
    data = yaml.safe_load(config.read_text())
    data["training"]["eval_entries_per_bucket"] = 4
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(ResumeRefused, match=r"held-out validation entries of bucket\(s\) \[.math., .web.\] differ from the checkpoint's"):
        Trainer(load_config(config)).train()


def test_eval_settings_are_checked_at_load(tmp_path):
    config = tiny_run(tmp_path)
    data = yaml.safe_load(config.read_text())
    for training, message in [
        ({"eval_every_tokens": 256}, "eval_every_tokens and eval_entries_per_bucket go together"),
        ({"anneal_halt_on_val_rise": HALT_RULE}, "anneal_halt_on_val_rise needs validation loss"),
        ({**EVAL, "anneal_halt_on_val_rise": {"phase": "nope"}}, "training.anneal_halt_on_val_rise.phase: no phase 'nope'"),
    ]:
        config.write_text(yaml.safe_dump({**data, "training": {**data["training"], **training}}))
        with pytest.raises(ConfigError, match=message):
            load_config(config)


def test_a_resumed_run_evaluates_at_the_same_steps_with_the_same_losses(tmp_path, evaluated):
    config = tiny_run(tmp_path, training=EVAL)
    Trainer(load_config(config), RunOptions(stop_after_phase="main")).train()
    resumed = Trainer(load_config(config))
    assert resumed.train()["state"] == "completed"
    def losses(metrics):
        return {(m["step"], b): m[f"val_loss/{b}"] for m in metrics if "val_loss/web" in m for b in ("web", "math")}

    whole, again = losses(evaluated[1].metrics.read()), losses(resumed.metrics.read())
    assert again.keys() == whole.keys()
    assert [again[k] for k in sorted(again)] == pytest.approx([whole[k] for k in sorted(whole)], rel=1e-5)
    assert {p: {b: len(v) for b, v in h.items()} for p, h in resumed.val_history.items()} == \
        {p: {b: len(v) for b, v in h.items()} for p, h in evaluated[1].val_history.items()}
