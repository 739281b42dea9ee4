"""Arrival counters of the kernels whose programs combine their work in the last one to finish (the split-K GEMM's
in-kernel fixup, a decode step's codes of a whole token): one zeroed int32 buffer per device and stream, which
every such kernel leaves zeroed again. Kernels on one stream never run at once (with PDL a kernel waits for the one
before it before it touches memory), so they share it; two streams use two buffers. :func:`last_to_arrive` and
:func:`reset_counter` are the protocol the kernels follow on them."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

N_COUNTERS = 1 << 16
_BUFFERS: dict = {}


def arrival_counters(device: torch.device) -> torch.Tensor:
    """The zeroed ``[N_COUNTERS]`` int32 counters of ``device``'s current stream, allocated at the first call (keep
    that call outside a CUDA graph capture: a warm-up step makes it)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buf = _BUFFERS.get(key)
    if buf is None:
        buf = _BUFFERS[key] = torch.zeros(N_COUNTERS, dtype=torch.int32, device=device)
    return buf



if triton is not None:

    @triton.jit
    def last_to_arrive(cnt_ptr, i, n):
        """Counts this program on counter ``i`` once every thread has stored its part (the barrier); True for the
        last of the ``n`` programs that count there, which then combines their work and calls :func:`reset_counter`."""
        tl.debug_barrier()
        return tl.atomic_add(cnt_ptr + i, 1, sem="acq_rel", scope="gpu") == n - 1

    @triton.jit
    def reset_counter(cnt_ptr, i):
        tl.atomic_xchg(cnt_ptr + i, 0, sem="relaxed", scope="gpu")  # zeroed again, for the next launch
