"""Schedule variants' inputs without the funnel: a main data root whose `funnel` variant is a
two-bucket data root of random tokens (helpers/final_shards.py) with its summary, the run's tokenizer and
the evaluation documents, under a config with a four-phase curriculum and an `ablations` section of
schedule variants and anneal mixtures; with `scored`, every funnel document carries a difficulty
score and the config enables the difficulty stage, as a main graph whose curriculum orders by it.
Every path in the config is relative to its folder, so a copy of the folder is a run of its own."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import yaml

from helpers.ablation_runs import EVAL_TEXTS, eval_frame
from helpers.configs import demo_config
from helpers.final_shards import write_final_shards
from refinery.ablations.build import SUMMARY_KEY, variant_root_key
from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY
from refinery.global_steps.tokenize import train_tokenizer
from refinery.layout import TOKENIZER_KEY, final_index_key
from refinery.storage import LocalDataRoot
from synthetic.curriculum import SyntheticBucket, synthetic_config

DOCUMENTS = {"web": 200, "docs": 150}
WINDOW, ROWS = 32, 2  # the proxy's seq_len and micro batch: a step is 64 tokens
BUDGET = 40 * WINDOW * ROWS
# In the curriculum's units: 64 and 128 scale to 16 and 32 proxy tokens.
PHASES = [
    {"name": "warmup", "share": 0.1, "seq_len": 64, "weights": {"web": 0.9, "docs": 0.1}},
    {"name": "main", "share": 0.5, "seq_len": 64, "interpolation": 0.05, "weights": {"web": 0.7, "docs": 0.3}},
    {"name": "reasoning", "share": 0.25, "seq_len": 128, "weights": {"web": 0.5, "docs": 0.5}},
    {"name": "anneal", "share": 0.15, "seq_len": 128, "lr_scale": 1.0, "weights": {"web": 0.2, "docs": 0.8}},
]
SCHEDULES = {"curriculum": {}, "iid": {}, "no_anneal": {}, "no_length_warmup": {},
             "web_anneal": {"base": "curriculum", "phases": {"anneal": {"weights": {"web": 0.6, "docs": 0.4}}}}}
MIXTURES = {"docs_only": {"docs": 1.0}, "even": {"web": 0.5, "docs": 0.5}}


def difficulty_of(doc_id: str) -> float:
    """A `scored` folder's difficulty of a document: spread over 1-9 nats, unrelated to its length
    or position."""
    return 1.0 + int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 8.0


def schedule_folder(folder: Path, ablations: dict | None = None, phases: list[dict] = PHASES,
                    scored: bool = False, documents: dict[str, int] = DOCUMENTS) -> Path:
    """Write the inputs (`documents` per bucket) and the config (its curriculum `phases`) under
    `folder`; returns the config's path."""
    folder.mkdir(parents=True, exist_ok=True)
    funnel = folder / "main" / variant_root_key("funnel")
    main, froot = LocalDataRoot(folder / "main"), LocalDataRoot(funnel)
    rng = np.random.default_rng(5)
    for bucket, n in documents.items():  # entries of at most one window: the packing window is the proxy's
        docs = [(f"{bucket}-{i:05d}", int(rng.integers(12, WINDOW + 1)), None) for i in range(n)]
        write_final_shards(froot, bucket, docs, per_shard=64,
                           difficulty={d: difficulty_of(d) for d, _, _ in docs} if scored else None)
    tokens = {b: sum(s["tokens"] for s in froot.read_json(final_index_key(b))["shards"]) for b in documents}
    tokenizer = train_tokenizer([t for _, _, t in EVAL_TEXTS] * 4, 300, "<|endoftext|>").to_str().encode()
    for root in (main, froot):
        root.write_bytes(TOKENIZER_KEY, tokenizer)
    froot.write_json(SUMMARY_KEY, {"variant": "funnel", "budget_tokens": BUDGET,
                                   "stored": {"tokens": sum(tokens.values()), "bucket_tokens": tokens}})
    with main.writer(EVAL_DOCUMENTS_KEY) as path:
        eval_frame().write_parquet(path)
    buckets = {b: SyntheticBucket(docs=n, mean_len=WINDOW) for b, n in documents.items()}
    path = synthetic_config(folder / "run.yaml", folder / "main", buckets, [], seed=3,
                            training={"checkpoint_interval": 3, "keep_last": 1})
    data = yaml.safe_load(path.read_text())
    data["data_root"] = "main"
    data["sources"][0]["path"] = "synthetic-input/empty.jsonl"
    data["curriculum"] = {"total_tokens": 1_000_000, "phases": phases}
    if scored:
        data["stages"]["difficulty"] = {"enabled": True, "reference_buckets": ["docs"]}
    data["ablations"] = ablations if ablations is not None else {
        "variants": {"funnel": {}}, "seeds": 2, "seq_len": WINDOW, "micro_batch_size": ROWS, "warmup_steps": 2,
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 1024}, "schedules": SCHEDULES,
        "anneal_search": {"mixtures": MIXTURES}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def copy_folder(folder: Path, to: Path) -> Path:
    """A copy of a schedule folder (its runs included): returns the copy's config path."""
    shutil.copytree(folder, to, symlinks=True)
    return to / "run.yaml"


def train(cfg, kind: str, name: str, seed: int = 0) -> int:
    """Write the run's manifests and train it in this process from its first unfinished phase, as
    the asset launches it; returns the exit status."""
    from refinery.ablations.schedule_runs import prepare_run, run_config
    from refinery.storage import open_data_root
    from training.phase_runs import resume_argument
    from training.schedule_run import first_unfinished, run_from

    root = open_data_root(cfg.resolve(cfg.data_root))
    prepare_run(root, cfg, kind, name)
    vcfg = run_config(root, cfg, kind, name, seed)
    phase = first_unfinished(vcfg, kind)
    return run_from(cfg, kind, name, seed, phase, resume_argument(vcfg, phase))


def with_schedules(tmp_path: Path, schedules: dict | None = None, anneal: dict | None = None,
                   edit=lambda data: None) -> Path:
    """configs/demo.yaml (its curriculum, difficulty enabled) with an `ablations` section of
    `schedules` and `anneal` mixtures, `edit`ed in place first; returns the config's path."""
    data = demo_config(tmp_path / "out")
    edit(data)
    data["ablations"] = {"variants": {"funnel": {}}, "schedules": schedules or {"curriculum": {}},
                         **({"anneal_search": anneal} if anneal else {})}
    path = tmp_path / "refinery.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
