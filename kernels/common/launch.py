"""Triton launches with less host time than ``kernel[grid](...)``, for the eager paths (issue #14: an eager prefill
or decode step of a 1.37B model is host-bound; it makes ~300 launches, each ~25 us of Triton's host time on the
lent H200's host, a third of it spent outside the argument binding and the launcher: ``tools/launch_cost.py``).

``launch_kernel(kernel, grid, *args, **kwargs)`` does what ``kernel[grid](*args, **kwargs)`` does: Triton's own binder
specializes every argument (dtypes, 16-byte alignment, integer divisibility: what picks a compiled kernel), then
the compiled kernel is looked up in a cache of this module and its launcher called on the current stream with
Triton's launch hooks. What ``JITFunction.run`` repeats at every launch besides is skipped: reading the debug and
instrumentation knobs (environment variables), building its cache key's string of the options, the device and
pre-run-hook lookups, the check that the globals a kernel reads kept the values it was compiled with (laquant's
kernels read constants only). A key not seen yet takes ``kernel[grid]`` (which compiles as usual) and caches what
it ran. So a ``TRITON_DEBUG`` set after a kernel's first launch does not recompile that kernel here.
``LAQUANT_FAST_LAUNCH=0`` (read at import) launches through ``kernel[grid]``, as does the Triton interpreter.

Every launch asks for mul + add contracted into FMAs (``enable_fp_fusion``, :data:`FP_FUSION`) unless it says
otherwise (the delta rule's decode and verify kernels turn it off, so that the two store the same state bits). Triton
up to 3.9 contracts by default, and 3.9 warns, where a launch leaves it unset, that the default turns off in 3.10.
The kernels were written, tested and timed with FMAs (the state decode kernels are bound by instruction issue; their
offline instruction counts, ``tools/sass_mix.py``, count them), so the option is not left to Triton's default.
"""

from __future__ import annotations

import os

import torch

try:
    from triton import knobs
except ImportError:  # laquant's CPU path needs no Triton
    knobs = None

ENABLED = os.environ.get("LAQUANT_FAST_LAUNCH", "1") != "0" and knobs is not None
FP_FUSION = True  # enable_fp_fusion where a launch does not set it (see above)
_COMPILED: dict = {}  # (id(kernel), device) -> {(specialization, options): compiled kernel}


def launch_kernel(kernel, grid: tuple, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` (``grid`` a tuple of 1-3 ints), with ``enable_fp_fusion=FP_FUSION`` where
    ``kwargs`` do not set it; returns what that returns."""
    kwargs.setdefault("enable_fp_fusion", FP_FUSION)
    caches = getattr(kernel, "device_caches", None)  # a JITFunction's; the interpreter's functions have none
    if not ENABLED or caches is None:
        return kernel[grid](*args, **kwargs)
    device = torch.cuda.current_device()
    entry = caches[device]  # Triton 3.4-3.9: (kernel cache, key cache, target, backend, binder)
    if len(entry) != 5:  # another Triton's layout: its own launch path
        return kernel[grid](*args, **kwargs)
    bound, specialization, options = entry[4](*args, **kwargs)  # Triton's binder
    table = _COMPILED.get((id(kernel), device))
    if table is None:
        table = _COMPILED[(id(kernel), device)] = {}
    key = (tuple(specialization), tuple(options.items()))
    compiled = table.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        table[key] = compiled.result() if hasattr(compiled, "result") else compiled
        return compiled
    stream = torch._C._cuda_getCurrentRawStream(device)
    values = bound.values()
    n = len(grid)
    compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, compiled.function,
                 compiled.packed_metadata, compiled.launch_metadata(grid, stream, *values),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)
    return compiled
