"""One proxy run of an ablation: the project's trainer on one variant's data root with one seed,
then the trained model's bits per byte on the evaluation set (refinery/ablations/bpb.py).

`variant_config(cfg, variant, seed)` (refinery/ablations/build.py) is the config the trainer runs: the
variant's own data root (its token shards and one phase of the ablation's token budget),
`ablations.model`, and the run's seed plus `seed`. That seed is the only thing that differs between
the runs of one variant: the trainer draws the model's initial weights from it (torch.manual_seed)
and the data order (each pass's permutation of the entries and the rows' slots within a step); the
variant's documents, shards and budget do not depend on it.

Training is `refinery train` on that config, unchanged: checkpoints, resume from the latest one
after a kill (`--resume auto`), status.json, halts. Once the run has finished, only its boundary
checkpoint is kept (`keep_boundary_only`). The run directory is the phase's, as for
`training_run`. Once the phase is complete, the model of its boundary checkpoint is scored on the
evaluation documents and `results_key(variant, seed)` is written under the main data root. The
file holds no time and no path, so rerunning a run gives the same bytes; `model_sha256` (a digest of
the trained weights) says which model the figures are of, and a rerun whose model has that digest
does not score it again.

`python -m training.proxy_run --config C --variant V --seed S` runs one (the `ablation_runs` asset
launches it through Dagster Pipes, locally or on a Ray node, assets/pipes_ablation.py). Exit status
as `refinery train`: 0 done, 2 a config or input problem, 3 halted or refused, 1 failed.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from refinery.config import RefineryConfig
from refinery.storage import DataRoot, open_data_root

# Rows of seq_len tokens scored per forward pass of the evaluation.
EVAL_BATCH_ROWS = 16
# 2: the results hold every document's scores (`documents`), which the report's paired bootstrap
# resamples; a stored result of another format is scored again.
RESULTS_FORMAT = 2


def single_phase(vcfg: RefineryConfig) -> str:
    phases = [p.name for p in vcfg.curriculum.phases] if vcfg.curriculum is not None else []
    if len(phases) != 1:
        raise ValueError(f"a proxy run trains one phase; its config has {phases}")
    return phases[0]


def last_phase(vcfg: RefineryConfig) -> str:
    """The phase whose boundary checkpoint holds the model a proxy run scores (a schedule variant
    trains several, training/schedule_run.py)."""
    if vcfg.curriculum is None:
        raise ValueError("a proxy run trains a curriculum; its config has none")
    return vcfg.curriculum.phases[-1].name


def proxy_run_dir(vcfg: RefineryConfig) -> Path:
    """The run directory of a proxy run's last phase, as `training_run` would use."""
    from training.phase_runs import phase_run_dir

    return phase_run_dir(vcfg, last_phase(vcfg))


def train_args(vcfg: RefineryConfig, resume: str, phase: str | None = None) -> argparse.Namespace:
    """What `refinery train` is given for a proxy run: its last phase, or `phase` in its own run
    directory, stopping at its boundary."""
    from training.phase_runs import phase_run_dir

    run_dir = proxy_run_dir(vcfg) if phase is None else phase_run_dir(vcfg, phase)
    return argparse.Namespace(config=None, resume=resume, stop_after_phase=phase, run_dir=str(run_dir),
                              simulate_world_size=1, num_workers=None, fresh=False, json=False)


def model_digest(state: dict[str, Any]) -> str:
    """sha256 over a model state dict's tensors (name, dtype, shape, bytes) in name order."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trained_model(vcfg: RefineryConfig):
    """(the GPT of the phase's boundary checkpoint on the run's device, in eval mode; its digest)."""
    from training.checkpoint import MODEL, MODEL_ARGS, load_checkpoint
    from training.distributed import Distributed
    from training.model import GPT, GPTConfig
    from training.phase_runs import boundary_checkpoint

    run_dir, phase = proxy_run_dir(vcfg), last_phase(vcfg)
    path = boundary_checkpoint(run_dir, phase)
    if path is None:
        raise FileNotFoundError(f"{run_dir}: no boundary checkpoint of phase {phase!r}; the run has not finished")
    state = load_checkpoint(path)
    device = Distributed.setup(vcfg.training.device, vcfg.training.cpu_threads).device
    model = GPT(GPTConfig(**state[MODEL_ARGS]), "sdpa")
    model.load_state_dict(state[MODEL])
    return model.to(device).eval(), model_digest(state[MODEL])


def evaluate(vcfg: RefineryConfig, documents: Iterable, identity: dict[str, Any]) -> dict[str, Any]:
    """The results of the finished run of `vcfg`: `identity` (variant, seed), what it trained and
    its bits per byte per (domain, language) of `documents` (polars batches: text, domain, language)."""
    import numpy as np

    from refinery.ablations.bpb import BitsPerByte, cells_to_json, totals_by
    from refinery.global_steps.tokenize import encode_texts, read_tokenizer
    from training.status import read_status

    model, digest = trained_model(vcfg)
    root = open_data_root(vcfg.resolve(vcfg.data_root))
    tokenizer = read_tokenizer(root, vcfg.tokenizer.eod_token)
    seq_len = vcfg.curriculum.phases[-1].seq_len
    scorer = BitsPerByte(lambda x, y: model(x, y, reduction="none")[1],
                         lambda texts: encode_texts(tokenizer, texts, np.int64),
                         tokenizer.token_to_id(vcfg.tokenizer.eod_token), seq_len, batch_rows=EVAL_BATCH_ROWS,
                         device=str(next(model.parameters()).device))
    cells = scorer.run(documents)
    status = read_status(proxy_run_dir(vcfg)) or {}
    overall = totals_by(cells, "all").get("all")
    return {
        **identity,
        "model": vcfg.training.model.model_dump(mode="json"), "model_sha256": digest,
        "steps": status.get("step"), "tokens_trained": status.get("tokens"),
        "seq_len": seq_len, "stride": scorer.stride,
        "bpb": overall.bpb if overall else None,
        "cells": cells_to_json(cells),
        "documents": scorer.documents,
    }


def keep_boundary_only(vcfg: RefineryConfig) -> None:
    """Delete the finished run's checkpoints but the boundary one: the model scored is the boundary
    checkpoint's, and a finished phase never resumes from a mid-phase one (13 MB a run otherwise)."""
    from refinery.layout import CHECKPOINTS_DIR
    from training.checkpoint import CheckpointManager

    CheckpointManager(proxy_run_dir(vcfg) / CHECKPOINTS_DIR, keep_last=0).prune()


