"""The Triton decode-step kernel against its PyTorch reference (GPU, or CPU under TRITON_INTERPRET=1)."""

import pytest
import torch
import torch.nn as nn

from conftest import DEVICE, INTERPRETED, greedy_decode_steps, rel_err, require_triton_kernels
from laquant.quant import StateFormat, StateQuantizer

triton = require_triton_kernels()
from laquant.kernels.gla.decode import gla_decode_step, gla_decode_step_reference  # noqa: E402

# Triton's CPU interpreter (3.9) converts fp32 -> fp8 e4m3 wrongly when mantissa rounding carries into
# the next binade (31.9 -> 16.0, 7.99 -> 4.0) and truncates fp32 -> bf16 despite rtne; the GPU's
# conversions are exact. Interpreted runs therefore allow those elements to differ.

def _case(B, H, K, V, P, fmt, renorm=1, in_dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(B * 1000 + K + V)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, g = r(B, H, K), r(B, H, K), torch.nn.functional.logsigmoid(r(B, H, K)) / 4
    v = r(B, H, V)
    full = r(P, H, K, V) * torch.logspace(-2, 1, K).view(1, 1, K, 1)
    static = (full.abs().amax((0, -1)) * 1.5 / StateFormat(fmt).qmax).unsqueeze(-1) if renorm == 0 else None
    quant = StateQuantizer(fmt, renorm, static)
    data, scale = quant.store(full)
    if scale is not None:
        scale = scale.squeeze(-1).expand(P, H, K).contiguous()
    idx = torch.randperm(P, generator=gen)[:B].to(torch.int32)
    n_stores = torch.randint(0, 5, (P,), generator=gen, dtype=torch.int32)
    to = lambda t: None if t is None else t.to(DEVICE)
    inputs = [to(x.to(in_dtype)) for x in (q, k, v, g)]
    return inputs, to(data), to(scale), to(idx), quant, to(n_stores)


@pytest.mark.parametrize("fmt,renorm", [("fp32", 1), ("bf16", 1), ("fp8_row", 1), ("fp8_row", 3), ("fp8_row", 0),
                                        ("int8_row", 1), ("int8_row", 3), ("int8_row", 0)])
@pytest.mark.parametrize("B,H,K,V,P", [(3, 2, 32, 24, 5), (1, 1, 16, 16, 1), (4, 3, 20, 40, 9)])
def test_decode_kernel_matches_reference(fmt, renorm, B, H, K, V, P):
    (q, k, v, g), data, scale, idx, quant, n_stores = _case(B, H, K, V, P, fmt, renorm)
    data_ref, scale_ref = data.clone(), None if scale is None else scale.clone()
    o_ref = gla_decode_step_reference(q, k, v, g, data_ref, scale_ref, idx, quant, n_stores)
    poisoned = torch.full_like(o_ref, float("nan"))
    o = gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, out=poisoned)
    assert torch.isfinite(o.float()).all()  # every output element written
    assert rel_err(o.float(), o_ref.float()) < 1e-2  # bf16 output
    untouched = torch.ones(data.shape[0], dtype=torch.bool)
    untouched[idx.long()] = False
    assert torch.equal(data[untouched].float(), data_ref[untouched].float())  # other slots unchanged
    if scale is not None:
        assert rel_err(scale, scale_ref) < 1e-5  # per-row scales from the same absmax
    new, ref = data[idx.long()].float(), data_ref[idx.long()].float()
    mismatched = (new != ref).float().mean().item()
    if fmt == "fp32":
        assert rel_err(new, ref) < 1e-6
    elif fmt == "int8_row":  # exact rounding in both; only rounding-boundary flips from FMAs may differ, by one step
        assert mismatched < 0.005 and (new - ref).abs().max() <= 1
    elif INTERPRETED:
        assert mismatched < (0.1 if fmt == "fp8_row" else 0.7)
        if fmt == "bf16":
            assert ((new - ref).abs() <= ref.abs() * 2**-7).all()  # truncation: at most one bf16 ulp
    else:
        assert mismatched < 0.005  # only rounding-boundary flips from fused multiply-adds


