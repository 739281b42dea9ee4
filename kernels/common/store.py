"""Float32 states stored in a per-row 8-bit format by one Triton kernel: the store a prefill ends with
(its final state, and its checkpoints for the prefix cache).

The references are :meth:`StateQuantizer.store_state <laquant.kernels.common.state.StateQuantizer.store_state>`
(:func:`store_state_triton`) and :func:`~laquant.kernels.common.state_io.store_states`
(:func:`store_states_triton`, also checkpoints): fresh per-row scales, or
scales that only grow over the previous ones between renormalisations, or the calibrated static ones;
stochastic rounding keyed by the seed, the batch row, the store count and the sub-store. Run as
PyTorch ops on the GPU, a stochastic store was ~165 kernel launches and two host synchronisations per
layer (Philox alone is ~100 elementwise ops), which made a quantized model's short prefill host-bound:
a 64-token prefill of a 1.37B GLA took 162 ms of wall time for 7.9 ms of GPU time
(``eval/results/serve_1b_h200/profile_prefill_h200.json``).

Codes are computed as the decode kernels compute them (``x * (1 / scale)``, see
``triton_numerics.encode_state``), so they may differ from the reference's by one step where
``x / scale`` lies within an ulp of a rounding boundary.
"""

from __future__ import annotations

import torch

from .formats import kernel_code
from .launch import launch_kernel
from .sizes import cdiv, next_power_of_2
from .state import State, StateQuantizer
from .state_io import store_states

try:
    import triton
    import triton.language as tl

    from .triton_numerics import state_random_bytes, store_state_rows, stored_row_scale
except ImportError:  # laquant's CPU path needs no Triton
    triton = None

TILE = 8192  # elements of a program's [BLOCK_K, V] tile: whole rows (one scale per row), a few K rows each


def can_store(quantizer: StateQuantizer) -> bool:
    """Whether :func:`store_rows_triton` stores this quantizer's format (the kernels' per-row 8-bit
    formats; the plain ones are a cast, the others take the reference)."""
    return triton is not None and quantizer.format.is_scaled and kernel_code(quantizer.format) is not None


if triton is not None:

    @triton.jit
    def _store_states_kernel(h_ptr, data_ptr, scale_ptr, old_ptr, static_ptr, C, seed, position, sub_step, renorm_now,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, FMT: tl.constexpr,
                             RENORM: tl.constexpr, QMAX: tl.constexpr, SR: tl.constexpr):
        pid = tl.program_id(0)  # (n * C + c) * H + h over states [N, C, H, K, V]
        h = pid % H
        n = pid // H // C
        c = pid // H % C
        offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        offs_v = tl.arange(0, BLOCK_V)
        mask_k = offs_k < K
        mask = mask_k[:, None] & (offs_v < V)[None, :]
        rows = pid.to(tl.int64) * K + offs_k
        tile = rows[:, None] * V + offs_v[None, :]
        st = tl.load(h_ptr + tile, mask=mask, other=0.0)
        old = tl.full([BLOCK_K], 1.0, tl.float32)
        if RENORM > 1:
            old = tl.load(old_ptr + rows, mask=mask_k, other=1.0)
        scale = stored_row_scale(st, old, static_ptr + h * K + offs_k, mask_k, renorm_now != 0, RENORM, QMAX)
        rbits = 0
        if SR:
            rbits = state_random_bytes(seed, n, position, (c + 1) * sub_step, h, offs_k, 0, K, V, BLOCK_K, BLOCK_V)
        store_state_rows(st, data_ptr + tile, scale_ptr + rows, mask_k, mask, scale, FMT, SR, rbits, RENORM > 0)


