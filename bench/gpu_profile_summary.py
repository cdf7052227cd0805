"""Where a training step's time goes on the GPU: `bench/gpu_train.py --profile`, plus a summary of its
trace that the profiler's table does not give (kernels by category, the GPU's idle gaps and the
host calls that block).

    python bench/gpu_profile_summary.py OUTDIR [gpu_train.py arguments, --profile included]

Runs gpu_train's main() unchanged (its profiler: wait=--skip, warmup 1, active 5 steps) and, from
the same profiler, writes into OUTDIR:
- prof_kernels.txt: the top kernels by self device time, with a share of the kernel total;
- prof_idle.txt: per profiled step, the CPU step span, the GPU's busy time (union of kernels,
  copies and memsets) and idle time, the largest idle gaps with the CPU ops and CUDA runtime calls
  that ran in them, and the CUDA runtime calls that block the host (synchronize, D2H copies);
- trace.json.gz: the chrome trace.
Also prints dynamo's counters (graph breaks, unique graphs, recompiles).
"""

import gzip
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import bench.gpu_train as g  # noqa: E402

HOLD = {}  # the profiler gpu_train's main() creates, kept for the analysis after it returns
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class _Profile(torch.profiler.profile):
    """torch.profiler.profile as gpu_train uses it, remembering itself in HOLD."""

    def __init__(self, *a, **k):
        k.setdefault("record_shapes", False)
        super().__init__(*a, **k)
        HOLD["p"] = self


