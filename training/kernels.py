"""Functions that run torch.compile'd on CUDA: compiled once per function and reused, left to an
enclosing compile (which fuses them into its graph) and run eagerly on CPU (the tests' path). The
flex attention kernel (training/attention.py) and the loss kernels (training/loss.py) go through here.
"""

from __future__ import annotations

import torch

_compiled: dict = {}


def cuda_kernel(fn, device: torch.device, **compile_options):
    """`fn` torch.compile'd once for CUDA; `fn` itself inside an enclosing compile (which fuses it)
    and on CPU (eager, for tests)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        return fn
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, **compile_options)
    return _compiled[fn]