def test_decode_launch_table_is_well_formed():
    """Every GPU's table has fp32 and the 8-bit formats of each kernel it lists, each a run of buckets with growing
    bounds ending in a catch-all, and the first GPU has every kernel; the lookup takes the first bucket holding the
    launch, and an unlisted format takes fp32's."""
    from laquant.kernels.common.state_io import DECODE_LAUNCH, bucket_launch, decode_launch

    assert set(next(iter(DECODE_LAUNCH.values()))) == {"gla", "delta", "ssd"}
    for gpu, kernels in DECODE_LAUNCH.items():
        assert gpu.startswith("NVIDIA ") and set(kernels) <= {"gla", "delta", "ssd"}, gpu
        for kernel, formats in kernels.items():
            assert {"fp32", "int8_row", "fp8_row"} <= set(formats), (gpu, kernel)
            for buckets in formats.values():
                bounds = [b[0] for b in buckets]
                assert bounds[-1] is None and None not in bounds[:-1] and bounds[:-1] == sorted(set(bounds[:-1]))
                assert all(bk & (bk - 1) == 0 and w in (1, 2, 4, 8) for _, bk, w in buckets)
    table = ((16, 64, 4), (256, 32, 2), (None, 16, 1))
    assert [bucket_launch(table, p) for p in (1, 16, 17, 256, 257, 10**6)] == [(64, 4)] * 2 + [(32, 2)] * 2 + [(16, 1)] * 2
    with pytest.raises(ValueError, match="catch-all"):
        bucket_launch(((16, 64, 4),), 17)
    assert decode_launch("gla", "not_a_format", 1) == decode_launch("gla", "fp32", 1)


def test_decode_table_is_the_gpus_own_else_the_same_model_else_the_first(monkeypatch):
    """A GPU takes its own table of a kernel, else one of the same model of GPU, else the first GPU's that has the
    kernel; the launch, the walk ahead (DECODE_PREFETCH) and the launches tested follow it."""
    from laquant.kernels.common import state_io

    first = {"gla": {"fp32": ((None, 16, 1),), "int8_row": ((16, 64, 4), (None, 16, 1))},
             "delta": {"fp32": ((None, 128, 4),), "int8_row": ((None, 8, 1),)}}
    monkeypatch.setattr(state_io, "DECODE_LAUNCH", {"NVIDIA X200": first, "NVIDIA X100 80GB HBM3": {
        "gla": {"fp32": ((None, 32, 2),), "int8_row": ((256, 64, 4), (None, 8, 2))}}})
    monkeypatch.setattr(state_io, "STEP_DECODE_LAUNCH", {})
    monkeypatch.setattr(state_io, "DECODE_PREFETCH", {("gla", "int8_row", 256)})
    x100 = "NVIDIA X100 80GB HBM3"
    assert [state_io.decode_launch("gla", "int8_row", p, x100) for p in (16, 256, 257)] == [(64, 4), (64, 4), (8, 2)]
    assert state_io.decode_launch("gla", "int8_row", 256, "NVIDIA X100 PCIe") == (64, 4)  # the same model of GPU
    for other in ("NVIDIA X200", "NVIDIA Z9", None):  # the first GPU's table
        assert [state_io.decode_launch("gla", "int8_row", p, other) for p in (16, 256)] == [(64, 4), (16, 1)]
        assert not state_io.decode_prefetch("gla", "int8_row", 256, other)
    assert state_io.decode_prefetch("gla", "int8_row", 256, x100)
    assert state_io.decode_launch("delta", "int8_row", 10**6, x100) == (8, 1)  # no delta table of its own: the first
    assert state_io.tabled_decode_launches("gla", "int8_row") == {(64, 4), (16, 1), (8, 2)}
    with pytest.raises(KeyError, match="no decode launch table for kernel 'ssd'"):
        state_io.decode_launch("ssd", "int8_row", 1)


