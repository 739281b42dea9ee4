"""The multi-token verify step and its commit (speculative decoding's rollback), GLA and the gated
delta rule (KDA's per-channel decay too): accepting n of T verified tokens leaves the pool
bit-identical to n decode steps, stochastic rounding bits and scales included, for the PyTorch
references and for the Triton kernels (GPU, or CPU under TRITON_INTERPRET=1)."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err
from laquant.kernels.common.pool_steps import Kept, commit_kept
from laquant.kernels.delta import decode as delta_decode
from laquant.kernels.delta import verify as delta_verify
from laquant.kernels.gla import decode as gla_decode
from laquant.kernels.gla import verify as gla_verify
from laquant.kernels.kda import decode as kda_decode
from laquant.quant import StateFormat, StateQuantizer

FORMATS = [("fp32", 1, "nearest"), ("bf16", 1, "nearest"), ("fp8_row", 1, "nearest"), ("fp8_row", 3, "stochastic"),
           ("int8_row", 0, "nearest"), ("int8_row", 3, "nearest"), ("int8_row", 1, "stochastic")]


class Family:
    """One recurrence's inputs, decode step and verify/commit, reference or Triton."""

    def __init__(self, name, triton_kernels):
        self.name = name
        self.triton = triton_kernels

    def inputs(self, B, T, H, K, V, gen, device):
        r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
        if self.name == "gla":
            ins = [r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), torch.nn.functional.logsigmoid(r(B, T, H, K)) / 4]
        else:
            hk = H // 2 if H % 2 == 0 else H  # grouped heads where the shape allows
            g = torch.nn.functional.logsigmoid(r(B, T, H, K) if self.name == "kda" else r(B, T, H)) / 4
            ins = [r(B, T, hk, K), r(B, T, hk, K), r(B, T, H, V), g, torch.rand(B, T, H, generator=gen)]
        return [x.to(device) for x in ins]

    def kw(self, v=None):
        if self.name == "gla":
            return {}
        if self.triton and v is not None:  # the launch the decode kernel gets below, so both sum k^T S alike
            return {"use_qk_l2norm": True, "num_warps": 4, "block_v": 1 << (v.shape[-1] - 1).bit_length()}
        return {"use_qk_l2norm": True}

    def decode(self, ins, t, rows, *pool):
        mod = {"gla": gla_decode, "delta": delta_decode, "kda": kda_decode}[self.name]
        fn = getattr(mod, f"{self.name}_decode_step" + ("" if self.triton else "_reference"))
        args = [x[rows, t] for x in ins]
        state, scale, idx, quant, n_stores = pool
        if self.triton and self.name != "gla":  # the verify kernel sums over the whole K at once
            return fn(*args, state, scale, idx[rows], quant, n_stores, block_k=1 << (args[0].shape[-1] - 1).bit_length(), num_warps=4,
                      **self.kw())
        return fn(*args, state, scale, idx[rows], quant, n_stores, **self.kw())

    def verify(self, ins, *pool, kept=None):
        mod = gla_verify if self.name == "gla" else delta_verify
        fn = getattr(mod, f"{'gla' if self.name == 'gla' else 'delta'}_verify" + ("" if self.triton else "_reference"))
        state, scale, idx, quant, n_stores = pool
        return fn(*ins, state, scale, idx, quant, n_stores, kept=kept, **self.kw(ins[2]))

    def commit(self, ins, accepted, *pool):
        mod = gla_verify if self.name == "gla" else delta_verify
        fn = getattr(mod, f"{'gla' if self.name == 'gla' else 'delta'}_commit" + ("" if self.triton else "_reference"))
        state, scale, idx, quant, n_stores = pool
        fn(*ins, state, scale, idx, quant, accepted, n_stores, **self.kw(ins[2]))


def _pool(P, H, K, V, fmt, renorm, rounding, gen, device):
    full = torch.randn(P, H, K, V, generator=gen) * torch.logspace(-2, 0, K).view(1, 1, K, 1)
    static = (full.abs().amax((0, -1)) * 1.5 / StateFormat(fmt).qmax).unsqueeze(-1) if renorm == 0 else None
    quant = StateQuantizer(fmt, renorm, static, rounding)
    data, scale = quant.store(full, key=None) if rounding == "nearest" else StateQuantizer(fmt, renorm, static).store(
        full)
    if scale is not None:
        scale = scale.squeeze(-1).expand(P, H, K).contiguous().to(device)
    n_stores = torch.randint(0, 7, (P,), generator=gen, dtype=torch.int32).to(device)
    return data.to(device), scale, quant, n_stores


