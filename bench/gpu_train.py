"""The trainer at frontier shape: tokens/s, MFU, data-wait share and peak memory per phase.

    python bench/gpu_train.py [--model 124m|small] [--shapes 1024:16,4096:4,32768:2] [--steps 30]
                              [--skip 5] [--workers 0] [--attention auto] [--compile] [--checkpointing]
                              [--peak-tflops 989] [--profile] [--workdir /tmp/refinery-bench-gpu]

Each shape SEQ_LEN:MICRO_BATCH is one run of the trainer itself (`Trainer.train`, its CUDA path: bf16
autocast, training.attention, the per-step loader) on a one-phase synthetic curriculum
(`synthetic/curriculum.py`: two buckets of random-token documents of 2,000 tokens on average, cut into
windows of SEQ_LEN) of exactly `--steps` steps of MICRO_BATCH rows. The first `--skip` steps (kernel
autotuning, compilation, the page cache) are left out; figures are over the rest:

- tokens/s: rows x SEQ_LEN / median step time (`time/step_s`, which includes the data wait);
- MFU: tokens/s x FLOPs per token / `--peak-tflops` (H100 SXM bf16 dense: 989). FLOPs per token:
  6 N (N every parameter once; the tied embedding is the LM head's matmul) + 6 L T d for causal
  attention (QK^T and AV, forward and backward, half the pairs); document masking skips more
  pairs, which this does not credit; `mfu_6n` beside it counts 6 N alone;
- data wait: sum of `time/data_wait_s` / sum of `time/step_s`;
- peak memory: torch.cuda.max_memory_allocated over the run.

`--model small` is the 2-layer, 256-wide model whose fast steps expose loader stalls.

Without CUDA the script says so and runs a CPU smoke instead (exit 0): a 2-layer, 64-wide model at
seq_len 128 and 512 through the same trainer path (sdpa), and the size and build time of the flex
block mask against the dense mask it replaces, for 2 rows of 32K tokens.
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from refinery.config import load_config  # noqa: E402
from training.attention import document_block_mask  # noqa: E402
from synthetic.curriculum import SyntheticBucket, SyntheticPhase, synthetic_config, write_synthetic_curriculum  # noqa: E402
from training.trainer import RunOptions, Trainer  # noqa: E402

MODELS = {"124m": {"n_layer": 12, "n_head": 12, "n_embd": 768}, "small": {"n_layer": 2, "n_head": 4, "n_embd": 256},
          "cpu-smoke": {"n_layer": 2, "n_head": 2, "n_embd": 64}}
VOCAB = 50304  # GPT-2's vocabulary padded to a multiple of 128
MEAN_DOC_TOKENS = 2000
SHARES = {"web": 0.7, "code": 0.3}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        seq_len, _, micro = item.partition(":")
        if not seq_len.isdigit() or not micro.isdigit():
            raise SystemExit(f"--shapes {text!r}: each item is SEQ_LEN:MICRO_BATCH, e.g. 32768:2")
        shapes.append((int(seq_len), int(micro)))
    return shapes


def write_run(workdir: Path, seq_len: int, micro: int, steps: int, model: dict, training: dict) -> Path:
    """A one-phase synthetic curriculum of exactly `steps` steps and its config; returns the config path."""
    if workdir.exists():
        shutil.rmtree(workdir)
    tokens = steps * micro * seq_len
    buckets = {name: SyntheticBucket(docs=max(8, int(tokens * share / MEAN_DOC_TOKENS / 2) + 8), mean_len=MEAN_DOC_TOKENS,
                                     max_epochs=4.0) for name, share in SHARES.items()}
    phases = [SyntheticPhase(f"len{seq_len}", tokens, dict(SHARES), seq_len=seq_len)]
    write_synthetic_curriculum(workdir / "root", buckets, phases, vocab=VOCAB, window=seq_len, overlap=0)
    cfg = {"micro_batch_size": micro, "grad_accum_steps": 1, "warmup_steps": 2, "checkpoint_interval": 10**9,
           "keep_last": 1, "model": {**model, "vocab_size": VOCAB}, **training}
    return synthetic_config(workdir / "run.yaml", workdir / "root", buckets, phases, cfg,
                            shards={"max_seq_len": seq_len, "overlap": 0})


def flops_per_token(trainer: Trainer, seq_len: int) -> float:
    args = trainer.model_args
    n_params = sum(p.numel() for p in trainer.model.parameters())  # the tied embedding counted once
    return 6.0 * n_params + 6.0 * args.n_layer * seq_len * args.n_embd


def run_shape(workdir: Path, seq_len: int, micro: int, args, training: dict) -> dict:
    config = write_run(workdir, seq_len, micro, args.steps, MODELS[args.model], training)
    gc.collect()  # the previous shape's trainer (the optimizer hook makes a reference cycle)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    profiler = None
    if args.profile and torch.cuda.is_available():
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                          schedule=torch.profiler.schedule(wait=args.skip, warmup=1, active=5, repeat=1))
        profiler.start()
    trainer = Trainer(load_config(config), RunOptions(resume="never", num_workers=args.workers,
                                                      sinks=[lambda record: profiler.step()] if profiler else []))
    status = trainer.train()
    if profiler:
        profiler.stop()
        print(profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.profile_rows,
                                            max_name_column_width=90), flush=True)
    if status["state"] != "completed":
        raise SystemExit(f"seq_len {seq_len}: the run ended {status['state']}: {status.get('reason')}")
    timed = trainer.metrics.read()[args.skip:]
    step_s = statistics.median(m["time/step_s"] for m in timed)
    tokens_per_s = micro * seq_len / step_s
    out = {
        "seq_len": seq_len, "micro_batch": micro, "steps_timed": len(timed),
        "attention": trainer.model.attention, "device": str(trainer.device),
        "tokens_per_s": round(tokens_per_s), "median_step_s": round(step_s, 5),
        "data_wait_share": round(sum(m["time/data_wait_s"] for m in timed) / sum(m["time/step_s"] for m in timed), 5),
        "final_loss": round(timed[-1]["loss/total"], 4),
    }
    if trainer.device.type == "cuda":
        out["mfu"] = round(tokens_per_s * flops_per_token(trainer, seq_len) / (args.peak_tflops * 1e12), 4)
        n_params = sum(p.numel() for p in trainer.model.parameters())
        out["mfu_6n"] = round(tokens_per_s * 6.0 * n_params / (args.peak_tflops * 1e12), 4)
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def block_mask_footprint(rows: int = 2, seq_len: int = 32768, repeats: int = 3) -> dict:
    """The flex block mask for packed rows of 2,000-token documents, against the dense mask's size."""
    doc_ids = (torch.arange(seq_len) // MEAN_DOC_TOKENS).repeat(rows, 1).to(torch.int32)
    times, mask = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        mask = document_block_mask(doc_ids)
        times.append(time.perf_counter() - t0)
    block_bytes = sum(t.numel() * t.element_size() for t in (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
                                                              mask.full_kv_indices, mask.q_num_blocks, mask.q_indices,
                                                              mask.full_q_num_blocks, mask.full_q_indices))
    return {"rows": rows, "seq_len": seq_len, "block_mask_bytes": block_bytes, "dense_mask_bytes": rows * seq_len * seq_len,
            "block_mask_build_s_median": round(statistics.median(times), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("124m", "small"), default="124m")
    ap.add_argument("--shapes", default="1024:16,4096:4,32768:2", help="SEQ_LEN:MICRO_BATCH,...")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the figures")
    ap.add_argument("--workers", type=int, default=0, help="loader worker processes (training.num_workers)")
    ap.add_argument("--attention", choices=("auto", "sdpa", "flex"), default="auto")
    ap.add_argument("--compile", action="store_true", help="training.compile: torch.compile each block")
    ap.add_argument("--checkpointing", action="store_true", help="training.activation_checkpointing")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100 SXM: 989)")
    ap.add_argument("--profile", action="store_true",
                    help="print the kernels by self CUDA time over 5 steps after --skip (torch.profiler)")
    ap.add_argument("--profile-rows", type=int, default=25)
    ap.add_argument("--workdir", default="/tmp/refinery-bench-gpu")
    args = ap.parse_args()
    if args.skip >= args.steps:
        raise SystemExit(f"--skip {args.skip} leaves none of --steps {args.steps} to time")
    training = {"attention": args.attention, "compile": args.compile, "activation_checkpointing": args.checkpointing}
    shapes = parse_shapes(args.shapes)
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU figures (tokens/s, MFU, data wait at 1K/4K/32K for the 124M GPT) need one; "
              "running the CPU smoke instead")
        args.model, shapes = "cpu-smoke", [(128, 4), (512, 2)]
        args.steps, args.skip = min(args.steps, 12), min(args.skip, 2)
        training = {**training, "attention": "sdpa", "cpu_threads": 1}
    for seq_len, micro in shapes:
        print(json.dumps({"model": args.model, **run_shape(Path(args.workdir) / f"len{seq_len}", seq_len, micro, args,
                                                            training)}), flush=True)
    if not torch.cuda.is_available():
        print(json.dumps(block_mask_footprint()), flush=True)


if __name__ == "__main__":
    main()
