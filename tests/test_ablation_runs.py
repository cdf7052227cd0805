"""Bits per byte (refinery/ablations/bpb.py) against hand-computed cases, and proxy runs
(training/proxy_run.py): the project's trainer on a variant's data root, then its bits per byte,
rerun byte for byte."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch

from helpers.ablation_runs import eval_frame, tiny_variant
from refinery.ablations.bpb import IGNORE, BitsPerByte, Tally, totals_by, windows
from refinery.layout import CHECKPOINTS_DIR
from refinery.storage import LocalDataRoot
from training.checkpoint import MODEL, load_checkpoint
from training.phase_runs import boundary_checkpoint
from training.proxy_run import proxy_run_dir, train_and_evaluate

EOD = 0


def encode_bytes(texts: list[str]) -> list[np.ndarray]:
    """A tokenizer with one token per UTF-8 byte (ids 1..256; 0 is EOD)."""
    return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 1 for t in texts]


def docs(*rows: tuple[str, str, str | None]) -> pl.DataFrame:
    return pl.DataFrame({"text": [r[0] for r in rows], "domain": [r[1] for r in rows], "language": [r[2] for r in rows]},
                        schema_overrides={"language": pl.String})


def per_token(table: torch.Tensor):
    """A model whose NLL of each target is `table[target]`, whatever the context."""
    return lambda x, y: torch.where(y != IGNORE, table[y.clamp(min=0)], 0.0)


def test_windows_score_every_target_once_with_at_least_seq_len_minus_stride_context():
    assert list(windows(10, 4, 2)) == [(0, 4, 0), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    assert list(windows(3, 4, 2)) == [(0, 3, 0)]
    assert list(windows(7, 4, 4)) == [(0, 4, 0), (3, 7, 4)]  # the last window reaches back to a full seq_len
    for n, seq_len, stride in [(1, 8, 4), (50, 8, 3), (64, 16, 16), (65, 16, 5)]:
        scored = [t for begin, end, first in windows(n, seq_len, stride) for t in range(first, end)]
        assert scored == list(range(n))
        for begin, end, first in list(windows(n, seq_len, stride))[1:]:
            assert end - begin == seq_len and first - begin >= seq_len - stride
    with pytest.raises(ValueError, match="stride"):
        list(windows(10, 4, 5))


def test_a_uniform_model_scores_tokens_times_log2_vocab_over_bytes():
    vocab = 300
    frame = docs(("hello world, hallo Welt", "web", "en"), ("Grüße aus Köln " * 9, "books", "de"))
    cells = BitsPerByte(lambda x, y: torch.full(y.shape, math.log(vocab)), encode_bytes, EOD, seq_len=8).run([frame])
    for text, domain, language in frame.iter_rows():
        n_bytes = len(text.encode("utf-8"))
        tally = cells[(domain, language)]
        # one token per byte, plus the closing EOD, each predicted once
        assert (tally.documents, tally.tokens, tally.bytes) == (1, n_bytes + 1, n_bytes)
        assert tally.bpb == pytest.approx((n_bytes + 1) * math.log2(vocab) / n_bytes, abs=1e-6)


def test_a_per_token_model_sums_each_tokens_bits_once_across_windows():
    table = torch.rand(257, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 5
    text = "a long document that spans many windows of eight tokens, " * 3
    cells = BitsPerByte(per_token(table), encode_bytes, EOD, seq_len=8, stride=3, batch_rows=5).run([docs((text, "d", "en"))])
    expected_nats = sum(table[b + 1].item() for b in text.encode("utf-8")) + table[EOD].item()
    assert cells[("d", "en")].nats == pytest.approx(expected_nats, rel=1e-6)
    assert cells[("d", "en")].bpb == pytest.approx(expected_nats / math.log(2) / len(text.encode("utf-8")), abs=1e-6)


def test_each_scored_token_sees_the_context_its_window_allows():
    """A model whose NLL of a target is the number of tokens it sees (its position in the window,
    plus one): an 11-byte text is 12 targets; at seq_len 6 and stride 2 the first window scores 6
    targets seeing 1..6 tokens, and each later window 2 targets seeing 5 and 6."""
    context = lambda x, y: torch.arange(1, y.shape[1] + 1, dtype=torch.float64).expand(y.shape)  # noqa: E731
    cells = BitsPerByte(context, encode_bytes, EOD, seq_len=6, stride=2).run([docs(("hello world", "d", "en"))])
    assert cells[("d", "en")].tokens == 12
    assert cells[("d", "en")].nats == sum(range(1, 7)) + 3 * (5 + 6)


def test_domains_and_languages_add_bits_and_bytes_not_ratios():
    frame = docs(("aaaa", "web", "en"), ("bb" * 50, "web", "de"), ("cc", "docs", "en"), ("", "docs", "en"),
                 ("dd", "docs", None))
    cells = BitsPerByte(lambda x, y: torch.ones(y.shape), encode_bytes, EOD, seq_len=16).run([frame])
    assert set(cells) == {("web", "en"), ("web", "de"), ("docs", "en"), ("docs", "unknown")}
    assert cells[("docs", "en")].documents == 1  # the empty text is not scored
    web = totals_by(cells, "domain")["web"]
    assert (web.tokens, web.bytes) == (5 + 101, 104)
    assert web.bpb == pytest.approx((5 + 101) / math.log(2) / 104, abs=1e-12)
    english = totals_by(cells, "language")["en"]
    assert english.bytes == 6 and english.bpb == pytest.approx((5 + 3) / math.log(2) / 6, abs=1e-12)
    assert totals_by(cells, "all")["all"] == sum(cells.values(), Tally())


def test_the_gpt_scores_what_its_own_loss_computes():
    """The trainer's GPT through `score`: a document in one window gives the model's mean loss on
    the sequence EOD, tokens, EOD times its tokens."""
    from training.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=257, n_layer=1, n_head=2, n_embd=16)).eval()
    text = "bits per byte"
    cells = BitsPerByte(lambda x, y: model(x, y, reduction="none")[1], encode_bytes, EOD, seq_len=32).run(
        [docs((text, "d", "en"))])
    seq = torch.tensor([[EOD, *encode_bytes([text])[0].tolist(), EOD]])
    with torch.no_grad():
        mean = model(seq[:, :-1], seq[:, 1:])[1].item()
    assert cells[("d", "en")].nats == pytest.approx(mean * (len(text) + 1), rel=1e-5)


# ---- proxy runs ------------------------------------------------------------------------------------


def proxy(folder, seed=0, sinks=None):
    vcfg = tiny_variant(folder, seed)
    main = LocalDataRoot(folder / "main")
    code = train_and_evaluate(vcfg, main, "ablations/results/v/seed.json", {"variant": "v", "seed": seed},
                              lambda: [eval_frame()], sinks=sinks)
    return vcfg, code, folder / "main" / "ablations/results/v/seed.json"


def model_state(vcfg):
    return load_checkpoint(boundary_checkpoint(proxy_run_dir(vcfg), "ablation"))[MODEL]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    return proxy(tmp_path_factory.mktemp("first"))


def test_a_proxy_run_trains_its_budget_then_scores_every_evaluation_document(first_run):
    vcfg, code, results = first_run
    assert code == 0
    stored = json.loads(results.read_text())
    assert (stored["variant"], stored["seed"], stored["steps"], stored["tokens_trained"]) == ("v", 0, 8, 512)
    assert sum(c["documents"] for c in stored["cells"]) == 5  # six documents, one of them empty
    assert {(c["domain"], c["language"]) for c in stored["cells"]} == {
        ("docs", "en"), ("docs", "de"), ("docs", "unknown"), ("web", "en"), ("web", "de")}
    assert 0 < stored["bpb"] < 8 * math.log2(512)
    # every scored document's nats and bytes, which the report's bootstrap resamples
    docs = stored["documents"]
    assert docs["doc_id"] == ["eval-0", "eval-1", "eval-2", "eval-3", "eval-5"] and all(docs["kept"])
    assert sum(docs["bytes"]) == sum(c["bytes"] for c in stored["cells"])
    assert sum(docs["nats"]) == pytest.approx(sum(c["nats"] for c in stored["cells"]))


def test_a_finished_proxy_run_keeps_its_boundary_checkpoint_only(first_run):
    vcfg, _, _ = first_run
    # 8 steps, a checkpoint every 3 (keep_last 1): step 6 went once the boundary one at 8 was written
    kept = sorted(p.name for p in (proxy_run_dir(vcfg) / CHECKPOINTS_DIR).glob("step-*.pt"))
    assert kept == ["step-00000008.pt"]
    assert boundary_checkpoint(proxy_run_dir(vcfg), "ablation") == proxy_run_dir(vcfg) / CHECKPOINTS_DIR / kept[0]


def test_a_rerun_is_byte_identical_up_to_its_checkpoints(first_run, tmp_path):
    vcfg, _, results = first_run
    again, code, results_again = proxy(tmp_path)
    assert code == 0 and results_again.read_bytes() == results.read_bytes()
    first, second = model_state(vcfg), model_state(again)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_run_killed_midway_resumes_to_the_same_model_and_figures(first_run, tmp_path):
    vcfg, _, results = first_run

    def die_at_step_5(record):
        if record["step"] == 5:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        proxy(tmp_path, sinks=[die_at_step_5])
    assert not (tmp_path / "main").exists()
    resumed, code, results_resumed = proxy(tmp_path)
    log = (proxy_run_dir(resumed) / "metrics.jsonl").read_text().splitlines()
    assert code == 0 and [json.loads(line)["step"] for line in log] == list(range(1, 9))
    assert results_resumed.read_bytes() == results.read_bytes()


def test_a_finished_run_is_not_trained_or_scored_again(tmp_path):
    vcfg, _, results = proxy(tmp_path)
    metrics = (proxy_run_dir(vcfg) / "metrics.jsonl").read_bytes()
    stamp = results.stat().st_mtime_ns
    _, code, _ = proxy(tmp_path)
    assert code == 0 and (proxy_run_dir(vcfg) / "metrics.jsonl").read_bytes() == metrics
    assert results.stat().st_mtime_ns == stamp


def test_seeds_change_the_model_and_the_figures(first_run, tmp_path):
    vcfg, _, results = first_run
    other, _, results_other = proxy(tmp_path, seed=1)
    assert not torch.equal(model_state(vcfg)["wte.weight"], model_state(other)["wte.weight"])
    assert json.loads(results_other.read_text())["bpb"] != json.loads(results.read_text())["bpb"]


def test_an_evaluation_set_without_text_is_refused_and_nothing_is_written(tmp_path, capsys):
    vcfg = tiny_variant(tmp_path)
    main = LocalDataRoot(tmp_path / "main")
    empty = eval_frame().with_columns(text=pl.lit(""))
    assert train_and_evaluate(vcfg, main, "r.json", {"variant": "v", "seed": 0}, lambda: [empty]) == 2
    assert "holds no text to score" in capsys.readouterr().err and not main.exists("r.json")