def _case(family, fmt, renorm, rounding, B, T, H, K, V, P):
    gen = torch.Generator().manual_seed(B * 100 + T * 10 + K + V)
    ins = family.inputs(B, T, H, K, V, gen, DEVICE)
    data, scale, quant, n_stores = _pool(P, H, K, V, fmt, renorm, rounding, gen, DEVICE)
    idx = torch.randperm(P, generator=gen)[:B].to(torch.int32).to(DEVICE)
    accepted = torch.randint(0, T + 1, (B,), generator=gen, dtype=torch.int32).to(DEVICE)
    accepted[0] = T  # every token accepted in one row, none in another
    if B > 1:
        accepted[1] = 0
    return ins, data, scale, idx, quant, n_stores, accepted


def _clone(data, scale):
    return data.clone(), None if scale is None else scale.clone()


def _decode_run(family, ins, data, scale, idx, quant, n_stores, accepted):
    """accepted[b] decode steps per row (rows with fewer steps drop out), counting stores as a caller does."""
    data, scale = _clone(data, scale)
    counts = n_stores.clone()
    outs = []
    for t in range(int(accepted.max())):
        rows = (accepted > t).nonzero().flatten()
        outs.append(family.decode(ins, t, rows, data, scale, idx, quant, counts))
        counts[idx[rows].long()] += 1
    return data, scale, outs


def _same_pool(a, b):
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
    assert (a[1] is None) == (b[1] is None)
    if a[1] is not None:
        assert torch.equal(a[1], b[1])


SHAPES = [(3, 5, 2, 20, 24, 6), (1, 16, 1, 16, 16, 1), (2, 3, 4, 12, 40, 5)]


@pytest.mark.parametrize("name", ["gla", "delta", "kda"])
@pytest.mark.parametrize("fmt,renorm,rounding", FORMATS)
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_reference_verify_then_commit_is_n_decode_steps(name, fmt, renorm, rounding, shape):
    family = Family(name, triton_kernels=False)
    ins, data, scale, idx, quant, n_stores, accepted = _case(family, fmt, renorm, rounding, *shape)
    want = _decode_run(family, ins, data, scale, idx, quant, n_stores, accepted)
    B, T = shape[:2]
    # verify keeps the pool; its outputs are the decode steps'; then commit by recomputing or from the kept states
    d1, s1 = _clone(data, scale)
    kept = Kept.empty_like_pool(d1, s1, B, T)
    o = family.verify(ins, d1, s1, idx, quant, n_stores, kept=kept)
    _same_pool((d1, s1), (data, scale))
    assert torch.isfinite(o.float()).all()
    for t, o_t in enumerate(want[2]):
        rows = (accepted > t).nonzero().flatten()
        assert torch.equal(o[rows, t], o_t)
    commit_kept(d1, s1, idx, kept, accepted)
    _same_pool((d1, s1), want[:2])
    d2, s2 = _clone(data, scale)
    family.commit(ins, accepted, d2, s2, idx, quant, n_stores)
    _same_pool((d2, s2), want[:2])
    if int(accepted.max()) > 0:  # the test can fail: the pool did change
        assert not torch.equal(d2.view(torch.uint8), data.view(torch.uint8))


@pytest.mark.parametrize("name,shape", [("gla", s) for s in SHAPES] + [(n, s) for n in ("delta", "kda")
                                                                        for s in (SHAPES[0], SHAPES[2])])
@pytest.mark.parametrize("fmt,renorm,rounding", [f for f in FORMATS if f not in (("fp8_row", 1, "nearest"),
                                                                                ("int8_row", 3, "nearest"))])
