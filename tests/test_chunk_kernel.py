"""The Triton chunked-prefill kernel against its PyTorch reference (GPU, or CPU under TRITON_INTERPRET=1)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.quant import State, StateFormat, StateQuantizer

triton = require_triton_kernels()
from laquant.kernels.gla.chunk import chunk_gla_reference, chunk_gla_triton  # noqa: E402

# The interpreter's bf16 tl.dot returns garbage and its fp8 casts misround (see test_decode_kernel):
# interpreted runs use float32 inputs and allow fp8 round trips to drift.
DTYPES = [torch.float32] if INTERPRETED else [torch.float32, torch.bfloat16]


def _inputs(B, T, H, K, V, dtype, scalar=False, decay=4.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    g = F.logsigmoid(r(B, T, H) if scalar else r(B, T, H, K)) / decay
    return [x.to(DEVICE, dtype) for x in (q, k, v)] + [g.to(DEVICE)]


def _tol(dtype, quantized=None):
    if dtype == torch.bfloat16:
        return 2e-2
    if quantized and quantized.startswith("fp8") and INTERPRETED:
        return 0.1  # a misrounded element is off by a binade; the GPU run of this test is strict
    return 2e-3 if quantized else 1e-5


def _check(out, ref, tol):
    (o, final, ck), (o_ref, final_ref, ck_ref) = out, ref
    assert torch.isfinite(o.float()).all()  # every element written (the output was poisoned)
    assert rel_err(o.float(), o_ref.float()) < tol
    if final_ref is not None:
        assert final.data.dtype == final_ref.data.dtype
        assert rel_err(final.load(), final_ref.load()) < tol
    if ck_ref is not None:
        assert ck.data.shape == ck_ref.data.shape
        assert rel_err(ck.load(), ck_ref.load()) < tol


def _run(args, kwargs, **launch):
    poisoned = torch.full_like(args[2], float("nan"))
    return chunk_gla_triton(*args, out=poisoned, **kwargs, **launch), chunk_gla_reference(*args, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,K,V", [(2, 150, 2, 16, 32), (1, 64, 1, 32, 16), (3, 37, 2, 24, 40), (1, 1, 1, 16, 16)])
def test_prefill_matches_reference(dtype, B, T, H, K, V):
    out, ref = _run(_inputs(B, T, H, K, V, dtype), dict(output_final_state=True))
    _check(out, ref, _tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_decay(dtype):
    """A per-head decay (Lightning attention, Mamba2's SSD) with strong forgetting."""
    out, ref = _run(_inputs(2, 200, 2, 16, 32, dtype, scalar=True, decay=0.3), dict(output_final_state=True))
    _check(out, ref, _tol(dtype))


def test_strong_per_channel_decay():
    """Per-token log-decays down to about -8 per channel: the split exponents must not overflow."""
    out, ref = _run(_inputs(1, 130, 2, 16, 16, torch.float32, decay=0.5), dict(output_final_state=True))
    _check(out, ref, 1e-5)


@pytest.mark.parametrize("in_fmt", ["fp32", "bf16", "fp8_row", "int8_row"])
@pytest.mark.parametrize("out_fmt", ["fp32", "bf16", "fp8_row", "int8_row"])
def test_state_formats_in_and_out(in_fmt, out_fmt):
    q, k, v, g = _inputs(2, 100, 2, 16, 32, torch.float32, seed=1)
    data, scale = StateQuantizer(in_fmt).store(torch.randn(2, 2, 16, 32, device=DEVICE))
    h0 = State(data, scale, in_fmt)
    out, ref = _run((q, k, v, g), dict(initial_state=h0, output_final_state=True, final_format=out_fmt))
    # the final state is re-quantized: only rounding-boundary flips may differ, by one step
    _check(out, ref, _tol(torch.float32, out_fmt if out_fmt != "fp32" else None) * 5)


@pytest.mark.parametrize("block_t", [16, 32, 64])
@pytest.mark.parametrize("block_v", [None, 16])
def test_launch_parameters_do_not_change_the_result(block_t, block_v):
    q, k, v, g = _inputs(2, 150, 2, 16, 32, torch.float32, seed=6)
    out, ref = _run((q, k, v, g), dict(output_final_state=True), block_t=block_t, block_v=block_v)
    _check(out, ref, 1e-5)


def test_large_heads_split_v():
    """K = 256, V = 512 (a 2048-wide GLA with 4 heads): the state tile is capped (MAX_STATE_TILE) and V
    split across programs, which on an H100 is what fits shared memory; the same numbers."""
    from laquant.kernels.gla.chunk import MAX_STATE_TILE

    assert 256 * 512 > MAX_STATE_TILE
    q, k, v, g = _inputs(1, 70, 1, 256, 512, torch.float32, seed=7)
    out, ref = _run((q, k, v, g), dict(output_final_state=True))
    _check(out, ref, 1e-5)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_row_formats_past_the_state_tile(monkeypatch, rounding):
    """Whole rows of a head too large for one program (K = 256, V = 512 at the real limit; here the limit
    is lowered): the kernel writes float32 states split over V and they are stored afterwards, keyed as
    the kernel's own stores; a checkpoint past its sequence's end stays zero with scale 1."""
    import laquant.kernels.gla.chunk as chunk

    q, k, v, g = _inputs(1, 300, 2, 16, 32, torch.float32, seed=3)
    cu = torch.tensor([0, 37, 37, 200, 300], dtype=torch.int32, device=DEVICE)
    args = dict(output_final_state=True, final_format="int8_row", cu_seqlens=cu, checkpoint_every=64,
                rounding=rounding, seed=5)
    whole = chunk_gla_triton(q, k, v, g, **args)
    monkeypatch.setattr(chunk, "MAX_STATE_TILE", 256)
    split = chunk_gla_triton(q, k, v, g, **args)
    assert rel_err(split[0], whole[0]) < 1e-6
    for a, b in ((split[1], whole[1]), (split[2], whole[2])):
        assert a.data.shape == b.data.shape and a.scale.shape == b.scale.shape
        assert rel_err(a.scale, b.scale) < 1e-5
        diff = (a.data.float() - b.data.float()).abs()
        assert (diff > 0).float().mean() < 0.005 and diff.max() <= 1  # x / scale against x * (1 / scale)
    assert torch.equal(split[2].scale[1], torch.ones_like(split[2].scale[1]))  # an empty sequence: no checkpoint
    assert not torch.equal(split[2].data[2], torch.zeros_like(split[2].data[2]))
    with pytest.raises(ValueError, match="prefill_roundtrip false"):
        chunk_gla_triton(q, k, v, g, output_final_state=True, roundtrip=StateQuantizer("int8_row"), cu_seqlens=cu)


@pytest.mark.parametrize("block_t", [16, 64])
@pytest.mark.parametrize("fmt,renorm", [("bf16", 1), ("fp8_row", 1), ("int8_row", 1), ("int8_row", 0), ("fp8_row", 0)])
def test_state_roundtrip_every_64_tokens(fmt, renorm, block_t):
    """The state stored in ``fmt`` every 64 tokens inside the prefill, as the model's recipe sets it."""
    q, k, v, g = _inputs(2, 200, 2, 16, 32, torch.float32, seed=2)
    static = torch.full((1, 2, 16, 1), 0.05 / StateFormat(fmt).qmax) if renorm == 0 else None
    quant = StateQuantizer(fmt, renorm, static)
    out, ref = _run((q, k, v, g), dict(output_final_state=True, roundtrip=quant), block_t=block_t)
    _check(out, ref, _tol(torch.float32, fmt))


@pytest.mark.parametrize("fmt", ["fp32", "fp8_row"])
def test_varlen_and_checkpoints(fmt):
    q, k, v, g = _inputs(1, 300, 2, 16, 32, torch.float32, seed=3)
    cu = torch.tensor([0, 37, 37, 200, 300], dtype=torch.int32, device=DEVICE)
    out, ref = _run((q, k, v, g), dict(output_final_state=True, final_format=fmt, cu_seqlens=cu, checkpoint_every=64))
    assert out[2].data.shape == (4, 2, 2, 16, 32)  # the longest sequence (163 tokens) has 2 checkpoints
    _check(out, ref, _tol(torch.float32, fmt if fmt != "fp32" else None))


@pytest.mark.parametrize("segments", [1, 3])
@pytest.mark.parametrize("scalar", [False, True])
def test_float32_products_on_the_tensor_cores(scalar, segments):
    """``fp32_dots="tf32x3"`` (what Mamba2's float32 scan runs with): float32 inputs multiplied as three TF32
    products, float32's accuracy against the exact reference (as one piece and sequence-parallel)."""
    q, k, v, g = _inputs(2, 300, 2, 32, 16, torch.float32, scalar=scalar, decay=0.5, seed=3)
    out, ref = _run((q, k, v, g), dict(output_final_state=True), segments=segments, fp32_dots="tf32x3")
    _check(out, ref, 5e-5)
    with pytest.raises(ValueError, match="fp32_dots must be one of ieee, tf32x3; got 'tf32'"):
        chunk_gla_triton(q, k, v, g, fp32_dots="tf32")


@pytest.mark.parametrize("scalar", [False, True])
@pytest.mark.parametrize("segments,T", [(3, 700), (2, 256), (5, 300)])
def test_sequence_parallel_segments(scalar, segments, T):
    """Long sequences split into pieces run in parallel, chained by a scan of their final states."""
    q, k, v, g = _inputs(2, T, 2, 16, 32, torch.float32, scalar=scalar, seed=7)
    data, _ = StateQuantizer("fp32").store(torch.randn(2, 2, 16, 32, device=DEVICE))
    h0 = State(data, None, "fp32")
    out, ref = _run((q, k, v, g), dict(initial_state=h0, output_final_state=True, final_format="bf16"),
                    segments=segments)
    _check(out, ref, 5e-5)  # the scan multiplies decays summed in another order


@pytest.mark.parametrize("T", [300, 256])
@pytest.mark.parametrize("fmt,rounding", [("fp32", "nearest"), ("int8_row", "stochastic")])
def test_segments_with_checkpoints(T, fmt, rounding):
    """With checkpoints the pieces are checkpoint_every tokens long and their chained start states are
    the checkpoints (a prefix cache's snapshots at B = 1 on a GPU take this path)."""
    q, k, v, g = _inputs(2, T, 2, 16, 32, torch.float32, seed=8)
    kw = dict(output_final_state=True, final_format=fmt, checkpoint_every=64, rounding=rounding, seed=3)
    out, ref = _run((q, k, v, g), kw, segments=2)
    assert out[2].data.shape == (2, T // 64, 2, 16, 32)
    _check(out, ref, _tol(torch.float32, fmt if fmt != "fp32" else None))


def test_segments_refuse_sequential_state_formats():
    q, k, v, g = _inputs(1, 300, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="segments"):
        chunk_gla_triton(q, k, v, g, roundtrip=StateQuantizer("fp8_row"), segments=2)


def test_non_contiguous_inputs():
    q, k, v, g = _inputs(2, 70, 2, 16, 16, torch.float32, seed=4)
    qt = torch.empty(2, 2, 70, 16, device=DEVICE).transpose(1, 2)
    qt.copy_(q)
    assert not qt.is_contiguous()
    out = chunk_gla_triton(qt, k, v, g, output_final_state=True)
    _check(out, chunk_gla_reference(q, k, v, g, output_final_state=True), 1e-5)


def test_bad_shapes_are_named():
    q, k, v, g = _inputs(1, 10, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="checkpoint_every"):
        chunk_gla_triton(q, k, v, g, checkpoint_every=10)
    with pytest.raises(ValueError, match=r"g \(1, 10, 1, 8\)"):
        chunk_gla_triton(q, k, v, g[..., :8])
    with pytest.raises(ValueError, match="fp8_head"):
        chunk_gla_triton(q, k, v, g, final_format="fp8_head", output_final_state=True)


@pytest.mark.gpu
@pytest.mark.parametrize("B,T", [(1, 65536), (64, 1000)])
def test_long_and_wide_on_gpu(B, T):
    """Model-sized heads (K = V = 128): a 64K-token sequence and a large batch, in bf16."""
    q, k, v, g = _inputs(B, T, 2, 128, 128, torch.bfloat16, seed=5)
    out, ref = _run((q, k, v, g), dict(output_final_state=True, roundtrip=StateQuantizer("fp8_row")))
    _check(out, ref, 3e-2)


def test_piece_bounds_made_once_per_shape():
    """The sequence-parallel prefill's piece boundaries (cu_seqlens of the pieces): their values, and one
    tensor per shape kept across calls (they cost eight small kernels a layer when made at every call)."""
    from laquant.kernels.gla.chunk import _piece_bounds

    cu = _piece_bounds(2, 300, 128, torch.device("cpu"))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 128, 256, 300, 428, 556, 600]
    assert _piece_bounds(2, 300, 128, torch.device("cpu")) is cu
    assert _piece_bounds(1, 300, 128, torch.device("cpu")).tolist() == [0, 128, 256, 300]