def test_step_decode_launch_replaces_one_bucket_on_its_gpu(monkeypatch):
    """STEP_DECODE_LAUNCH (launches chosen inside the decode step, per GPU) replaces the launch of one bucket of one
    kernel and format on that GPU and on one of the same model; a GPU without an overlay takes that of the GPU whose
    table it takes (chosen against that table), none where that GPU has none; the committed entries name existing
    buckets with valid launches."""
    from laquant.kernels.common import state_io

    for gpu, launches in state_io.STEP_DECODE_LAUNCH.items():
        assert gpu.startswith("NVIDIA ") and launches, gpu
        for (kernel, fmt, bound), (bk, w) in launches.items():
            assert bound in [b[0] for b in state_io.decode_table(kernel, gpu)[fmt]]
            assert bk & (bk - 1) == 0 and w in (1, 2, 4, 8)
    gla = {"fp32": ((16, 64, 4), (None, 16, 1)), "int8_row": ((16, 64, 4), (None, 16, 1))}
    monkeypatch.setattr(state_io, "DECODE_LAUNCH", {"NVIDIA X200": {"gla": gla, "delta": gla},
                                                    "NVIDIA X300": {"gla": gla}})
    monkeypatch.setattr(state_io, "STEP_DECODE_LAUNCH", {
        "NVIDIA X100 80GB HBM3": {("gla", "int8_row", None): (8, 2)},
        "NVIDIA X200": {("gla", "int8_row", None): (32, 4), ("delta", "int8_row", None): (8, 1)}})
    x100 = "NVIDIA X100 80GB HBM3"
    assert [state_io.decode_launch("gla", "int8_row", p, x100) for p in (16, 17, 1024)] == [(64, 4), (8, 2), (8, 2)]
    assert state_io.decode_launch("gla", "int8_row", 1024, "NVIDIA X100 PCIe") == (8, 2)  # the same model of GPU
    for other in ("NVIDIA X200", "NVIDIA Z9", None):  # its own; a GPU not listed and no GPU take the first table's
        assert state_io.decode_launch("gla", "int8_row", 1024, other) == (32, 4)
    assert state_io.decode_launch("gla", "int8_row", 1024, "NVIDIA X300") == (16, 1)  # its own table, no overlay
    assert state_io.decode_launch("delta", "int8_row", 1024, "NVIDIA X300") == (8, 1)  # X200's table: its overlay
    assert state_io.decode_launch("gla", "fp32", 1024, x100) == (16, 1)
    assert state_io.decode_launch("gla", "bf16", 1024, x100) == (16, 1)  # unlisted: fp32's, not the int8 overlay
    assert state_io.tabled_decode_launches("gla", "int8_row") == {(64, 4), (16, 1), (8, 2), (32, 4)}
    assert state_io.own_step_overlay("NVIDIA X100 PCIe") == (x100, False)  # its model's, left as it is
    assert state_io.STEP_DECODE_LAUNCH[x100] == {("gla", "int8_row", None): (8, 2)}
    assert state_io.own_step_overlay("NVIDIA X300") == ("NVIDIA X300", True)  # made, with what it took
    assert state_io.STEP_DECODE_LAUNCH["NVIDIA X300"] == {("delta", "int8_row", None): (8, 1)}
    assert state_io.own_step_overlay("NVIDIA Z9") == ("NVIDIA Z9", True)
    assert state_io.STEP_DECODE_LAUNCH["NVIDIA Z9"] == state_io.STEP_DECODE_LAUNCH["NVIDIA X200"]


def test_pool_args_take_the_launch_of_the_states_gpu(monkeypatch):
    """The decode kernels' default launch is the one :func:`decode_launch` gives for the GPU holding the state pool
    (here a pool on the CPU named as a listed GPU)."""
    from laquant.kernels.common import state_io

    monkeypatch.setattr(state_io, "STEP_DECODE_LAUNCH", {"NVIDIA X100": {("gla", "int8_row", None): (8, 2)}})
    quant = StateQuantizer("int8_row")
    data, scale = quant.store(torch.randn(64, 16, 64, 8))
    scale = scale.squeeze(-1).contiguous()
    idx = torch.arange(64, dtype=torch.int32)
    args = (data, scale, idx, torch.zeros(64, dtype=torch.int32), quant, 16, 64, None, None)
    table = state_io.decode_launch("gla", "int8_row", 64 * 16)
    assert table != (8, 2)
    _, _, consts, warps = state_io.pool_args(*args)
    assert (consts["BLOCK_K"], warps) == table
    monkeypatch.setattr(state_io, "device_name", lambda device: "NVIDIA X100")
    _, _, consts, warps = state_io.pool_args(*args)
    assert (consts["BLOCK_K"], warps) == (8, 2)


def test_decode_prefetch_names_buckets_and_reaches_the_launch(monkeypatch):
    """DECODE_PREFETCH's entries name existing buckets of the kernels with the prefetching walk, and the launch
    arguments carry PREFETCH for those buckets alone."""
    from laquant.kernels.common import state_io

    for kernel, fmt, bound in state_io.DECODE_PREFETCH:
        assert kernel in state_io.PREFETCHING_KERNELS
        assert all(bound in [b[0] for b in kernels[kernel][fmt]] for kernels in state_io.DECODE_LAUNCH.values()
                   if kernel in kernels)  # a bucket of every GPU's table
    monkeypatch.setattr(state_io, "DECODE_PREFETCH", {("gla", "int8_row", None), ("delta", "int8_row", None)})
    quant = StateQuantizer("int8_row")
    data, scale = quant.store(torch.randn(64, 16, 16, 8))
    scale = scale.squeeze(-1).contiguous()
    for B, kernel, expected in ((64, "gla", True), (2, "gla", False), (64, "ssd", False), (64, "delta", False)):
        consts = state_io.pool_args(data, scale, torch.arange(B, dtype=torch.int32), None, quant, 16, 16, None, None,
                                    kernel)[2]
        assert consts.get("PREFETCH", False) is expected, (B, kernel)
    args = (data, scale, torch.arange(64, dtype=torch.int32), None, quant, 16, 16, None, None)
    assert "PREFETCH" not in state_io.pool_args(*args, "gla", prefetch=False)[2]  # a caller's choice overrides
    assert state_io.pool_args(*args, "ssd", prefetch=True)[2]["PREFETCH"] is True
    with pytest.raises(ValueError, match="delta's decode kernel has no prefetching walk"):
        state_io.pool_args(*args, "delta", prefetch=True)
    fp32 = StateQuantizer("fp32")
    consts = state_io.pool_args(torch.randn(64, 16, 16, 8), None, torch.arange(64, dtype=torch.int32), None, fp32,
                                16, 16, None, None)[2]
    assert "PREFETCH" not in consts