def test_triton_verify(name, fmt, renorm, rounding, shape):
    pytest.importorskip("triton")
    from conftest import require_triton_kernels

    require_triton_kernels()
    family, ref = Family(name, triton_kernels=True), Family(name, triton_kernels=False)
    ins, data, scale, idx, quant, n_stores, accepted = _case(family, fmt, renorm, rounding, *shape)
    B, T = shape[:2]
    # against K calls of the decode kernel: the pool bit-identical, the outputs to float32 rounding
    want = _decode_run(family, ins, data, scale, idx, quant, n_stores, accepted)
    d1, s1 = _clone(data, scale)
    kept = Kept.empty_like_pool(d1, s1, B, T)
    o = family.verify(ins, d1, s1, idx, quant, n_stores, kept=kept)
    _same_pool((d1, s1), (data, scale))
    assert torch.isfinite(o.float()).all()
    for t, o_t in enumerate(want[2]):
        rows = (accepted > t).nonzero().flatten()
        assert rel_err(o[rows, t], o_t) < 1e-5
    d2, s2 = _clone(data, scale)
    family.commit(ins, accepted, d2, s2, idx, quant, n_stores)
    _same_pool((d2, s2), want[:2])
    commit_kept(d1, s1, idx, kept, accepted)
    _same_pool((d1, s1), want[:2])
    if name == "gla":  # K rows in blocks of 4: the same states, the outputs summed in another order
        d4, s4 = _clone(data, scale)
        kept4 = Kept.empty_like_pool(d4, s4, B, T)
        o4 = gla_verify.gla_verify(*ins, d4, s4, idx, quant, n_stores, kept=kept4, block_k=4)
        assert rel_err(o4, o) < 1e-5
        _same_pool(kept4, kept)
    # against the reference verify: outputs close, the kept states equal up to the kernels' rounding
    d3, s3 = _clone(data, scale)
    kept_ref = Kept.empty_like_pool(d3, s3, B, T)
    o_ref = ref.verify(ins, d3, s3, idx, quant, n_stores, kept=kept_ref)
    # the interpreter misrounds fp32 -> bf16 / fp8 (see test_decode_kernel), and those errors compound over tokens
    misrounds = INTERPRETED and fmt in ("bf16", "fp8_row") and rounding == "nearest"
    # (8-bit codes may differ by a step where x / scale meets a rounding boundary, see encode_state; over tokens)
    assert rel_err(o.float(), o_ref.float()) < (0.1 if misrounds else 1e-4 if fmt == "fp32" else 5e-2)
    if kept.scale is not None:
        assert rel_err(kept.scale, kept_ref.scale) < (0.1 if misrounds else 1e-2)
    fresh = kept.data.float() * (kept.scale.unsqueeze(-1) if kept.scale is not None else 1)
    fresh_ref = kept_ref.data.float() * (kept_ref.scale.unsqueeze(-1) if kept_ref.scale is not None else 1)
    assert rel_err(fresh, fresh_ref) < (0.2 if misrounds else 0.1)


def test_verify_rejects_bad_input():
    family = Family("gla", triton_kernels=False)
    gen = torch.Generator().manual_seed(0)
    ins = family.inputs(2, 17, 1, 8, 8, gen, "cpu")
    data, scale, quant, n_stores = _pool(2, 1, 8, 8, "fp32", 1, "nearest", gen, "cpu")
    idx = torch.arange(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="1 to 16 tokens"):
        family.verify(ins, data, scale, idx, quant, n_stores)
    with pytest.raises(ValueError, match="accepted counts"):
        family.commit([x[:, :4] for x in ins], torch.tensor([5, 0]), data, scale, idx, quant, n_stores)


@pytest.mark.parametrize("name", ["gla", "delta"])
@pytest.mark.parametrize("fmt,renorm,rounding", [("bf16", 1, "nearest"), ("int8_row", 1, "stochastic")])
def test_triton_verify_prefetch_changes_nothing(name, fmt, renorm, rounding):
    """Loading the next token's inputs ahead (the launch tables' prefetch) is scheduling only: the same
    outputs, kept states and committed pool bit for bit, with and without it."""
    pytest.importorskip("triton")
    from conftest import require_triton_kernels

    require_triton_kernels()
    family = Family(name, triton_kernels=True)
    ins, data, scale, idx, quant, n_stores, accepted = _case(family, fmt, renorm, rounding, *SHAPES[2])
    B, T = SHAPES[2][:2]
    mod = gla_verify if name == "gla" else delta_verify
    runs = []
    for prefetch in (False, True):
        d, s = _clone(data, scale)
        kept = Kept.empty_like_pool(d, s, B, T)
        o = getattr(mod, f"{name}_verify")(*ins, d, s, idx, quant, n_stores, kept=kept, prefetch=prefetch,
                                           **family.kw(ins[2]))
        getattr(mod, f"{name}_commit")(*ins, d, s, idx, quant, accepted, n_stores, prefetch=prefetch,
                                       **family.kw(ins[2]))
        runs.append((o, kept, (d, s)))
    (o0, kept0, pool0), (o1, kept1, pool1) = runs
    assert torch.isfinite(o0.float()).all() and torch.equal(o0, o1)
    _same_pool(kept0, kept1)
    _same_pool(pool0, pool1)
    assert not torch.equal(pool0[0].view(torch.uint8), data.view(torch.uint8))  # the commit did write