def current_results(root: DataRoot, key: str, vcfg: RefineryConfig, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The stored results when they are of this run (`identity`: variant, seed, the evaluation
    set's digest) and of the model its boundary checkpoint holds."""
    if not root.exists(key):
        return None
    stored = root.read_json(key)
    if any(stored.get(k) != v for k, v in identity.items()):
        return None
    return stored if stored.get("model_sha256") == trained_model(vcfg)[1] else None


def train_and_evaluate(vcfg: RefineryConfig, root: DataRoot, key: str, identity: dict[str, Any],
                       documents: Callable[[], Iterable], resume: str = "auto", sinks: list | None = None) -> int:
    """Train `vcfg`'s one phase (resuming), then write its results to `key` under `root` unless they
    are current; returns `refinery train`'s exit status (2 too when there is no evaluation text)."""
    from training.cli import run_train

    code = run_train(train_args(vcfg, resume), sinks=sinks, cfg=vcfg)
    if code != 0:
        return code
    keep_boundary_only(vcfg)
    if current_results(root, key, vcfg, identity) is None:
        results = evaluate(vcfg, documents(), identity)
        if results["bpb"] is None:
            from training.launcher import EXIT_INPUT

            print("proxy run: the evaluation set holds no text to score (every document's text is empty); "
                  "nothing was written", file=sys.stderr)
            return EXIT_INPUT
        root.write_json(key, results)
        print(f"proxy run {identity}: {results['bpb']:.4f} bits per byte over "
              f"{sum(c['documents'] for c in results['cells'])} evaluation documents -> {root.display(key)}")
    return 0


def run_proxy(cfg: RefineryConfig, variant: str, seed: int, resume: str = "auto", sinks: list | None = None) -> int:
    """The proxy run of `variant` with `seed` under the main config `cfg`."""
    from refinery.ablations.build import variant_config
    from refinery.ablations.eval_set import EVAL_DOCUMENTS_KEY, eval_documents
    from refinery.ablations.report import results_key

    vcfg = variant_config(cfg, variant, seed)  # refuses a variant not built yet
    root = open_data_root(cfg.resolve(cfg.data_root))
    identity = {"variant": variant, "seed": seed, "eval_set_sha256": root.sha256(EVAL_DOCUMENTS_KEY),
                "results_format": RESULTS_FORMAT}
    return train_and_evaluate(vcfg, root, results_key(variant, seed), identity, lambda: eval_documents(root), resume,
                              sinks)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.proxy_run",
                                description="Train one ablation variant with one seed and score it in bits per byte.")
    p.add_argument("--config", required=True, help="the run's YAML config, with an `ablations` section")
    p.add_argument("--variant", required=True, help="a name under ablations.variants")
    p.add_argument("--seed", type=int, required=True, help="the run's seed (0 .. ablations.seeds - 1)")
    p.add_argument("--resume", default="auto", help="as `refinery train --resume` (default auto)")
    return p


def main(argv: list[str] | None = None, sinks_for: Callable[[Path], list] | None = None) -> int:
    """The command line; `sinks_for(run_dir)` gives the metrics sinks (the Pipes child's forwarder).
    A config or input problem (a variant not built, no evaluation set) exits 2, which the relaunch
    loop does not relaunch."""
    from refinery.ablations.build import variant_config
    from refinery.config import ConfigError, load_config
    from training.launcher import EXIT_INPUT

    args = parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
        sinks = sinks_for(proxy_run_dir(variant_config(cfg, args.variant, args.seed))) if sinks_for else None
        return run_proxy(cfg, args.variant, args.seed, args.resume, sinks)
    except (ConfigError, FileNotFoundError) as err:
        print(f"proxy run: {err}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
