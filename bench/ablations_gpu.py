"""The proxy-model ablations again on a GPU, with GPT-2 small's shape (issue 37): the variants that
`make ablations` built, trained by the same proxy runs (training/proxy_run.py) with a larger model,
scored on the same evaluation set, and reported by the same table as `refinery ablations`.

    # here, after `make ablations` (or bench/ablations.py) has built the variants:
    python bench/ablations_gpu.py pack [--root out/ablations] [--config configs/ablations.yaml]
                                       [--out gpu-ablations] [--model 12x12x768] [--lr 6e-4]
                                       [--warmup 20] [--seeds 5]
    # on the GPU machine, one process for every run:
    python bench/ablations_gpu.py run --config gpu-ablations/ablations.yaml --out OUT

`pack` copies what the proxy runs read and nothing else: each variant's summary, tokenizer, final
shards and one-phase manifest, the evaluation set, the raw-bytes count and the main tokenizer (about
10 MB for configs/ablations.yaml's crawl; the documents, verdict tables and CPU runs stay behind).
It writes a config beside them: the ablation config with its data root at the copy and the
`ablations` model, learning rate, warmup and seeds given here. Those fields are not in the config
fingerprint and do not shape the variants, so the copied shards and manifests are the ones the CPU
runs trained on, byte for byte: same documents, same token budget, same data order per seed. Only
the model (and the learning rate that suits it) differs.

`run` trains every variant x seed in one process (the first run compiles the CUDA kernels; the
others reuse them), each through `training.proxy_run.run_proxy`, exactly as the `ablation_runs`
asset does (removing each run's checkpoint once it is scored, unless --keep-checkpoints), seed by
seed (`--budget-s` stops before a seed that would start after it, so every variant has the same
seeds), then prints the report and writes to OUT: report.txt and report.json (the table of
`refinery ablations`), runs.json (per run: wall seconds, tokens, tokens/s) and environment.json
(torch, the GPU, the model's parameter count). Without CUDA it runs on the CPU (a smoke check of
the script; a 12-layer model there takes minutes a run).

Why the runs are the CPU runs' size and not 100M tokens: the variants hold 0.3M (quality_top_half)
to 1.5M (raw) tokens, since the real text this machine holds is 3.2 MB (data/ablations/build_crawl.py),
and the device call carries at most 64 MiB, the wheels it needs (polars, pydantic) included.
bench/RESULTS.md gives the arithmetic.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from refinery.config.paths import rebase_paths  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PACKED_ROOT = "root"  # the copied data root, inside the pack folder
# Per variant, what a proxy run reads (training/proxy_run.py, refinery/ablations/build.py
# variant_config): its summary, its tokenizer, its final shards and its one-phase manifest.
VARIANT_PARTS = ("summary.json", "tokenizer", "shards/final", "manifests")
# Under the main data root: the evaluation set and the raw-bytes count the report reads, and the
# tokenizer that the evaluation encodes with.
ROOT_PARTS = ("tokenizer", "ablations/eval", "ablations/raw_bytes.json")
NO_INTERIM_CHECKPOINTS = 1_000_000  # steps between checkpoints: more than any proxy run takes


def parse_model(text: str) -> dict[str, int]:
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"--model {text!r}: LAYERSxHEADSxWIDTH, e.g. 12x12x768 (GPT-2 small)")
    n_layer, n_head, n_embd = map(int, parts)
    if n_embd % n_head:
        raise SystemExit(f"--model {text!r}: the width ({n_embd}) is not a multiple of the heads ({n_head})")
    return {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}


def copy_part(src: Path, dst: Path) -> int:
    """Copy a file or a folder; returns the bytes copied."""
    if not src.exists():
        raise SystemExit(f"pack: {src} is missing; build the variants first (`make ablations`)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
        return sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    shutil.copy2(src, dst)
    return dst.stat().st_size


def pack(args: argparse.Namespace) -> int:
    data = yaml.safe_load(args.config.read_text())
    variants = list(data["ablations"]["variants"])
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    size = 0
    for part in ROOT_PARTS:
        size += copy_part(args.root / part, out / PACKED_ROOT / part)
    for name in variants:
        for part in VARIANT_PARTS:
            rel = f"ablations/variants/{name}/{part}"
            size += copy_part(args.root / rel, out / PACKED_ROOT / rel)
    # The packed config: relative paths resolve against its own folder (refinery/config), so every
    # path the ablation config names is rewritten against `out`; the sources are not read by a
    # proxy run (the variants are built), so they keep their names.
    data = rebase_paths(data, args.config.parent, to=out)
    data["data_root"] = PACKED_ROOT
    data["ablations"].update(model=parse_model(args.model), lr=args.lr, warmup_steps=args.warmup, seeds=args.seeds)
    # Only the phase-boundary checkpoint, the one a run is scored from: a save of GPT-2 small with its
    # AdamW state writes about 1 GB, and a proxy run is 148 steps.
    data.setdefault("training", {})["checkpoint_interval"] = NO_INTERIM_CHECKPOINTS
    config = out / "ablations.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"packed {len(variants)} variants ({', '.join(variants)}), {size / 1e6:.1f} MB, into {out}; config {config}")
    return 0


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def environment(model_params: int | None) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
            "model_parameters": model_params}


def run(args: argparse.Namespace) -> int:
    from refinery.ablations.build import variant_config
    from refinery.ablations.report import build_report, format_report, load_stored
    from refinery.config import load_config
    from refinery.layout import CHECKPOINTS_DIR
    from refinery.storage import open_data_root
    from training.proxy_run import proxy_run_dir, run_proxy, trained_model
    from training.status import read_status

    cfg = load_config(args.config)
    assert cfg.ablations is not None, f"{args.config} has no ablations section"
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(environment(None)), flush=True)
    runs, model_params, began = [], None, time.perf_counter()
    # Seed by seed, every variant within a seed: a run cut short by --budget-s leaves every variant
    # with the same seeds.
    for seed in range(cfg.ablations.seeds):
        if runs and time.perf_counter() - began > args.budget_s:
            print(f"--budget-s {args.budget_s:g} spent after seed {seed - 1}: seeds {seed}.. not run", flush=True)
            break
        for variant in cfg.ablations.variants:
            start = time.perf_counter()
            code = run_proxy(cfg, variant, seed)
            wall = time.perf_counter() - start
            if code != 0:
                print(f"run {variant} seed {seed}: exit {code}", file=sys.stderr)
                return code
            vcfg = variant_config(cfg, variant, seed)
            tokens = (read_status(proxy_run_dir(vcfg)) or {}).get("tokens")
            if model_params is None:
                model_params = parameters(trained_model(vcfg)[0])
            if not args.keep_checkpoints:  # scored and written: 25 runs' 1 GB checkpoints would fill the disk
                shutil.rmtree(proxy_run_dir(vcfg) / CHECKPOINTS_DIR)
            runs.append({"variant": variant, "seed": seed, "wall_s": round(wall, 2), "tokens": tokens,
                         "tokens_per_s": round(tokens / wall) if tokens else None})
            print(f"run {variant} seed {seed}: {wall:.1f}s, {tokens} tokens", flush=True)
    env = environment(model_params)
    root = open_data_root(cfg.resolve(cfg.data_root))
    report = build_report(*load_stored(root, list(cfg.ablations.variants), cfg.ablations.seeds))
    table = format_report(report)
    print(table)
    (args.out / "report.txt").write_text(table + "\n")
    (args.out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    (args.out / "environment.json").write_text(json.dumps({**env, "model": cfg.ablations.model.model_dump(),
                                                            "lr": cfg.ablations.lr,
                                                            "warmup_steps": cfg.ablations.warmup_steps},
                                                           indent=1) + "\n")
    print(json.dumps(env))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="copy the built variants and write the GPU config")
    p.add_argument("--root", type=Path, default=REPO / "out" / "ablations", help="the ablation data root")
    p.add_argument("--config", type=Path, default=REPO / "configs" / "ablations.yaml")
    p.add_argument("--out", type=Path, default=REPO / "gpu-ablations")
    p.add_argument("--model", default="12x12x768", help="LAYERSxHEADSxWIDTH (default GPT-2 small's 12x12x768)")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default GPT-2 small's 6e-4)")
    p.add_argument("--warmup", type=int, default=20, help="warmup steps")
    p.add_argument("--seeds", type=int, default=5, help="proxy runs per variant")
    p.set_defaults(func=pack)
    r = sub.add_parser("run", help="train and score every variant x seed of a packed config")
    r.add_argument("--config", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True, help="where the report and timings go")
    r.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each run's checkpoint (default: removed once the run is scored, to bound the disk)")
    r.add_argument("--budget-s", type=float, default=float("inf"),
                   help="start no further seed once this many seconds have passed (default: no limit)")
    r.set_defaults(func=run)
    args = ap.parse_args()
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