@pytest.mark.parametrize("name", ["gla", "delta", "kda"])
@pytest.mark.parametrize("fmt,renorm,rounding", [("fp32", 1, "nearest"), ("bf16", 1, "nearest"),
                                                 ("int8_row", 1, "stochastic"), ("fp8_row", 3, "stochastic")])
def test_reference_verify_with_prefill_numerics(name, fmt, renorm, rounding):
    """numerics="prefill": the T states held in float32 from the stored one, as a prefill chunk holds them; the
    first output is the decode step's, the later ones differ by the format's rounding (none for fp32)."""
    from laquant.kernels.common.state import load_pool_slots

    family = Family(name, triton_kernels=False)
    ins, data, scale, idx, quant, n_stores, _ = _case(family, fmt, renorm, rounding, *SHAPES[0])
    T = SHAPES[0][1]
    mod = gla_verify if name == "gla" else delta_verify
    fn = getattr(mod, f"{'gla' if name == 'gla' else 'delta'}_verify_reference")
    d, s = _clone(data, scale)
    o = fn(*ins, d, s, idx, quant, n_stores, numerics="prefill", **family.kw())
    _same_pool((d, s), (data, scale))
    exact = family.verify(ins, d, s, idx, quant, n_stores)
    h = load_pool_slots(data, scale, idx, quant)
    rows = torch.arange(ins[0].shape[0])
    for t in range(T):  # the float32 recurrence, never stored
        o_t = family.decode(ins, t, rows, h, None, torch.arange(h.shape[0], dtype=torch.int32),
                            StateQuantizer("fp32"), None)
        assert torch.equal(o[:, t], o_t)
    assert torch.isfinite(o.float()).all()
    assert torch.equal(o[:, 0], exact[:, 0])
    assert torch.equal(o, exact) == (fmt == "fp32")
    with pytest.raises(ValueError, match="numerics='decode'"):
        fn(*ins, d, s, idx, quant, n_stores, numerics="prefill", kept=Kept.empty_like_pool(d, s, *ins[0].shape[:2]),
           **family.kw())
    with pytest.raises(ValueError, match="numerics must be one of"):
        fn(*ins, d, s, idx, quant, n_stores, numerics="chunk", **family.kw())


@pytest.mark.parametrize("name", ["gla", "delta", "kda"])
@pytest.mark.parametrize("fmt,renorm,rounding", [("fp32", 1, "nearest"), ("int8_row", 1, "stochastic"),
                                                 ("fp8_row", 3, "stochastic")])
def test_triton_verify_with_prefill_numerics(name, fmt, renorm, rounding):
    """The kernels' numerics="prefill" against the reference's: the pool untouched, the outputs to float32
    rounding (no state rounding inside), V in blocks for the scaled formats too (no row scale to take)."""
    pytest.importorskip("triton")
    from conftest import require_triton_kernels

    require_triton_kernels()
    family, ref = Family(name, triton_kernels=True), Family(name, triton_kernels=False)
    shape = SHAPES[2]
    ins, data, scale, idx, quant, n_stores, accepted = _case(family, fmt, renorm, rounding, *shape)
    mod = gla_verify if name == "gla" else delta_verify
    prefix = "gla" if name == "gla" else "delta"
    d, s = _clone(data, scale)
    want = getattr(mod, f"{prefix}_verify_reference")(*ins, d, s, idx, quant, n_stores, numerics="prefill",
                                                      **ref.kw())
    kw = {k: v for k, v in family.kw(ins[2]).items() if k != "block_v"}
    for block_v in (None, 16):
        o = getattr(mod, f"{prefix}_verify")(*ins, d, s, idx, quant, n_stores, numerics="prefill", block_v=block_v,
                                             **kw)
        _same_pool((d, s), (data, scale))
        assert torch.isfinite(o.float()).all()
        assert rel_err(o.float(), want.float()) < 1e-5
    # the commit after it is the decode steps', whatever the verify's numerics
    getattr(mod, f"{prefix}_commit")(*ins, d, s, idx, quant, accepted, n_stores, **family.kw(ins[2]))
    _same_pool((d, s), _decode_run(family, ins, data, scale, idx, quant, n_stores, accepted)[:2])