def test_verify_launch_table_is_well_formed():
    """The verify table: per kernel and step, every format's buckets grow to a catch-all of four-field launches
    (block_k, block_v, num_warps, prefetch), a scaled format's block_v None where the step stores the state (its
    row scale spans the row); the steps with numerics "prefill" ("verify_prefill": the one-chunk kernels, no store)
    have an fp32 entry, which a format the sweep left out takes, of chunk launches (the whole K, V blocks of at least
    16, nothing to prefetch)."""
    from laquant.kernels.common.state_io import VERIFY_LAUNCH, verify_launch

    assert set(VERIFY_LAUNCH) == {"gla", "delta"}
    for kernel, steps in VERIFY_LAUNCH.items():
        assert {"verify", "commit"} <= set(steps) <= {"verify", "commit", "verify_prefill"}
        for step, formats in steps.items():
            if step != "verify_prefill":
                assert {"fp32", "bf16", "fp8_row", "int8_row"} <= set(formats)
            for fmt, buckets in formats.items():
                bounds = [b[0] for b in buckets]
                assert bounds[-1] is None and None not in bounds[:-1] and bounds[:-1] == sorted(set(bounds[:-1]))
                assert all(len(b) == 5 and b[4] in (0, 1) for b in buckets)
                if fmt in ("fp8_row", "int8_row") and step != "verify_prefill":
                    assert all(b[2] is None for b in buckets), (kernel, step, fmt)
            want = formats.get("fp32", steps["verify"]["fp32"])
            assert verify_launch(kernel, step, "fp32", 10**6) == tuple(want[-1][1:])
        chunk = steps["verify_prefill"]
        assert "fp32" in chunk
        assert all(b[1] is None and b[2] >= 16 and b[4] == 0 for buckets in chunk.values() for b in buckets)
        for programs in (1, 100, 10**6):
            assert verify_launch(kernel, "verify_prefill", "int4_row", programs) == \
                verify_launch(kernel, "verify_prefill", "fp32", programs)


@pytest.mark.parametrize("fmt", ["fp32", "int8_row"])
def test_every_tabled_launch_matches_reference(fmt):
    """Each (block_k, num_warps) the GLA decode table holds for the format gives the reference's output and state
    (the small-batch launches take a whole head in one block, the large-batch ones walk its rows)."""
    from laquant.kernels.common.state_io import tabled_decode_launches

    launches = sorted(tabled_decode_launches("gla", fmt))
    assert len(launches) > 1
    for block_k, num_warps in launches:
        (q, k, v, g), data, scale, idx, quant, n_stores = _case(3, 2, 64, 40, 5, fmt)
        data_ref, scale_ref = data.clone(), None if scale is None else scale.clone()
        o_ref = gla_decode_step_reference(q, k, v, g, data_ref, scale_ref, idx, quant, n_stores)
        o = gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, block_k=block_k, num_warps=num_warps,
                            out=torch.full_like(o_ref, float("nan")))
        assert torch.isfinite(o.float()).all() and rel_err(o.float(), o_ref.float()) < 1e-2, (block_k, num_warps)
        new, ref = data[idx.long()].float(), data_ref[idx.long()].float()
        if fmt == "fp32":
            assert rel_err(new, ref) < 1e-6, (block_k, num_warps)
        else:
            assert (new != ref).float().mean() < 0.005 and (new - ref).abs().max() <= 1, (block_k, num_warps)