def union(intervals):
    """The union of (start, end) intervals, as sorted disjoint [start, end] pairs."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def analyse(outdir: str) -> None:
    """Write the trace, prof_kernels.txt and prof_idle.txt into `outdir`, and print the summaries."""
    prof = HOLD["p"]
    path = os.path.join(outdir, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as z:
        z.write(f.read())
    os.remove(path)
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    steps = sorted((e for e in ev if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") in
                    ("cpu_op", "user_annotation")), key=lambda e: e["ts"])
    runtime = [e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    cpu_ops = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation", "python_function")]
    lines = []
    # kernels
    by = defaultdict(lambda: [0.0, 0])
    for e in gpu:
        by[e["name"]][0] += e["dur"]
        by[e["name"]][1] += 1
    total = sum(v[0] for v in by.values())
    nsteps = max(len(steps), 1)
    klines = [f"GPU time over {len(steps)} profiled steps: {total / 1e3:.2f} ms ({total / 1e3 / nsteps:.2f} ms a step), "
              f"{sum(v[1] for v in by.values()) / nsteps:.0f} kernels/copies a step"]
    cats = defaultdict(float)
    for name, (d, n) in by.items():
        low = name.lower()
        cat = ("matmul" if any(s in low for s in ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas")) else
               "flex attention" if "flex" in low else "flash/sdpa attention" if ("flash" in low or "fmha" in low or
                                                                                "attention" in low) else
               "adam" if "adam" in low else "memcpy/memset" if ("memcpy" in low or "memset" in low) else
               "triton (compiled)" if low.startswith("triton") else "other")
        cats[cat] += d
    klines.append("by category: " + ", ".join(f"{c} {d / total:.1%} ({d / 1e3 / nsteps:.2f} ms/step)"
                                             for c, d in sorted(cats.items(), key=lambda x: -x[1])))
    klines.append(f"{'share':>7} {'ms/step':>8} {'calls/step':>10}  kernel")
    for name, (d, n) in sorted(by.items(), key=lambda x: -x[1][0])[:40]:
        klines.append(f"{d / total:7.1%} {d / 1e3 / nsteps:8.3f} {n / nsteps:10.1f}  {name[:150]}")
    with open(os.path.join(outdir, "prof_kernels.txt"), "w") as f:
        f.write("\n".join(klines) + "\n")
    print("\n".join(klines[:30]))
    # idle
    spans = union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    for i, s in enumerate(steps):
        a, b = s["ts"], s["ts"] + s["dur"]
        busy = sum(max(0.0, min(y, b) - max(x, a)) for x, y in spans)
        first = next((x for x, y in spans if y > a), None)
        lines.append(f"{s['name']}: CPU span {s['dur'] / 1e3:.2f} ms, GPU busy within it {busy / 1e3:.2f} ms, "
                     f"idle {(s['dur'] - busy) / 1e3:.2f} ms ({(s['dur'] - busy) / s['dur']:.1%}); first GPU work "
                     f"{((first - a) / 1e3) if first is not None else float('nan'):.2f} ms after the step's start")
    if steps:
        a0, b0 = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"]
        gaps = []
        inside = [(max(x, a0), min(y, b0)) for x, y in spans if y > a0 and x < b0]
        for (x1, y1), (x2, y2) in zip(inside, inside[1:]):
            if x2 - y1 > 100:
                gaps.append((x2 - y1, y1, x2))
        idle = sum(gap[0] for gap in gaps)
        lines.append(f"\nGPU gaps over 0.1 ms in the profiled steps: {len(gaps)}, {idle / 1e3:.2f} ms in all "
                     f"({idle / 1e3 / nsteps:.2f} ms a step)")
        lines.append("largest gaps (ms, offset into its step) and the host work inside them:")
        for dur, x, y in sorted(gaps, reverse=True)[:25]:
            st = next((s for s in steps if s["ts"] <= x <= s["ts"] + s["dur"]), None)
            rt = defaultdict(float)
            for e in runtime:
                o = min(e["ts"] + e["dur"], y) - max(e["ts"], x)
                if o > 20:
                    rt[e["name"]] += o
            ops = []
            for e in cpu_ops:
                if x <= e["ts"] <= y and e["dur"] > 50 and e["name"] not in ops:
                    ops.append(e["name"])
            lines.append(f"  {dur / 1e3:6.2f} ms at {((x - st['ts']) / 1e3) if st else -1:6.2f} ms of "
                         f"{st['name'] if st else '?'}; runtime: "
                         + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in sorted(rt.items(), key=lambda kv: -kv[1])[:4])
                         + "; ops: " + ", ".join(o[:60] for o in ops[:8]))
    rtot = defaultdict(lambda: [0.0, 0])
    for e in runtime:
        if steps and steps[0]["ts"] <= e["ts"] <= steps[-1]["ts"] + steps[-1]["dur"]:
            rtot[e["name"]][0] += e["dur"]
            rtot[e["name"]][1] += 1
    lines.append("\nCUDA runtime/driver calls in the profiled steps (host ms a step, calls a step):")
    for name, (d, n) in sorted(rtot.items(), key=lambda x: -x[1][0])[:15]:
        lines.append(f"  {d / 1e3 / nsteps:8.3f} {n / nsteps:8.1f}  {name}")
    ctot = defaultdict(lambda: [0.0, 0])
    for e in cpu_ops:
        if e["name"] in ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::to", "aten::copy_",
                         "aten::tolist", "aten::is_nonzero", "aten::masked_select", "aten::index", "aten::index_put_",
                         "Optimizer.step#AdamW.step", "aten::_assert_async", "Torch-Compiled Region"):
            ctot[e["name"]][0] += e["dur"]
            ctot[e["name"]][1] += 1
    lines.append("\nselected CPU ops (host ms a step, calls a step):")
    for name, (d, n) in sorted(ctot.items(), key=lambda x: -x[1][0]):
        lines.append(f"  {d / 1e3 / nsteps:8.3f} {n / nsteps:8.1f}  {name}")
    with open(os.path.join(outdir, "prof_idle.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    sys.argv = ["gpu_train.py"] + sys.argv[2:]
    torch.profiler.profile = _Profile
    g.main()
    try:
        from torch._dynamo.utils import counters
        print("dynamo counters:", json.dumps({k: dict(v) for k, v in counters.items()
                                              if k in ("graph_break", "stats", "recompiles", "frames")},
                                             default=str)[:4000])
    except ImportError as err:
        print("dynamo counters unavailable:", err)
    if "p" in HOLD:
        analyse(outdir)


if __name__ == "__main__":
    main()