@pytest.mark.parametrize("name", ["gla", "delta", "kda"])
@pytest.mark.parametrize("T,extreme", [(16, False), (1, True), (7, True), (16, True)])
def test_triton_verify_prefill_chunk_with_extreme_decays(name, T, extreme):
    """numerics="prefill" runs the tokens as one prefill chunk. A per-channel decay (GLA, KDA) splits around its
    middle row; where a channel decays by more than exp(-60) inside the chunk (a split factor would overflow
    float32: inf, then NaN) the kernel runs the tokens one by one instead. The delta rule's per-head decay decays
    the scores as one ``exp(G_t - G_s)`` tile, which cannot overflow. Finite, and the reference's float32
    recurrence to float32 accuracy in every case."""
    pytest.importorskip("triton")
    from conftest import require_triton_kernels

    require_triton_kernels()
    family = Family(name, triton_kernels=True)
    B, H, K, V, P = 2, 4, 12, 40, 5
    gen = torch.Generator().manual_seed(T)
    ins = family.inputs(B, T, H, K, V, gen, DEVICE)
    if extreme:  # one token erases half the heads' state in a few channels (per-head decay: the whole head)
        ins[3][:, T // 2, : H // 2] = -100.0
    data, scale, quant, n_stores = _pool(P, H, K, V, "int8_row", 1, "stochastic", gen, DEVICE)
    idx = torch.randperm(P, generator=gen)[:B].to(torch.int32).to(DEVICE)
    mod = gla_verify if name == "gla" else delta_verify
    prefix = "gla" if name == "gla" else "delta"
    kw = {k: v for k, v in family.kw(ins[2]).items() if k != "block_v"}
    want = getattr(mod, f"{prefix}_verify_reference")(*ins, data, scale, idx, quant, n_stores, numerics="prefill",
                                                      **Family(name, triton_kernels=False).kw())
    o = getattr(mod, f"{prefix}_verify")(*ins, data, scale, idx, quant, n_stores, numerics="prefill", **kw)
    assert torch.isfinite(o.float()).all()
    assert rel_err(o.float(), want.float()) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gla", "delta", "kda"])
@pytest.mark.parametrize("T", [4, 8])
def test_triton_verify_prefill_chunk_with_bf16_inputs(name, T):
    """The model's bf16 inputs: the one-chunk verify multiplies bf16 operands on the tensor cores, as the chunked
    prefill does; its outputs are the float32 recurrence's on the same inputs to bf16 products' accuracy."""
    pytest.importorskip("triton")
    family = Family(name, triton_kernels=True)
    B, H, K, V, P = 4, 4, 64, 128, 6
    gen = torch.Generator().manual_seed(T)
    ins = [x.to(torch.bfloat16) if x.dim() == 4 else x for x in family.inputs(B, T, H, K, V, gen, DEVICE)]
    data, scale, quant, n_stores = _pool(P, H, K, V, "int8_row", 1, "stochastic", gen, DEVICE)
    idx = torch.randperm(P, generator=gen)[:B].to(torch.int32).to(DEVICE)
    mod = gla_verify if name == "gla" else delta_verify
    prefix = "gla" if name == "gla" else "delta"
    kw = {k: v for k, v in family.kw(ins[2]).items() if k != "block_v"}
    want = getattr(mod, f"{prefix}_verify_reference")(*[x.float() for x in ins], data, scale, idx, quant, n_stores,
                                                      numerics="prefill", **Family(name, triton_kernels=False).kw())
    o = getattr(mod, f"{prefix}_verify")(*ins, data, scale, idx, quant, n_stores, numerics="prefill", **kw)
    assert o.dtype == torch.bfloat16
    assert rel_err(o.float(), want.float()) < 1e-2