@pytest.mark.parametrize("fmt,renorm", [("fp32", 1), ("int8_row:stochastic", 1), ("int8_row", 0), ("int8_row", 3)])
@pytest.mark.parametrize("block_k,K", [(8, 20), (16, 64)])
def test_prefetching_walk_stores_the_same_bits(fmt, renorm, block_k, K):
    """The walk that loads each next block of state rows (and its q, k and decay) before this block's arithmetic
    writes the same outputs and state bits as the walk that loads each block in turn, K a multiple of the block or
    not, with fresh, growing or static (calibrated) row scales; GLA's step and its Mamba2 (SSD) mode."""
    from laquant.kernels.gla.decode import ssd_decode_step

    name, _, rounding = fmt.partition(":")
    (q, k, v, g), data, scale, idx, quant, n_stores = _case(3, 2, K, 40, 5, name, renorm)
    quant = StateQuantizer(name, renorm, quant.static_scale, rounding=rounding or "nearest")
    runs = []
    for prefetch in (False, True):
        d, s = data.clone(), None if scale is None else scale.clone()
        o = gla_decode_step(q, k, v, g, d, s, idx, quant, n_stores, block_k=block_k, num_warps=1, seed=7,
                            prefetch=prefetch)
        runs.append((o, d, s))
    (o0, d0, s0) = runs[0]
    assert torch.isfinite(o0.float()).all() and not torch.equal(d0, data)  # the step stored something
    for o1, d1, s1 in runs[1:]:
        assert torch.equal(o0, o1) and torch.equal(d0, d1) and (s0 is None or torch.equal(s0, s1))
    gen = torch.Generator().manual_seed(3)
    C, B_ = (torch.randn(3, 1, K, generator=gen).to(DEVICE) for _ in range(2))
    x, dt = torch.randn(3, 2, 40, generator=gen).to(DEVICE), torch.randn(3, 2, generator=gen).to(DEVICE)
    dt_bias, A_log, D = (torch.rand(2, generator=gen).to(DEVICE) for _ in range(3))
    ssd = []
    for prefetch in (False, True):
        d, s = data.clone(), None if scale is None else scale.clone()
        y = ssd_decode_step(C, B_, x, dt, dt_bias, A_log, D, None, d, s, idx, quant, n_stores, seed=7,
                            block_k=block_k, num_warps=1, prefetch=prefetch)
        ssd.append((y, d))
    assert torch.isfinite(ssd[0][0]).all() and torch.equal(ssd[0][0], ssd[1][0]) and torch.equal(ssd[0][1], ssd[1][1])


def _packed_for(width: int, n_out: int, dtype):
    from laquant.quant.modules import QuantLinear

    outliers = torch.randperm(width)[:n_out]
    return QuantLinear.from_linear(nn.Linear(width, 24).to(dtype), outliers).to(DEVICE).packed()


@pytest.mark.parametrize("fmt", ["fp32", "int8_row"])
@pytest.mark.parametrize("B,H,K,V,n_out,launch", [(3, 3, 32, 42, 5, None), (2, 4, 16, 32, 0, None),
                                                  (5, 2, 64, 40, 3, (16, 1)), (1, 16, 64, 128, 8, (64, 4))])
def test_gated_output_norm_in_the_decode_step(fmt, B, H, K, V, n_out, launch):
    """The decode step with GLA's gated output norm in its launch (and the next GEMM's codes, written by each
    token's last head to finish) gives what the step without it followed by the norm kernel gives: the same state,
    the normed output, the same codes (three heads: rows a token not a power of two; 126 inputs: padding)."""
    from laquant.kernels.rowwise.fused import gated_rms_norm_triton

    dtype = torch.float32 if INTERPRETED else torch.bfloat16
    (q, k, v, g), data, scale, idx, quant, n_stores = _case(B, H, K, V, B + 2, fmt, in_dtype=dtype)
    z = torch.randn(B, H, 2 * V, device=DEVICE, dtype=dtype)[..., V:]  # read in place out of a wider tensor
    weight = torch.randn(V, device=DEVICE, dtype=dtype)
    packed = _packed_for(H * V, n_out, dtype)
    block_k, num_warps = launch or (None, None)
    data_ref, scale_ref = data.clone(), None if scale is None else scale.clone()
    o_plain = gla_decode_step(q, k, v, g, data_ref, scale_ref, idx, quant, n_stores, block_k=block_k,
                              num_warps=num_warps)
    ref, ref_codes = gated_rms_norm_triton(o_plain, z, weight, 1e-5, packed=packed)
    normed = gla_decode_step(q, k, v, g, data.clone(), None if scale is None else scale.clone(), idx, quant, n_stores,
                             block_k=block_k, num_warps=num_warps, norm=(z, weight, 1e-5))
    o, codes = gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, block_k=block_k, num_warps=num_warps,
                               out=torch.full_like(o_plain, float("nan")), norm=(z, weight, 1e-5), packed=packed)
    assert torch.equal(data, data_ref) and (scale is None or torch.equal(scale, scale_ref))
    assert torch.isfinite(o.float()).all() and torch.equal(o, normed)
    # the same arithmetic; on the GPU the sum of squares may group differently (one rounding of o apart)
    assert rel_err(o.float(), ref.float()) < (1e-6 if INTERPRETED else 1e-2)
    if INTERPRETED:
        assert torch.equal(o, ref)
        n = packed.n_out  # the outlier block's padding columns meet zero weights: zeros or copies, either way
        assert torch.equal(codes[0], ref_codes[0]) and torch.equal(codes[1], ref_codes[1])
        assert torch.equal(codes[2][:, :n], ref_codes[2][:, :n]) and codes.packed is packed
    xq, xs, xo = _quantize_rows_of(o, packed)
    assert torch.equal(codes[0], xq) and torch.equal(codes[1], xs)
    assert torch.equal(codes[2][:, :packed.n_out], xo[:, :packed.n_out])
    from laquant.kernels.common.counters import arrival_counters
    assert not arrival_counters(o.device).any()  # left zeroed for the next launch