def store_rows_triton(state: torch.Tensor, quantizer: StateQuantizer, position: int, seed: int = 0,
                      prev_scale: torch.Tensor | None = None, subs: list[int] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale)`` of float32 ``state`` ``[N, H, K, V]`` stored by ``quantizer`` as store
    ``position`` of each sequence (batch row ``n`` is slot ``n``), or of checkpoints ``[N, C, H, K, V]``
    with the sub-stores ``subs`` (``(c + 1) * step``, as a prefill's). ``prev_scale`` ``[N, H, K]``:
    the scales the previous store left (with ``renorm_interval > 1`` they only grow, except at every
    ``renorm_interval``-th store). ``scale`` is ``[..., K, 1]``, as :meth:`StateQuantizer.store`'s."""
    if not can_store(quantizer):
        raise ValueError(f"store_rows_triton stores the kernels' per-row 8-bit formats, not {quantizer.format.name!r}")
    checkpoints = subs is not None
    if state.dim() != (5 if checkpoints else 4):
        raise ValueError(f"expected states [N, H, K, V] (checkpoints: [N, C, H, K, V] with subs); got {tuple(state.shape)}")
    *lead, H, K, V = state.shape
    C = state.shape[1] if checkpoints else 1
    if checkpoints and (len(subs) != C or any(s != (c + 1) * subs[0] for c, s in enumerate(subs))):
        raise ValueError(f"checkpoint sub-stores must be (c + 1) * step for c < {C}; got {subs}")
    renorm = quantizer.renorm_interval
    if renorm > 1 and prev_scale is not None and checkpoints:
        raise ValueError("checkpoints are stored with fresh scales (no previous scale)")
    fmt = quantizer.format
    state = state.float().contiguous()
    data = torch.empty(state.shape, dtype=fmt.storage_dtype, device=state.device)
    scale = torch.empty(*state.shape[:-1], 1, dtype=torch.float32, device=state.device)
    old = prev_scale.reshape(*lead, H, K).float().contiguous() if renorm > 1 and prev_scale is not None else scale
    static = (quantizer.static_scale.reshape(H, K).float().contiguous().to(state.device)
              if quantizer.uses_static_scale else scale)
    renorm_now = prev_scale is None or renorm <= 1 or position % renorm == 0
    BLOCK_V = next_power_of_2(V)
    BLOCK_K = min(next_power_of_2(K), max(1, TILE // BLOCK_V))
    sub_step = subs[0] if checkpoints and C else 0  # a final state: sub-store 0
    if state.numel():
        launch_kernel(_store_states_kernel, (state.numel() // (K * V), cdiv(K, BLOCK_K)),
            state, data, scale, old, static, C, seed, position, sub_step, int(renorm_now),
            H=H, K=K, V=V, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, FMT=kernel_code(fmt), RENORM=renorm, QMAX=fmt.qmax,
            SR=quantizer.stochastic, num_warps=4)
    return data, scale


def store_state_triton(quantizer: StateQuantizer, state: torch.Tensor, prev: State | None = None,
                       seed: int = 0) -> State:
    """:meth:`StateQuantizer.store_state` on the GPU: ``state`` ``[B, H, K, V]`` stored as the next
    store after ``prev`` (None: the first); the plain and non-kernel formats take the reference."""
    if not can_store(quantizer):
        return quantizer.store_state(state, prev, seed)
    n_stores = prev.n_stores + 1 if prev is not None else 1
    prev_scale = prev.row_scale if prev is not None else None
    data, scale = store_rows_triton(state, quantizer, n_stores, seed, prev_scale)
    return State(data, scale, quantizer.format.name, n_stores)


def store_states_triton(state: torch.Tensor, fmt: str, rounding: str = "nearest", seed: int = 0, position: int = 1,
                        checkpoint_subs: list[int] | None = None) -> State:
    """:func:`~laquant.kernels.common.state_io.store_states` (a prefill's final states ``[N, H, K, V]``
    or checkpoints ``[N, C, H, K, V]``, fresh scales) on the GPU; the plain and non-kernel formats, and
    no checkpoints at all, take the reference."""
    quant = StateQuantizer(fmt, rounding=rounding)
    if not can_store(quant) or (checkpoint_subs is not None and not checkpoint_subs):
        return store_states(state, fmt, rounding, seed, position, checkpoint_subs)
    return State(*store_rows_triton(state, quant, position, seed, subs=checkpoint_subs), fmt)
