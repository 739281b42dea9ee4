"""Triton kernel: the prompt lookup of :func:`.reference.ngram_lookup_reference` in one launch.

One program per row walks the context in blocks, computes at each position ``e`` for how many tokens
(up to ``MAX_N``) the tokens ending there equal the sequence's last ones, keeps the best key
``m * L + e`` (the longest match, then the latest), and gathers the ``K`` proposals. Integer work only:
the same proposals as the reference. A round of speculative decoding at B = 1 is a chain of small
launches, and the reference's ~35 tensor ops were a tenth of a gla-small round.
"""

from __future__ import annotations

import torch

from ..common.dispatch import use_triton
from ..common.launch import launch_kernel
from ..common.sizes import next_power_of_2
from .reference import ngram_lookup_reference

try:
    import triton
    import triton.language as tl
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

BLOCK = 1024


if triton is not None:

    @triton.jit
    def _ngram_lookup_kernel(ctx_ptr, len_ptr, out_ptr, L, s_cb, s_ob, K: tl.constexpr, BLOCK_K: tl.constexpr,
                             MAX_N: tl.constexpr, MIN_N: tl.constexpr, BLOCK: tl.constexpr):
        row = ctx_ptr + tl.program_id(0).to(tl.int64) * s_cb
        length = tl.load(len_ptr).to(tl.int64)
        best = tl.full([BLOCK], -1, tl.int64)
        for e0 in range(0, L, BLOCK):
            e = e0 + tl.arange(0, BLOCK).to(tl.int64)
            valid = e <= length - 2  # a match needs a token after it
            alive = valid  # still matching, comparing from the right
            m = tl.zeros([BLOCK], dtype=tl.int64)
            for i in tl.static_range(MAX_N):  # context[e - i] against the sequence's token length - 1 - i
                t = tl.where(length - 1 - i >= 0, tl.load(row + tl.maximum(length - 1 - i, 0)), -2)  # -2: no token
                c = tl.load(row + e - i, mask=alive & (e >= i), other=-1)
                alive = alive & (c == t)
                m += alive.to(tl.int64)
            best = tl.maximum(best, tl.where((m >= MIN_N) & valid, m * L + e, -1))
        key = tl.max(best, axis=0)
        end = key % L
        period = tl.maximum(length - 1 - end, 1)
        j = tl.arange(0, BLOCK_K)
        fallback = tl.minimum(tl.maximum(length - 1, 0), L - 1)
        src = tl.where(key >= 0, end + 1 + j % period, fallback)
        tl.store(out_ptr + tl.program_id(0).to(tl.int64) * s_ob + j, tl.load(row + src, mask=j < K), mask=j < K)


def ngram_lookup_triton(context: torch.Tensor, length: torch.Tensor, k: int, max_ngram: int = 3,
                        min_ngram: int = 1) -> torch.Tensor:
    """:func:`.reference.ngram_lookup_reference` as one Triton launch (``context`` int64 ``[B, L]`` with
    its last dimension contiguous, ``length`` an int64 device scalar)."""
    if triton is None:
        raise RuntimeError("Triton is not installed; use ngram_lookup_reference")
    if context.dtype != torch.long or context.stride(-1) != 1:
        raise ValueError("the lookup takes an int64 context [B, L] contiguous in its last dimension")
    B, L = context.shape
    out = torch.empty(B, k, dtype=torch.long, device=context.device)
    if B and k:
        launch_kernel(_ngram_lookup_kernel, (B,),
            context, length.reshape(1).to(torch.long), out, L, context.stride(0), out.stride(0),
            K=k, BLOCK_K=max(16, next_power_of_2(k)), MAX_N=max_ngram,
            MIN_N=min_ngram, BLOCK=min(BLOCK, max(16, next_power_of_2(L))),
            num_warps=4)
    return out


def ngram_lookup(context: torch.Tensor, length: torch.Tensor, k: int, max_ngram: int = 3,
                 min_ngram: int = 1) -> torch.Tensor:
    """The lookup: the kernel on CUDA, the reference elsewhere (``LAQUANT_KERNELS=reference`` too)."""
    if use_triton(context) and context.stride(-1) == 1:
        return ngram_lookup_triton(context, length, k, max_ngram, min_ngram)
    return ngram_lookup_reference(context, length, k, max_ngram, min_ngram)