def _quantize_rows_of(o, packed):
    from laquant.kernels.gemm.int8 import quantize_rows

    return quantize_rows(o.reshape(o.shape[0], -1), packed)


def test_gated_output_norm_arguments_are_checked():
    (q, k, v, g), data, scale, idx, quant, n_stores = _case(2, 2, 16, 24, 3, "fp32", in_dtype=torch.float32)
    z, weight = torch.randn_like(v), torch.randn(24, device=DEVICE)
    with pytest.raises(ValueError, match="come with the gated output norm"):
        gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, packed=_packed_for(48, 2, torch.float32))
    with pytest.raises(ValueError, match="output gate z"):
        gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, norm=(z[:1], weight, 1e-5))
    with pytest.raises(ValueError, match="one per head column"):
        gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, norm=(z, weight[:7], 1e-5))
    with pytest.raises(ValueError, match="cannot come from rows"):
        gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, norm=(z, weight, 1e-5),
                        packed=_packed_for(40, 2, torch.float32))


def test_non_contiguous_inputs():
    (q, k, v, g), data, scale, idx, quant, n_stores = _case(2, 2, 16, 32, 3, "fp8_row")
    qt = torch.empty(2, 16, 2, dtype=q.dtype, device=q.device).transpose(1, 2)  # strided [B, H, K]
    qt.copy_(q)
    assert not qt.is_contiguous()
    ref = gla_decode_step_reference(q, k, v, g, data.clone(), scale.clone(), idx, quant)
    out = gla_decode_step(qt, k, v, g, data, scale, idx, quant)
    assert rel_err(out.float(), ref.float()) < 1e-2


def _dt_treatment(H: int, kind: str | None, gen: torch.Generator) -> dict | None:
    """A calibrated gate's treatment of H dt logits (QuantGate.logit_treatment's dict): clamped to per-head bounds
    narrower than the logits' spread, int8 with a per-head or one scale; ``bounds-free``: no clamp."""
    if kind is None:
        return None
    from laquant.quant.modules import QuantGate

    gate = QuantGate(nn.Identity(), n_channels=H, scaling="per_tensor" if kind == "per_tensor" else "per_channel",
                     clamp=kind != "bounds-free")
    lo = -torch.rand(H, generator=gen) * 6 - 1
    gate.calibrate(lo, lo + torch.rand(H, generator=gen) * 8 + 2)
    return gate.logit_treatment()


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8_row"])
@pytest.mark.parametrize("B,H,G,N,P,limit,treatment", [(3, 4, 2, 16, 24, None, None),
                                                       (2, 3, 1, 20, 8, (0.001, 0.5), "per_channel"),
                                                       (1, 2, 2, 32, 16, (0.0, 10.0), None),
                                                       (2, 5, 1, 16, 8, None, "per_tensor"),
                                                       (3, 4, 4, 8, 16, None, "bounds-free"),
                                                       (5, 16, 2, 16, 8, None, "per_channel")])
