"""The Python side of the chunked kernels' state handling (GLA and the delta rule share it):
sequence bounds, the final states a reference stores, and the state-format launch arguments."""

from __future__ import annotations

import torch

from .formats import get_format, kernel_code
from .gpus import device_name, gpu_key
from .state import State, StateQuantizer, StoreKey, quantize_state

CHUNK = 64  # state round trips and checkpoints fall on multiples of this many tokens


def sequence_bounds(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    """``(bos, eos)`` of every sequence: rows of the batch, or packed along T by ``cu_seqlens``."""
    if cu_seqlens is None:
        return [(0, q.shape[1])] * q.shape[0]
    cu = cu_seqlens.tolist()
    return list(zip(cu[:-1], cu[1:]))


def store_states(state: torch.Tensor, fmt: str, rounding: str = "nearest", seed: int = 0, position: int = 1,
                 checkpoint_subs: list[int] | None = None) -> State:
    """float32 states ``[N, H, K, V]`` stored in ``fmt`` with fresh scales (what a prefill returns),
    or checkpoints ``[N, C, H, K, V]`` (``checkpoint_subs``: the sub-store of each ``c``); stochastic
    rounding keys the bits of sequence ``n`` by ``(seed, n, position, sub)``. Its Triton twin is
    :func:`~.store.store_states_triton`."""
    if rounding == "nearest":
        return State(*quantize_state(state, fmt), fmt)
    quant = StateQuantizer(fmt, rounding=rounding)
    slots = torch.arange(state.shape[0], device=state.device)
    if checkpoint_subs is None:
        return State(*quant.store(state, key=StoreKey(seed, slots, position)), fmt)
    parts = [quant.store(state[:, c], key=StoreKey(seed, slots, position, sub)) for c, sub in enumerate(checkpoint_subs)]
    if not parts:
        return State(*quantize_state(state, fmt), fmt)
    return State(torch.stack([d for d, _ in parts], 1), torch.stack([s for _, s in parts], 1), fmt)


def store_position(initial_state: State | None, position: int | None) -> int:
    """The store count a prefill's stores are keyed by: given, or the one after ``initial_state``'s."""
    if position is not None:
        return position
    return (initial_state.n_stores if initial_state is not None else 0) + 1


def check_state_args(initial_state: State | None, final_format: str, shape: tuple, layout: str) -> None:
    """Name an unsupported format or a misshapen initial state before any work."""
    kernel_code(final_format)
    if initial_state is not None:
        if tuple(initial_state.data.shape) != shape:
            raise ValueError(f"initial_state must be {layout} = {shape}; got {tuple(initial_state.data.shape)}")
        kernel_code(initial_state.format)


def _qmax(fmt: str) -> float:
    spec = get_format(fmt)
    return spec.qmax if spec.is_scaled else 1.0


def state_io(initial_state: State | None, final: State | None, final_format: str,
             roundtrip: StateQuantizer | None, H: int, K: int, dummy: torch.Tensor, rounding: str = "nearest",
             seed: int = 0, position: int = 1) -> tuple[dict, bool]:
    """The state-format arguments both chunked kernels take: the initial state and its scales, the
    final state's buffers, the static scales of a round trip, and their format constexprs, with
    the stochastic rounding of the round trips (the round trip's quantizer) and of the final state
    and checkpoints (``rounding``), keyed by ``seed`` and ``position``. Also whether a program
    needs whole state rows (per-row scales computed in it)."""
    if rounding == "stochastic":
        StateQuantizer(final_format, rounding=rounding)  # a clear error for a format it does not apply to
    rt_code = kernel_code(roundtrip.format) if roundtrip is not None else 0
    rt_static = bool(roundtrip is not None and roundtrip.uses_static_scale)
    args = dict(
        h0_ptr=initial_state.data.contiguous() if initial_state is not None else dummy,
        h0s_ptr=initial_state.scale.contiguous() if initial_state is not None and initial_state.scale is not None
        else dummy,
        ht_ptr=final.data if final is not None else dummy,
        hts_ptr=final.scale if final is not None and final.scale is not None else dummy,
        static_ptr=roundtrip.static_scale.reshape(H, K).float().contiguous().to(dummy.device) if rt_static else dummy,
        HAS_H0=initial_state is not None, IN_FMT=kernel_code(initial_state.format) if initial_state is not None else 0,
        STORE_HT=final is not None, OUT_FMT=kernel_code(final_format), QMAX_OUT=_qmax(final_format),
        RT_FMT=rt_code, RT_STATIC=rt_static, QMAX_RT=_qmax(roundtrip.format.name) if roundtrip is not None else 1.0,
        seed=seed, position=position, RT_SR=bool(roundtrip is not None and roundtrip.stochastic),
        OUT_SR=rounding == "stochastic",
    )
    needs_rows = get_format(final_format).is_scaled or (roundtrip is not None and roundtrip.format.is_scaled
                                                        and not rt_static)
    return args, needs_rows


# (block_k, num_warps) of the decode kernels per GPU, kernel ("gla"; "delta": the delta rule's and KDA's; "ssd": the
# GLA kernel's Mamba2 mode), state format and launch size: ``(max_programs, block_k, num_warps)`` buckets, the first
# whose max_programs (sequences x heads) holds the launch, None for any more. A launch of few programs (B = 1: one a
# head) runs each over more warps and rows at once, a full one (B = 64) one warp a program walking the rows: the
# fastest at the e2e models' shapes for B = 1, 4, 16 and 64 (`python tools/sweep_kernels.py state_decode --write`,
# stochastic rounding for the 8-bit formats; eval/results/decode_buckets_h200/). Swept with one state pool, hot in L2;
# the sweep now streams the state from 24 pools by default (``--pools``), as the model's layers do. A GPU takes its
# own table of a kernel, else one swept on the same model of GPU, else the first listed (the H200's, which has every
# kernel): :func:`decode_table`. The H100's GLA table: eval/results/session21_h100/ (at B = 1-16 13-20% faster than
# the H200's launches on the H100, for some formats).
# --- generated by tools/sweep_kernels.py state_decode: begin ---
DECODE_LAUNCH = {
    "NVIDIA H200": {
        "delta": {
            "bf16": ((128, 128, 4), (512, 32, 2), (None, 64, 2)),
            "fp32": ((None, 128, 4),),
            "fp8_row": ((128, 128, 8), (512, 32, 2), (None, 16, 1)),
            "int8_row": ((128, 128, 8), (512, 32, 2), (None, 8, 1)),
        },
        "gla": {
            "bf16": ((256, 32, 2), (None, 16, 1)),
            "fp32": ((256, 32, 2), (None, 16, 1)),
            "fp8_row": ((64, 64, 4), (256, 32, 2), (None, 16, 1)),
            "int8_row": ((64, 64, 4), (256, 32, 2), (None, 16, 1)),
        },
        "ssd": {
            "bf16": ((64, 128, 4), (1024, 128, 2), (None, 64, 4)),
            "fp32": ((64, 128, 8), (256, 32, 4), (1024, 16, 1), (None, 128, 8)),
            "fp8_row": ((256, 128, 4), (1024, 32, 1), (None, 16, 1)),
            "int8_row": ((256, 128, 4), (1024, 32, 1), (None, 16, 1)),
        },
    },
    "NVIDIA H100 80GB HBM3": {
        "gla": {
            "bf16": ((16, 64, 4), (256, 64, 2), (None, 16, 2)),
            "fp32": ((256, 64, 2), (None, 32, 2)),
            "fp8_row": ((256, 64, 4), (None, 16, 2)),
            "int8_row": ((256, 64, 4), (None, 16, 1)),
        },
    },
}
# --- generated by tools/sweep_kernels.py state_decode: end ---


def bucket_of(buckets: tuple, programs: int) -> tuple:
    """The first ``(max_programs, *launch)`` bucket holding ``programs``."""
    for bucket in buckets:
        if bucket[0] is None or programs <= bucket[0]:
            return tuple(bucket)
    raise ValueError(f"the launch table's buckets end at {buckets[-1][0]} programs without a catch-all (None) entry")


def bucket_launch(buckets: tuple, programs: int) -> tuple:
    """The launch of the first ``(max_programs, *launch)`` bucket holding ``programs``: ``launch``, e.g.
    ``(block_k, num_warps)``."""
    return bucket_of(buckets, programs)[1:]


# Launches re-chosen inside a graphed decode step (tools/sweep_step_tiles.py --write), where they made the whole step
# >= 1% faster than DECODE_LAUNCH's (swept alone), per GPU: ``{device name: {(kernel, format, max_programs):
# (block_k, num_warps)}}``, for that bucket of DECODE_LAUNCH, on that GPU or one of the same model (a GPU not listed
# takes those of the GPU whose table it takes, as they were chosen against that table: the H200's for any GPU but the
# H100, and on the CPU). GLA's int8 entry on the H200 came with DECODE_PREFETCH's (tools/probe_decode_prefetch.py,
# eval/results/decode_prefetch_h200/): 8-row blocks, each next one loaded ahead. Alone with the state in L2 (as the
# sweeps time it) 4% slower than the table's 16-row blocks; streamed from device memory, as in the model's step, 5%
# faster, and the 1.37B GLA's graphed B = 64 step 2.6-3.3% faster. 16-row blocks loaded ahead spill; two blocks ahead
# is slower. On the H100 the table's 16-row blocks loaded ahead are faster alone (10.9 against 11.8 us) and in the
# step (1,514 against 1,569 us; the GLA's e2e 1.60x -> 1.70x bf16 at B = 64), so it has no GLA entry; the delta rule's
# 16-row blocks, the H200's entry, were re-chosen there (eval/results/session21_h100/).
# --- generated by tools/sweep_step_tiles.py: begin ---
STEP_DECODE_LAUNCH: dict = {
    'NVIDIA H100 80GB HBM3': {
        ('delta', 'int8_row', None): (16, 1),
    },
    'NVIDIA H200': {
        ('delta', 'int8_row', None): (16, 1),
        ('gla', 'int8_row', None): (8, 1),
    },
}
# --- generated by tools/sweep_step_tiles.py: end ---


# Buckets whose decode walk loads the next block of state rows before this block's arithmetic (the GLA kernel's
# ``PREFETCH``, its SSD mode's too): ``(kernel, format, max_programs)`` of DECODE_LAUNCH's buckets. Loaded after the
# block's stores, as the plain walk does, a block's loads wait out their device-memory latency: ptxas keeps loads after
# stores that may alias them. At B = 64 with the state streamed from device memory (eval/results/decode_prefetch_h200/):
# GLA 10.9 -> 10.4 us a layer (8-row blocks), SSD 38.7 -> 33.0 us (16-row blocks). The delta rule's walk gained nothing
# (48.7 -> 49.4-51.7 us, qwen3_next's e2e 2% slower; not kept, run4_delta_ssd/delta_prefetch.patch).
PREFETCHING_KERNELS = ("gla", "ssd")
DECODE_PREFETCH: set = {("gla", "int8_row", None), ("ssd", "int8_row", None)}


def _table_gpu(kernel: str, gpu: str | None) -> str:
    """The key of :data:`DECODE_LAUNCH` whose table of ``kernel`` the GPU named ``gpu`` takes."""
    tables = {name: kernels for name, kernels in DECODE_LAUNCH.items() if kernel in kernels}
    if not tables:
        raise KeyError(f"no decode launch table for kernel {kernel!r} (those with one: "
                       f"{sorted({k for kernels in DECODE_LAUNCH.values() for k in kernels})})")
    return gpu_key(gpu, tables, first_otherwise=True)


def decode_table(kernel: str, gpu: str | None = None) -> dict:
    """``kernel``'s :data:`DECODE_LAUNCH` table (``{format: buckets}``) for the GPU named ``gpu`` (a CUDA device's
    name; None: none named): its own, else one of the same model of GPU, else the first GPU's that has the kernel."""
    return DECODE_LAUNCH[_table_gpu(kernel, gpu)][kernel]


def _decode_bucket(kernel: str, fmt: str, programs: int, gpu: str | None) -> tuple[tuple, tuple]:
    """``((kernel, format, max_programs), launch)``: the bucket of ``gpu``'s DECODE_LAUNCH table holding ``programs``
    (a format the sweep left out takes fp32's), the key the overlays (STEP_DECODE_LAUNCH, DECODE_PREFETCH) name it
    by."""
    formats = decode_table(kernel, gpu)
    fmt = fmt if fmt in formats else "fp32"
    bound, *launch = bucket_of(formats[fmt], programs)
    return (kernel, fmt, bound), tuple(launch)


def decode_prefetch(kernel: str, fmt: str, programs: int, gpu: str | None = None) -> bool:
    """Whether ``kernel``'s decode walk over ``programs`` programs on the GPU named ``gpu`` loads each next block
    ahead (:data:`DECODE_PREFETCH`)."""
    return _decode_bucket(kernel, fmt, programs, gpu)[0] in DECODE_PREFETCH


def step_launches(kernel: str, gpu: str | None) -> dict:
    """:data:`STEP_DECODE_LAUNCH`'s launches for ``kernel`` on the GPU named ``gpu`` (a CUDA device's name; None:
    none named): its own or its model's, else those of the GPU whose table of ``kernel`` it takes (chosen against that
    table), ``{}`` where that GPU has none."""
    return {k: launch for k, launch in STEP_DECODE_LAUNCH.get(_step_gpu(kernel, gpu), {}).items() if k[0] == kernel}


def _step_gpu(kernel: str, gpu: str | None) -> str:
    key = gpu_key(gpu, STEP_DECODE_LAUNCH, first_otherwise=False)
    return key if key is not None else _table_gpu(kernel, gpu)


def own_step_overlay(gpu: str) -> tuple[str, bool]:
    """The key of the :data:`STEP_DECODE_LAUNCH` entry that a tool re-choosing launches on the GPU named ``gpu``
    edits (``tools/sweep_step_tiles.py``, ``tools/probe_decode_prefetch.py``): its own or its model's; where it has
    none, a new one under its name, holding every launch it takes today (another GPU's), so that it loses none. And
    whether the entry was made here."""
    key = gpu_key(gpu, STEP_DECODE_LAUNCH, first_otherwise=False)
    if key is not None:
        return key, False
    kernels = {k[0] for launches in STEP_DECODE_LAUNCH.values() for k in launches}
    STEP_DECODE_LAUNCH[gpu] = {k: launch for kernel in sorted(kernels)
                               for k, launch in step_launches(kernel, gpu).items()}
    return gpu, True


def decode_launch(kernel: str, fmt: str, programs: int, gpu: str | None = None) -> tuple[int, int]:
    """The table's ``(block_k, num_warps)`` for ``kernel``'s decode step in state format ``fmt`` over ``programs``
    programs on the GPU named ``gpu`` (:func:`step_launches`' where it has that bucket); a format the sweep left out
    takes fp32's."""
    key, launch = _decode_bucket(kernel, fmt, programs, gpu)
    return STEP_DECODE_LAUNCH.get(_step_gpu(kernel, gpu), {}).get(key, launch)


def tabled_decode_launches(kernel: str, fmt: str) -> set:
    """Every ``(block_k, num_warps)`` the tables of every GPU hold for ``kernel`` and ``fmt``, STEP_DECODE_LAUNCH's
    included."""
    return ({tuple(launch) for kernels in DECODE_LAUNCH.values() for _, *launch in kernels.get(kernel, {}).get(fmt, ())}
            | {launch for launches in STEP_DECODE_LAUNCH.values()
               for (k, f, _), launch in launches.items() if (k, f) == (kernel, fmt)})


# (block_k, block_v, num_warps, prefetch) of the verify kernels per kernel (GLA's, the delta rule's), step ("verify";
# "commit": the same kernel storing the state instead of the outputs; a verify step keeping every token's state
# stores like a commit and takes the commit's entry), state format and launch size, in buckets as DECODE_LAUNCH's:
# ``(max_programs, block_k, block_v, num_warps, prefetch)``. block_k None is the whole K (the delta rule sums k^T S
# over it in one block), block_v None the whole V (forced for the scaled formats, whose row scale spans the row);
# prefetch: the next token's inputs load during this token's arithmetic (more registers). "verify_prefill": the verify
# step with numerics "prefill", its own kernels running the tokens as one chunk (the whole K a program, V in blocks of
# at least 16, no prefetch; eval/results/verify_chunk_h200/). The fastest at the e2e models' shapes, 4 tokens
# (`python tools/sweep_kernels.py verify --write`, stochastic rounding for the 8-bit formats): the catch-alls at
# B = 64, the small buckets at B = 1 and 8 (eval/results/decode_buckets_h200/).
# --- generated by tools/sweep_kernels.py verify: begin ---
# NVIDIA H200
VERIFY_LAUNCH = {
    "gla": {
        "verify": {
            "fp32": ((128, 64, 16, 1, 1), (None, 32, 32, 1, 1)),
            "bf16": ((None, 32, 32, 1, 1),),
            "fp8_row": ((None, 8, None, 1, 1),),
            "int8_row": ((128, 64, None, 4, 1), (None, 8, None, 1, 1)),
        },
        "commit": {
            "fp32": ((16, 64, 32, 2, 1), (128, 64, 16, 2, 1), (None, 8, 64, 1, 0)),
            "bf16": ((None, 32, 64, 2, 0),),
            "fp8_row": ((None, 32, None, 4, 1),),
            "int8_row": ((128, 64, None, 8, 1), (None, 32, None, 4, 1)),
        },
        "verify_prefill": {
            "bf16": ((128, None, 128, 4, 0), (None, None, 128, 2, 0)),
            "fp8_row": ((16, None, 32, 2, 0), (128, None, 128, 4, 0), (None, None, 128, 2, 0)),
            "int8_row": ((16, None, 32, 2, 0), (128, None, 64, 2, 0), (None, None, 128, 2, 0)),
            "fp32": ((16, None, 32, 2, 0), (128, None, 64, 2, 0), (None, None, 128, 2, 0)),
        },
    },
    "delta": {
        "verify": {
            "fp32": ((256, None, 8, 1, 1), (None, None, 16, 2, 1)),
            "bf16": ((None, None, 8, 1, 1),),
            "fp8_row": ((None, None, None, 8, 1),),
            "int8_row": ((None, None, None, 8, 0),),
        },
        "commit": {
            "fp32": ((None, None, 32, 4, 1),),
            "bf16": ((None, None, 32, 4, 1),),
            "fp8_row": ((None, None, None, 8, 1),),
            "int8_row": ((None, None, None, 8, 0),),
        },
        "verify_prefill": {
            "bf16": ((32, None, 64, 8, 0), (None, None, 128, 4, 0)),
            "fp8_row": ((32, None, 64, 8, 0), (None, None, 128, 4, 0)),
            "int8_row": ((32, None, 32, 8, 0), (None, None, 128, 4, 0)),
            "fp32": ((32, None, 32, 4, 0), (None, None, 128, 4, 0)),
        },
    },
}
# --- generated by tools/sweep_kernels.py verify: end ---


def verify_launch(kernel: str, step: str, fmt: str, programs: int) -> tuple:
    """The table's ``(block_k, block_v, num_warps, prefetch)`` for ``kernel``'s verify ``step`` (``"verify"``,
    ``"commit"``, or ``"verify_prefill"``: a verify step with ``numerics="prefill"``, no store between the tokens) in
    state format ``fmt`` over ``programs`` programs (sequences x heads); a format the sweep left out takes fp32's, a
    step it left out the fp32 verify step's."""
    steps = VERIFY_LAUNCH[kernel]
    formats = steps.get(step, steps["verify"])
    return bucket_launch(formats.get(fmt, formats.get("fp32", steps["verify"]["fp32"])), programs)


def pool_args(state: torch.Tensor, scale: torch.Tensor | None, pool_idx: torch.Tensor,
              n_stores: torch.Tensor | None, quantizer: StateQuantizer, H: int, K: int,
              block_k: int | None, num_warps: int | None,
              kernel: str = "gla", prefetch: bool | None = None) -> tuple[tuple, tuple, dict, int]:
    """What the decode kernels take for a state pool ``state`` ``[P, H, K, V]`` (per-row ``scale``
    ``[P, H, K]``): its pointers (state, scales, slots, store counts, static scales), its strides,
    the format constexprs with ``BLOCK_K`` (and ``PREFETCH`` where the walk loads ahead), and ``num_warps``
    (defaults: :func:`decode_launch` for one program per sequence and head on the state's GPU, and
    :data:`DECODE_PREFETCH`)."""
    fmt = quantizer.format
    code = kernel_code(fmt)
    if state.stride(-1) != 1 or (scale is not None and scale.stride(-1) != 1):
        raise ValueError("state and scale pools must be contiguous in their last dimension")
    if fmt.is_scaled and quantizer.renorm_interval > 1 and n_stores is None:
        raise ValueError("renorm_interval > 1 needs the per-slot store counts n_stores")
    if quantizer.stochastic and n_stores is None:
        raise ValueError("stochastic rounding needs the per-slot store counts n_stores (its random bits' counter)")
    gpu = device_name(state.device)
    default_k, default_warps = decode_launch(kernel, fmt.name, pool_idx.numel() * H, gpu)
    scale_t = scale if scale is not None else state
    static = (quantizer.static_scale.reshape(H, K).float().contiguous().to(state.device)
              if quantizer.uses_static_scale else scale_t)
    ptrs = (state, scale_t, pool_idx, n_stores if n_stores is not None else pool_idx, static)
    strides = (state.stride(0), state.stride(1), state.stride(2), scale_t.stride(0),
               scale_t.stride(1) if scale is not None else 0)
    consts = dict(FMT=code, RENORM=quantizer.renorm_interval, QMAX=fmt.qmax if fmt.is_scaled else 1.0,
                  SR=quantizer.stochastic,
                  BLOCK_K=min(block_k or default_k, 1 << (K - 1).bit_length()))
    if prefetch and kernel not in PREFETCHING_KERNELS:
        raise ValueError(f"{kernel}'s decode kernel has no prefetching walk (those that do: "
                         f"{', '.join(PREFETCHING_KERNELS)})")
    if prefetch is None:
        prefetch = kernel in PREFETCHING_KERNELS and decode_prefetch(kernel, fmt.name, pool_idx.numel() * H, gpu)
    if prefetch:
        consts["PREFETCH"] = True
    return ptrs, strides, consts, num_warps or default_warps
