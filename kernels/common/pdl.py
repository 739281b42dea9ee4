"""Programmatic dependent launch (PDL, Hopper and newer) for the kernels of the decode step.

A decode step is a chain of a few hundred small kernels, each of which spends microseconds on
being scheduled and ramping up while the GPU drains the kernel before it. Launched with PDL, a
kernel's programs may start while the previous kernel in the stream is still running; they then
wait (``gdc_wait``) until that kernel has finished and its writes are visible, before they read
anything it may write. What it cannot write they load before the wait, so that its device-memory
latency overlaps that kernel's tail: parameters (the GEMMs' column scales, bias and outlier weights,
the norms' and gates' weights) and, where the caller says so (``early_state``), the decode kernels'
first block of state rows (``eval/results/param_prefetch_h200/``). (A first version also prefetched
the int8 GEMMs' whole weight slices into L2 before the wait: on an H100 it made the B = 64 decode
step 8% slower, its GEMMs 29% slower; removed.)

Every kernel launched with PDL here calls ``gdc_wait`` before ``gdc_launch_dependents``, so at
most one kernel runs ahead and, when it starts, every kernel before its predecessor has finished.
Kernels launched without it (PyTorch's, cuBLAS) serialize as usual. The split-K GEMM and the decode
kernels release the next kernel after their main loop (:func:`pdl_release`) in launches of more than
:data:`PDL_EARLY_ROWS` tokens, at their start in smaller ones; the short kernels at their start
(:func:`pdl_prologue`).

Measured with a 24-layer 1.37B GLA, gla_int8_all, a CUDA graph per step: with every kernel releasing at
its start, PDL gave +8% tokens/s at B = 1 and -3% at B = 64 on an H100 (``eval/results/speed_h100_e2e_pdl.md``),
+4.6% at B = 64 on an H200; with the GEMM and decode kernels releasing after their loop, +8.6% at B = 64 on
the H200 in the same run (the qwen3_next hybrid's hybrid_int8 +4.2%; ``eval/results/pdl_release_h200/``).
So launches of at most :data:`PDL_MAX_ROWS` tokens (the decode sizes, where the split-K GEMM runs) use
it, prefill's larger ones do not. ``LAQUANT_PDL=0`` turns it off, ``LAQUANT_PDL=all`` on for every size (for
benchmarks). It is off on the CPU, under the Triton interpreter, before sm_90, and with a Triton
that has no ``gdc_wait`` / ``launch_pdl``.
"""

from __future__ import annotations

import functools
import os

import torch

from .env import getenv

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    if triton is None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda as tl_cuda
    except ImportError:
        return False
    return hasattr(tl_cuda, "gdc_wait") and "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.lru_cache(maxsize=None)
def _device_has_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


PDL_MAX_ROWS = 256
# up to this many tokens the looped kernels too release the next kernel at their start (B = 1: a wave
# of a few programs, where the earlier start measured better)
PDL_EARLY_ROWS = 16


def pdl_enabled(device: torch.device, rows: int) -> bool:
    """Whether a launch over ``rows`` tokens (or sequences) on ``device`` uses PDL (the env switch
    is read at each launch)."""
    mode = getenv("LAQUANT_PDL", "1")
    if device.type != "cuda" or mode == "0" or (rows > PDL_MAX_ROWS and mode != "all") or not _triton_has_pdl():
        return False
    return _device_has_pdl(device.index if device.index is not None else torch.cuda.current_device())


def pdl_launch(device: torch.device, rows: int) -> dict:
    """Keyword arguments for a kernel launch: its ``PDL`` constexpr (0: off; 1: on, the next kernel
    released at the start; 2: on, released after the main loop by kernels that have one) and, when on,
    ``launch_pdl``."""
    if not pdl_enabled(device, rows):
        return {"PDL": 0}
    return {"PDL": 1 if rows <= PDL_EARLY_ROWS else 2, "launch_pdl": True}


if triton is not None:

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """Wait until the previous kernel has finished and its writes are visible; with ``PDL == 1``
        then let the next kernel start (a no-op without ``PDL``). Kernels with a main loop call it
        first and :func:`pdl_release` after the loop."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        if PDL == 1:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_release(PDL: tl.constexpr):
        """With ``PDL == 2``, let the next kernel's programs start (they wait in their own wait). Called
        after a kernel's main loop, its programs are all running or done when the next kernel's take SM
        slots."""
        if PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_prologue(PDL: tl.constexpr):
        """Wait for the previous kernel, then let the next one start (a no-op without ``PDL``): the
        kernels without a main loop."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