def test_ssd_decode_kernel_matches_reference(fmt, B, H, G, N, P, limit, treatment):
    """Mamba2's decode step in the GLA kernel's SSD mode (a calibrated gate's treatment of the dt logits, time
    step, decay, ``dt x``, grouped B / C read in place, ``D x``) against its PyTorch spec, on dt logits past
    softplus's threshold and far below zero (and past the treatment's bounds), with the launch the decode table
    picks for the batch and with another one (one warp walking 16 rows, or one block a head over four warps)."""
    from laquant.kernels.common.state_io import decode_launch
    from laquant.kernels.gla.decode import ssd_decode_step, ssd_decode_step_reference

    gen = torch.Generator().manual_seed(B * 100 + N + P)
    r = lambda *s: torch.randn(*s, generator=gen)
    xbc = r(B, H * P + 2 * G * N).to(torch.bfloat16)  # x | B | C of one token, as the conv leaves them
    x = xbc[:, :H * P].unflatten(-1, (H, P))
    b_, c = (xbc[:, H * P + i * G * N:H * P + (i + 1) * G * N].unflatten(-1, (G, N)) for i in (0, 1))
    # the interpreter truncates float32 -> bf16 (the treatment rounds its output so): float32 logits there
    dt_logits = (r(B, H) * 4).to(torch.float32 if INTERPRETED and treatment else torch.bfloat16)
    dt_logits[0, 0], dt_logits[-1, -1] = 25.0, -30.0
    dt_bias, A_log, D = r(H) * 0.5, r(H).abs().log(), r(H)
    dt_treatment = _dt_treatment(H, treatment, gen)
    P_slots = B + 2
    quant = StateQuantizer(fmt)
    data, scale = quant.store(r(P_slots, H, N, P))
    if scale is not None:
        scale = scale.squeeze(-1).expand(P_slots, H, N).contiguous()
    idx = torch.randperm(P_slots, generator=gen)[:B].to(torch.int32)
    to = lambda t: None if t is None else t.to(DEVICE)
    x, b_, c, dt_logits, dt_bias, A_log, D, data, scale, idx = map(to, (x, b_, c, dt_logits, dt_bias, A_log, D, data,
                                                                        scale, idx))
    if dt_treatment is not None:
        dt_treatment = {k: to(v) for k, v in dt_treatment.items()}
    data_ref, scale_ref = data.clone(), None if scale is None else scale.clone()
    original = data.clone(), None if scale is None else scale.clone()
    start = lambda: [None if t is None else t.clone() for t in original]  # noqa: E731
    y_ref = ssd_decode_step_reference(c, b_, x, dt_logits, dt_bias, A_log, D, limit, data_ref, scale_ref, idx, quant,
                                      dt_treatment=dt_treatment)
    y = ssd_decode_step(c, b_, x, dt_logits, dt_bias, A_log, D, limit, data, scale, idx, quant,
                        out=torch.full_like(y_ref, float("nan")), dt_treatment=dt_treatment)
    assert torch.isfinite(y).all() and rel_err(y, y_ref) < 1e-5
    other_launch = next(dict(block_k=bk, num_warps=w) for bk, w in ((16, 1), (128, 4))
                        if (bk, w) != decode_launch("ssd", quant.format.name, B * H))
    other_state = start()
    other = ssd_decode_step(c, b_, x, dt_logits, dt_bias, A_log, D, limit, *other_state, idx, quant,
                            out=torch.full_like(y_ref, float("nan")), dt_treatment=dt_treatment, **other_launch)
    assert torch.isfinite(other).all() and rel_err(other, y_ref) < 1e-5
    if fmt == "fp32" and not INTERPRETED:  # bf16 out (the model's): y rounded once, as .to(bf16) rounds it
        again = ssd_decode_step(c, b_, x, dt_logits, dt_bias, A_log, D, limit, *start(), idx, quant,
                                out=torch.full(y.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE),
                                dt_treatment=dt_treatment)
        assert torch.equal(again, y.to(torch.bfloat16))
    if dt_treatment is not None:  # the treatment matters here: without it the outputs differ
        untreated = ssd_decode_step_reference(c, b_, x, dt_logits, dt_bias, A_log, D, limit, *start(), idx, quant)
        assert rel_err(untreated, y_ref) > 1e-3
    ref = data_ref.float()
    for new in (data.float(), other_state[0].float()):
        if fmt == "fp32":
            assert rel_err(new, ref) < 1e-6
        elif fmt == "int8_row":
            assert (new != ref).float().mean().item() < 0.005 and (new - ref).abs().max() <= 1
        else:
            assert ((new - ref).abs() <= ref.abs() * 2**-7).all()


