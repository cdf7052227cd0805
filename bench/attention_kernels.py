"""Document-masked attention kernels compared at the 124M model's shape: forward, and forward +
backward, per kernel path, on CUDA.

    python bench/attention_kernels.py [--rows 4] [--seq-len 4096] [--reps 20] [--autotune] [--sweep]

Rows of packed documents with geometric lengths of mean 2,000 (as synthetic/curriculum.py draws them),
12 heads of 64, bf16. Each path runs forward and backward of one attention call; the time is the
median over --reps of CUDA-event-timed calls after warm-up. Paths:
- flex: FlexAttention with training.attention's document_block_mask (the trainer's CUDA path);
- flex-autotune (--autotune): the same compiled with mode="max-autotune-no-cudagraphs";
- varlen: torch.nn.attention.varlen.varlen_attn (flash) over cu_seqlens, causal;
- sdpa-dense: scaled_dot_product_attention with the dense B x 1 x T x T document mask;
- sdpa-causal: plain causal flash attention, no document mask (a ceiling, not the same maths).
Outputs are compared with sdpa-dense (relative L2 error of the forward output). FLOP/s count only
the pairs document masking keeps (4 d per pair forward, 14 d forward + backward; sdpa-causal does more pairs than it is credited).
`--sweep` also times FlexAttention under other kernel_options (tile sizes, stages, warps) and prints
the best that stays within 5e-3 of the dense reference."""

import argparse
import inspect
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention  # noqa: E402

from training.attention import dense_document_mask, document_block_mask  # noqa: E402


def layout(rows: int, T: int, mean: int, rng) -> tuple[torch.Tensor, np.ndarray]:
    """Per-token doc ids (rows, T) of documents with geometric lengths, and their cu_seqlens."""
    doc_ids = np.zeros((rows, T), dtype=np.int32)
    cu = [0]
    for r in range(rows):
        pos, d = 0, 0
        while pos < T:
            n = min(int(max(2, rng.geometric(1.0 / mean))), T - pos)
            doc_ids[r, pos:pos + n] = d
            pos += n
            d += 1
            cu.append(r * T + pos)
    return torch.from_numpy(doc_ids), np.array(cu, dtype=np.int32)


def timed(fn, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` CUDA-event-timed calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--skip-dense", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="FlexAttention kernel_options variants; prints the best")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention_kernels.py compares CUDA kernels; no CUDA device here")
    dev = torch.device("cuda")
    B, T, H, D = args.rows, args.seq_len, args.heads, args.head_dim
    doc_ids_cpu, cu_np = layout(B, T, 2000, np.random.default_rng(0))
    lens = np.diff(cu_np)
    pairs = float(sum(int(n) * (int(n) + 1) // 2 for n in lens)) * H
    doc_ids = doc_ids_cpu.to(dev)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    go = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
    results = {"rows": B, "seq_len": T, "docs": int(len(lens)), "mean_doc": float(lens.mean()),
               "kept_pair_share": pairs / (B * H * T * (T + 1) / 2)}
    ref = None
    if not args.skip_dense:
        mask = dense_document_mask(doc_ids)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()

    def report(name, fwd, build=None):
        try:
            t0 = time.perf_counter()
            out = fwd()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            err = None if ref is None else float((out.float() - ref).norm() / ref.norm())

            def fb():
                q.grad = k.grad = v.grad = None
                fwd().backward(go)
            f_ms = timed(fwd, args.reps)
            fb_ms = timed(fb, args.reps)
            row = {"fwd_ms": round(f_ms, 3), "fwd_bwd_ms": round(fb_ms, 3),
                   "fwd_tflops": round(pairs * 4 * D / f_ms / 1e9, 1),
                   "fwd_bwd_tflops": round(pairs * 14 * D / fb_ms / 1e9, 1),
                   "rel_err_vs_dense": err, "first_call_s": round(first, 1)}
            if build is not None:
                row["mask_build_ms"] = round(timed(build, args.reps), 3)
            results[name] = row
        except Exception as err:  # noqa: BLE001
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        print(name, json.dumps(results[name]), flush=True)

    flex_c = torch.compile(flex_attention, dynamic=False)
    bm = document_block_mask(doc_ids)
    report("flex", lambda: flex_c(q, k, v, block_mask=bm), build=lambda: document_block_mask(doc_ids))
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
        cu = torch.from_numpy(cu_np).to(dev)
        mx = int(lens.max())
        kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        results["varlen_signature"] = str(inspect.signature(varlen_attn))

        def var():
            qq, kk, vv = (t.transpose(1, 2).reshape(B * T, H, D) for t in (q, k, v))
            return varlen_attn(qq, kk, vv, cu, cu, mx, mx, **kw).view(B, T, H, D).transpose(1, 2)
        report("varlen", var)

        def var_T():
            qq, kk, vv = (t.transpose(1, 2).reshape(B * T, H, D) for t in (q, k, v))
            return varlen_attn(qq, kk, vv, cu, cu, T, T, **kw).view(B, T, H, D).transpose(1, 2)
        report("varlen-maxT", var_T)
    except ImportError as err:
        results["varlen"] = {"error": f"ImportError: {err}"}
        print("varlen", results["varlen"], flush=True)
    if not args.skip_dense:
        report("sdpa-dense", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
               build=lambda: dense_document_mask(doc_ids))
    report("sdpa-causal", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    if args.sweep:
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        base = results["flex"].get("fwd_bwd_ms")
        variants = {
            "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
            "bwd_64_64_64_64_s3_w4": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 64,
                                      "bwd_num_stages": 3, "bwd_num_warps": 4},
            "bwd_32_128_128_32_s3_w4": {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 32,
                                        "bwd_num_stages": 3, "bwd_num_warps": 4},
            "bwd_64_128_128_64_s3_w4": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
                                        "bwd_num_stages": 3, "bwd_num_warps": 4},
            "bwd_64_128_128_64_s2_w8": {"bwd_BLOCK_M1": 64, "bwd_BLOCK_N1": 128, "bwd_BLOCK_M2": 128, "bwd_BLOCK_N2": 64,
                                        "bwd_num_stages": 2, "bwd_num_warps": 8},
            "fwd_128_64_s3_w4": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_stages": 3, "fwd_num_warps": 4},
            "fwd_tma": {"fwd_USE_TMA": True},
        }
        for name, opts in variants.items():
            report(f"flex[{name}]", lambda o=opts: flex_c(q, k, v, block_mask=bm, kernel_options=o))
        ok = {n: results[f"flex[{n}]"] for n in variants if "fwd_bwd_ms" in results[f"flex[{n}]"]
              and (results[f"flex[{n}]"]["rel_err_vs_dense"] or 0.0) < 5e-3}
        best: dict = {}
        fwd_base = results["flex"].get("fwd_ms")
        bwd = [n for n in ok if n.startswith("bwd_") or n == "rows_safe"]
        if bwd and base:
            pick = min(bwd, key=lambda n: ok[n]["fwd_bwd_ms"])
            if ok[pick]["fwd_bwd_ms"] < 0.97 * base:
                best.update(variants[pick])
        fwd = [n for n in ok if n.startswith("fwd_")]
        if fwd and fwd_base:
            pick = min(fwd, key=lambda n: ok[n]["fwd_ms"])
            if ok[pick]["fwd_ms"] < 0.97 * fwd_base:
                best.update(variants[pick])
        results["best_flex_options"] = best
        print("BEST_FLEX_OPTIONS " + json.dumps(best), flush=True)
    if args.autotune:
        flex_a = torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
        report("flex-autotune", lambda: flex_a(q, k, v, block_mask=bm))
    print("ATTN " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