def test_ssd_reference_is_the_mamba2_mixers_glue():
    """The SSD step's spec equals what laquant's Mamba2 mixer computes around the GLA step (its time step,
    decay and ``D x``), so the one-kernel decode and the PyTorch path are one computation."""
    from types import SimpleNamespace

    from laquant.kernels.gla.decode import ssd_decode_step_reference
    from laquant.models.hybrid_mixers import Mamba2Mixer

    gen = torch.Generator().manual_seed(5)
    B, H, G, N, P = 2, 4, 2, 8, 6
    mixer = SimpleNamespace(dt_bias=torch.randn(H, generator=gen), A_log=torch.randn(H, generator=gen),
                            time_step_limit=(0.01, 2.0))
    dt_logits, D = torch.randn(B, H, generator=gen) * 3, torch.randn(H, generator=gen)
    x, b_, c = torch.randn(B, H, P, generator=gen), torch.randn(B, G, N, generator=gen), torch.randn(B, G, N, generator=gen)
    state = torch.randn(B, H, N, P, generator=gen)
    quant, idx = StateQuantizer("fp32"), torch.arange(B, dtype=torch.int32)
    dt = Mamba2Mixer.time_step(mixer, dt_logits)
    g = dt * -mixer.A_log.exp()  # as Mamba2Mixer.forward
    q, k = c.repeat_interleave(H // G, 1), b_.repeat_interleave(H // G, 1)
    decayed = state * g.exp()[..., None, None] + k[..., :, None] * (x * dt[..., None])[..., None, :]
    want = torch.einsum("bhn,bhnp->bhp", q, decayed) + x * D[:, None]
    got_state = state.clone()
    got = ssd_decode_step_reference(c, b_, x, dt_logits, mixer.dt_bias, mixer.A_log, D, mixer.time_step_limit,
                                    got_state, None, idx, quant)
    assert rel_err(got, want) < 1e-5 and rel_err(got_state, decayed) < 1e-6


@pytest.mark.parametrize("family", ["bamba", "nemotron_h"])
@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_mamba2_decode_steps_take_the_ssd_kernel(family, static, monkeypatch):
    """In a laquant Mamba2 hybrid (float32; nemotron_h's two groups of heads) each decode token's scan is the one
    SSD kernel, on the dynamic cache and on the static one a graph replays; the logits equal transformers' own
    model's over the whole sequence. The prompt keeps the PyTorch path (more than one token)."""
    import copy

    import laquant.kernels.gla.decode as module
    import test_hybrid
    from laquant.adapters import install
    from laquant.models import hybrid_mixers

    torch.manual_seed(0)
    reference = test_hybrid.FAMILIES[family]().float().eval().to(DEVICE)
    model = copy.deepcopy(reference)
    install(model)
    ids = torch.randint(0, test_hybrid.VOCAB, (2, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    calls = []
    real = module.ssd_decode_step
    monkeypatch.setattr(module, "ssd_decode_step", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    if INTERPRETED:  # the mixers' side only: the prompt's scan keeps the reference
        monkeypatch.setattr(hybrid_mixers, "use_triton", lambda x, state_format=None: True)
    got, seq = greedy_decode_steps(model, ids, static=static)
    mixers = [m for m in model.modules() if isinstance(m, hybrid_mixers.Mamba2Mixer)]
    assert len(calls) == 3 * len(mixers) and all(shape[1] == mixers[0].n_groups for shape in calls)
    want = reference(input_ids=seq).logits[:, ids.shape[1] - 1:]
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-4


@pytest.mark.parametrize("family", ["bamba", "nemotron_h", "mamba2"])
@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_calibrated_mamba2_decode_treats_dt_in_the_ssd_kernel(family, static, monkeypatch):
    """A calibrated Mamba2 model (hybrid_int8: in_proj's dt channels a QuantGate), on the dynamic cache and on the
    static one a graph replays: each decode token's SSD kernel gets the dt logits untreated with its mixer's gate
    treatment, which applied to them gives exactly the logits the PyTorch path's time step reads (it treats them
    first); the model's logits equal that path's (float32 model: both round alike under the interpreter)."""
    import copy

    import laquant
    import laquant.kernels.gla.decode as module
    import test_hybrid
    from laquant.kernels.common.numerics import fake_quantize_int8
    from laquant.models import hybrid_mixers

    torch.manual_seed(0)
    model = test_hybrid.FAMILIES[family]().float().eval()
    calib = torch.randint(0, test_hybrid.VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    model = laquant.calibrate(model, "hybrid_int8", calib, progress=False).model.to(DEVICE)
    glue = copy.deepcopy(model)
    ids = torch.randint(0, test_hybrid.VOCAB, (2, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    kernel_calls = []
    real = module.ssd_decode_step
    monkeypatch.setattr(module, "ssd_decode_step",
                        lambda *a, **k: kernel_calls.append((a[3].clone(), k.get("dt_treatment"))) or real(*a, **k))
    if INTERPRETED:  # the mixers' side only: the prompt's scan keeps the reference
        monkeypatch.setattr(hybrid_mixers, "use_triton", lambda x, state_format=None: True)
    got, _ = greedy_decode_steps(model, ids, static=static)
    mixers = [m for m in model.modules() if isinstance(m, hybrid_mixers.Mamba2Mixer)]
    assert len(kernel_calls) == 3 * len(mixers)
    assert all(t is not None and t["logit_scale"] is m.in_proj.logit_scale
               for (_, t), m in zip(kernel_calls, mixers * 3))

    monkeypatch.setattr(hybrid_mixers.Mamba2Mixer, "_one_kernel_state", lambda self, xs, states: None)
    read, time_step = [], hybrid_mixers.Mamba2Mixer.time_step
    monkeypatch.setattr(hybrid_mixers.Mamba2Mixer, "time_step",
                        lambda self, dt: (dt.shape[1] == 1 and read.append(dt[:, 0].clone())) or time_step(self, dt))
    want, _ = greedy_decode_steps(glue, ids, static=static)
    assert len(read) == len(kernel_calls)
    for (dt, t), ref in zip(kernel_calls, read):
        assert torch.equal(fake_quantize_int8(dt, t["logit_scale"], t["logit_min"], t["logit_max"]), ref)
        assert not torch.equal(dt, ref)  # untreated: the kernel's treatment is not a second one
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-5
