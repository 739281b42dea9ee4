"""The fused row-wise kernels (RMSNorm with residual, gated RMSNorm, SwiGLU, GLA's gate tail) and
the fused projection groups, against their PyTorch references (interpreted on CPU, float32)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.kernels.common.numerics import fake_quantize_int8
from laquant.kernels.gla.gate import gate_log_decay
from laquant.kernels.rowwise.reference import gated_rms_norm, rms_norm, swiglu
from laquant.quant.modules import QuantLinear

triton = require_triton_kernels()
from laquant.kernels.gla.gate import gate_log_decay_triton  # noqa: E402
from laquant.kernels.rowwise.fused import gated_rms_norm_triton, rms_norm_triton, row_layout, swiglu_triton  # noqa: E402

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16
TOL = 1e-6 if INTERPRETED else 1e-2


def _randn(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).to(DEVICE, DTYPE)


@pytest.mark.parametrize("shape", [(3, 5, 200), (1, 1, 2048), (7, 96)])
@pytest.mark.parametrize("with_residual,round_sum", [(False, False), (True, False), (True, True)])
def test_rms_norm(shape, with_residual, round_sum):
    x, w = _randn(*shape, scale=3.0), _randn(shape[-1])
    residual = _randn(*shape) if with_residual else None
    out, summed = rms_norm_triton(x, w, 1e-6, residual, round_sum=round_sum)
    ref, ref_sum = rms_norm(x.cpu(), w.cpu(), 1e-6, None if residual is None else residual.cpu(), round_sum=round_sum)
    assert out.dtype == x.dtype and rel_err(out.float().cpu(), ref.float()) < TOL
    if with_residual:
        assert rel_err(summed.float().cpu(), ref_sum.float()) < TOL
    else:
        assert summed is None


@pytest.mark.parametrize("shape", [(3, 5, 200), (4, 2048)])
def test_rms_norm_round_normed(shape):
    """Llama's rounding (the normalized rows in x's dtype, then the weight): the kernel stores what the
    reference does, but for sum-order flips in bf16 (the mean's float32 sum is ordered differently)."""
    x, w = _randn(*shape, scale=3.0), _randn(shape[-1])
    out = rms_norm_triton(x, w, 1e-6, round_normed=True)[0]
    ref = rms_norm(x.cpu(), w.cpu(), 1e-6, round_normed=True)[0]
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    if not INTERPRETED:
        assert (out.cpu() != ref).float().mean() < 0.01
        unrounded = rms_norm(x.cpu(), w.cpu(), 1e-6)[0]
        assert (unrounded != ref).any()  # the two roundings differ on these inputs: the flag is seen


def test_rms_norm_round_sum_is_a_separate_add():
    """``round_sum`` normalizes x + residual as the separate add rounds it (bf16), not in float32."""
    x, r, w = (torch.randn(4, 64) * 3).bfloat16(), torch.randn(4, 64).bfloat16(), torch.randn(64)
    out, summed = rms_norm(x, w, 1e-6, r, round_sum=True)
    assert torch.equal(out, rms_norm(x + r, w, 1e-6)[0]) and torch.equal(summed, x + r)
    assert not torch.equal(rms_norm(x, w, 1e-6, r)[0], out)  # float32 sums differ from the rounded ones here


def test_gated_rms_norm_on_strided_slices():
    """The output gate is a column slice of a fused projection's output: rows at two strides."""
    B, T, H, V = 3, 2, 4, 72
    fused = _randn(B, T, 2 * H * V + 40)
    g = fused[..., 40:40 + H * V].unflatten(-1, (H, V))
    x, w = _randn(B, T, H, V), _randn(V)
    assert row_layout(g)[2] == H  # two-level addressing, no copy
    out = gated_rms_norm_triton(x, g, w, 1e-5)
    ref = gated_rms_norm(x.cpu(), g.cpu(), w.cpu(), 1e-5)
    assert rel_err(out.float().cpu(), ref.float()) < TOL


@pytest.mark.parametrize("shape,view", [((5, 7), None), ((1, 7), None), ((7,), None), ((2, 1, 3, 7), None),
                                        ((1, 1, 7), None), ((0, 7), None), ((3, 4, 9), "columns"),
                                        ((2, 3, 4, 8), "heads")])
def test_row_layout_addresses_every_row(shape, view):
    """Row r of t starts at ``(r // inner) * s0 + (r % inner) * s1`` elements past t's first: contiguous tensors
    (their shortcut) and strided views alike."""
    t = torch.zeros(shape)
    if view == "columns":  # a column slice of a wider row
        t = t[..., 2:7]
    elif view == "heads":  # [B, T, H, D] from a fused [B, T, H * D + 8] output
        t = torch.zeros(*shape[:2], shape[2] * shape[3] + 8)[..., 8:].unflatten(-1, shape[2:])
    s0, s1, inner = row_layout(t)
    starts = [t[idx].data_ptr() for idx in itertools.product(*map(range, t.shape[:-1]))]  # rows in order
    for r, start in enumerate(starts):
        assert (r // inner) * s0 + (r % inner) * s1 == (start - t.data_ptr()) // t.element_size()


def test_norms_take_views_that_need_three_strides():
    """A view whose rows two strides cannot address (heads transposed against time) is copied, not refused."""
    B, T, H, V = 2, 3, 4, 40
    x = _randn(B, H, T, V).transpose(1, 2)  # [B, T, H, V] with H outer to T
    g, w = _randn(B, T, H, V), _randn(V)
    with pytest.raises(ValueError, match="two strides"):
        row_layout(x)
    out = gated_rms_norm_triton(x, g, w, 1e-5)
    assert rel_err(out.float().cpu(), gated_rms_norm(x.cpu(), g.cpu(), w.cpu(), 1e-5).float()) < TOL
    gate = _randn(B, H, T, 64).transpose(1, 2)
    out = swiglu_triton(gate, gate * 0.5)
    assert rel_err(out.float().cpu(), swiglu(gate.cpu(), gate.cpu() * 0.5).float()) < TOL


def test_swiglu_on_slices():
    y = _randn(9, 2 * 300, scale=2.0)
    gate, up = y.split(300, dim=-1)
    out = swiglu_triton(gate, up)
    assert rel_err(out.float().cpu(), swiglu(gate.cpu(), up.cpu()).float()) < TOL
    if not INTERPRETED:  # silu's output rounded to bf16 before the product, as PyTorch's two ops round
        assert (out != swiglu(gate, up)).float().mean() < 1e-3


@pytest.mark.parametrize("treatment", ["none", "per_channel", "per_tensor", "unclamped"])
@pytest.mark.parametrize("clamp_min", [None, -0.5])
def test_gate_log_decay(treatment, clamp_min):
    M, C = 13, 1100  # C spans two column blocks
    logits = _randn(M, C, scale=4.0)
    logits[:, 3] = 40.0  # beyond the calibrated range: clamped
    kw = {}
    if treatment != "none":
        lo, hi = -torch.rand(C) * 6, torch.rand(C) * 6
        amax = torch.maximum(lo.abs(), hi.abs())
        scale = amax / 127 if treatment != "per_tensor" else amax.max().reshape(1) / 127
        kw = {"logit_min": lo, "logit_max": hi, "logit_scale": scale}
        if treatment == "unclamped":
            kw.update(logit_min=None, logit_max=None)
    out = gate_log_decay_triton(logits, 16, clamp_min, **{k: v.to(DEVICE) if v is not None else None
                                                          for k, v in kw.items()})
    ref = gate_log_decay(logits.cpu(), 16, clamp_min, **kw)
    assert out.dtype == torch.float32 and out.shape == (M, C)
    assert torch.isfinite(out).all() and (out <= 0).all()
    # rounding to the int8 grid may flip at a tie between implementations: compare by elements
    close = torch.isclose(out.cpu(), ref, rtol=1e-5, atol=1e-6)
    assert close.float().mean() > 0.999


def test_gate_reference_is_the_modules_treatment():
    from laquant.quant.modules import QuantGate

    gate = QuantGate(torch.nn.Linear(8, 6), n_channels=6)
    gate.calibrate(-torch.rand(6) * 3, torch.rand(6) * 3)
    x = torch.randn(5, 8)
    expect = F.logsigmoid(gate(x).float()) / 16
    assert torch.equal(gate_log_decay(gate.project(x), 16, **gate.logit_treatment()), expect)
    t = gate.logit_treatment()
    assert torch.equal(gate(x), fake_quantize_int8(gate.project(x), t["logit_scale"], t["logit_min"], t["logit_max"]))


# ------------------------------------------------------------------------------ projection groups
def _group(K=96, sizes=(40, 24, 72), n_out=5, bias=(False, True, False)):
    owner = torch.nn.Module()
    outliers = torch.randperm(K)[:n_out]
    for i, (n, b) in enumerate(zip(sizes, bias)):
        lin = torch.nn.Linear(K, n, bias=b)
        setattr(owner, f"p{i}", QuantLinear.from_linear(lin.to(DTYPE), outliers).to(DEVICE))
    return owner, tuple(f"p{i}" for i in range(len(sizes))), outliers


def test_fused_group_equals_members(monkeypatch):
    from laquant.quant import fused

    monkeypatch.setattr(fused, "use_triton", lambda x: True)  # the fused path, interpreted on CPU
    owner, names, outliers = _group()
    x = _randn(7, 96)
    x[:, outliers] *= 20
    before = {k: v.clone() for k, v in owner.state_dict().items()}
    separate = [getattr(owner, n)(x) for n in names]
    outs = fused.project(owner, names, x)
    for a, b in zip(outs, separate):
        assert a.shape == b.shape and rel_err(a.float().cpu(), b.float().cpu()) < TOL
    # the members now hold row slices of one weight, and still save (and compare) as before
    assert owner.p1.qweight._base is not None and owner.p1.qweight._base is owner.p0.qweight._base
    after = owner.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert all(v._base is None for v in after.values())  # no shared storage for safetensors
    # a reload into the members is seen: the group is rebuilt from the new weights
    new_state = {k: (v.clone() if not k.endswith("qweight") else torch.randint_like(v, -100, 100))
                 for k, v in before.items()}
    owner.load_state_dict(new_state)
    refreshed = fused.project(owner, names, x)
    expect = [getattr(owner, n)(x) for n in names]
    for a, b in zip(refreshed, expect):
        assert rel_err(a.float().cpu(), b.float().cpu()) < TOL


def test_group_is_kept_until_a_member_changes(monkeypatch):
    from laquant.quant import fused

    monkeypatch.setattr(fused, "use_triton", lambda x: True)
    owner, names, _ = _group()
    x = _randn(3, 96)
    packed = fused.packed_group(owner, names, x)
    assert packed is not None and fused.packed_group(owner, names, x) is packed  # no re-check, no re-pack
    handle = owner.p1.register_forward_hook(lambda m, i, o: o * 2)  # a hook: the members run one by one
    assert fused.packed_group(owner, names, x) is None
    assert torch.equal(fused.project(owner, names, x)[1], owner.p1(x))
    handle.remove()
    assert fused.packed_group(owner, names, x) is packed
    owner.p2.weight_scale.mul_(2)  # an in-place change: packed again, from the new scales
    repacked = fused.packed_group(owner, names, x)
    assert repacked is not packed
    assert rel_err(fused.project(owner, names, x)[2].float().cpu(), owner.p2(x).float().cpu()) < TOL
    owner.p0.act_granularity = "none"  # the members no longer quantize alike: one by one
    assert fused.packed_group(owner, names, x) is None


def test_codes_hand_over_their_packed_weight(monkeypatch):
    """A norm's codes carry the packed weight they were made for (still unpacked as ``(xq, xs, xo)``), and the
    GEMM on them takes it without looking the group up again: the outputs equal the members'."""
    from laquant.quant import fused

    monkeypatch.setattr(fused, "use_triton", lambda x: True)
    owner, names, outliers = _group()
    x, w = _randn(4, 96, scale=3.0), _randn(96)
    x[:, outliers] *= 20
    packed = fused.w8a8_inputs(owner, names, x)
    normed, _, codes = rms_norm_triton(x, w, 1e-6, packed=packed)
    xq, xs, xo = codes
    assert codes.packed is packed and isinstance(codes, tuple) and xq.dtype == torch.int8

    def no_lookup(*args):
        raise AssertionError("the group was looked up again")

    monkeypatch.setattr(fused, "packed_group", no_lookup)
    outs = fused.project(owner, names, normed, codes)
    for a, n in zip(outs, names):
        assert rel_err(a.float().cpu(), getattr(owner, n)(normed).float().cpu()) < TOL


def test_members_with_different_outliers_run_alone(monkeypatch):
    from laquant.quant import fused

    monkeypatch.setattr(fused, "use_triton", lambda x: True)
    owner, names, _ = _group(sizes=(16, 16), bias=(False, False))
    owner.p1.outlier_idx.copy_((owner.p1.outlier_idx + 1) % 96)  # another column set
    x = _randn(3, 96)
    outs = fused.project(owner, names, x)
    assert owner.p0.qweight._base is None  # not fused
    for a, n in zip(outs, names):
        assert torch.equal(a, getattr(owner, n)(x))


# ------------------------------------------------------- activation codes written by the producer
def _packed(K, N, n_out=3):
    outliers = torch.randperm(K)[:n_out]
    return QuantLinear.from_linear(torch.nn.Linear(K, N).to(DTYPE), outliers).to(DEVICE).packed()


def _same_codes(codes, out, packed):
    """The codes equal quantize_rows' of ``out``, and PyTorch's per-token quantization of its kept
    columns (on the GPU the scale's division, absmax / 127, may round one ulp apart, moving a rare code by
    one); the outlier block holds the outlier columns."""
    from laquant.kernels.common.numerics import quantize_int8
    from laquant.kernels.gemm.int8 import quantize_rows

    rows = out.reshape(codes[0].shape[0], -1)
    xq, xs, xo = quantize_rows(rows, packed)
    n_out = packed.n_out  # without outliers the block is a placeholder, never read
    assert torch.equal(codes[0], xq) and torch.equal(codes[1], xs) and torch.equal(codes[2][:, :n_out], xo[:, :n_out])
    # the block's padding to OUTLIER_ALIGN columns meets zero weights: any finite value (0 or a copy of the last)
    assert torch.isfinite(codes[2][:, n_out:packed.outlier_idx.numel()]).all()
    n_keep = packed.n_keep
    kept = rows.float().cpu()[:, packed.source[:n_keep].long().cpu()]
    q, scale = quantize_int8(kept, dim=-1)
    got = codes[0].cpu().int()
    torch.testing.assert_close(codes[1].cpu(), scale.reshape(-1).float(), rtol=0 if INTERPRETED else 3e-7, atol=0)
    assert (got[:, :n_keep] - q.int()).abs().max() <= (0 if INTERPRETED else 1)
    assert (got[:, :n_keep] != q.int()).float().mean() < 1e-3
    assert not got[:, n_keep:].any()  # the padding to 16 columns
    assert torch.equal(codes[2][:, :n_out].cpu(), rows.cpu()[:, packed.outlier_idx[:n_out].long().cpu()])


@pytest.fixture(params=["scattered", "read back"])
def codes_path(request, monkeypatch):
    """The two ways a norm writes the codes of a GEMM with outlier columns: scattered from its registers
    (decode sizes) and read back from its stored row (prefill sizes; SwiGLU's always), forced here at a few
    tokens."""
    from laquant.kernels.rowwise import fused

    if request.param == "read back":
        monkeypatch.setattr(fused, "SCATTER_MAX_TOKENS", 0)
    return request.param


@pytest.fixture
def tiled_codes(monkeypatch):
    """The prefill sizes' codes path of the norms (several tokens a program), forced at a few tokens, four a
    program so that the last program's last tokens are past the end."""
    from laquant.kernels.rowwise import fused

    monkeypatch.setattr(fused, "TILED_CODES_MIN_TOKENS", 0)
    monkeypatch.setattr(fused, "TILED_TOKENS", 4)


@pytest.mark.parametrize("n_out", [1, 3])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_writes_the_gemms_codes_of_several_tokens_a_program(with_residual, n_out, tiled_codes):
    """A GEMM with outlier columns (without, one token a program stays: faster there)."""
    x, w = _randn(2, 5, 200, scale=3.0), _randn(200)
    x[1, 2, 7] = 40.0  # a token whose absmax sits in one column
    residual = _randn(2, 5, 200) if with_residual else None
    packed = _packed(200, 24, n_out)
    out, summed, codes = rms_norm_triton(x, w, 1e-6, residual, packed=packed)
    ref, ref_sum = rms_norm(x.cpu(), w.cpu(), 1e-6, None if residual is None else residual.cpu())
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    if residual is not None:
        assert rel_err(summed.float().cpu(), ref_sum.float()) < TOL
    _same_codes(codes, out, packed)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_gated_norm_of_one_row_a_token_writes_codes_of_several_tokens_a_program(activation, tiled_codes):
    """A gated norm whose token is one row (heads 1) takes the norms' prefill path too: the gate applied before
    the row is stored and read back."""
    x, g, w = _randn(3, 3, 1, 200, scale=2.0), _randn(3, 3, 1, 200), _randn(200)
    packed = _packed(200, 16, 4)
    out, codes = gated_rms_norm_triton(x, g, w, 1e-5, packed=packed, activation=activation)
    ref = gated_rms_norm(x.cpu(), g.cpu(), w.cpu(), 1e-5, activation=activation)
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    _same_codes(codes, out, packed)


@pytest.mark.parametrize("n_out", [0, 3])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_writes_the_gemms_codes(with_residual, n_out, codes_path):
    """With outlier columns (codes scattered to their packed positions) and without (in order)."""
    x, w = _randn(2, 5, 200, scale=3.0), _randn(200)
    residual = _randn(2, 5, 200) if with_residual else None
    packed = _packed(200, 24, n_out)
    assert packed.identity == (n_out == 0)
    out, summed, codes = rms_norm_triton(x, w, 1e-6, residual, packed=packed)
    ref, _ = rms_norm(x.cpu(), w.cpu(), 1e-6, None if residual is None else residual.cpu())
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    _same_codes(codes, out, packed)  # exactly what a quantization pass over out gives


@pytest.mark.parametrize("n_out", [0, 5])
def test_gated_norm_writes_codes_of_whole_tokens(n_out, codes_path):
    B, T, H, V = 2, 3, 3, 42  # three heads: rows per token not a power of two; 126 inputs: 2 columns of padding
    x, g, w = _randn(B, T, H, V), _randn(B, T, H, V), _randn(V)
    packed = _packed(H * V, 16, n_out)
    out, codes = gated_rms_norm_triton(x, g, w, 1e-5, packed=packed)
    assert rel_err(out.float().cpu(), gated_rms_norm(x.cpu(), g.cpu(), w.cpu(), 1e-5).float()) < TOL
    _same_codes(codes, out, packed)


@pytest.mark.parametrize("n_out", [0, 5])
def test_sigmoid_gated_norm_writes_codes_of_whole_tokens(n_out, codes_path):
    """Kimi Delta Attention's output norm, ``rmsnorm(o) * w * sigmoid(g)`` (the gate read in place out of a wider
    tensor), with its codes and without; the activation changes the output (not silu's form)."""
    B, T, H, V = 2, 3, 3, 40
    x, w = _randn(B, T, H, V), _randn(V)
    g = _randn(B, T, H, 2 * V)[..., V:]
    packed = _packed(H * V, 16, n_out)
    out, codes = gated_rms_norm_triton(x, g, w, 1e-5, packed=packed, activation="sigmoid")
    ref = gated_rms_norm(x.cpu(), g.contiguous().cpu(), w.cpu(), 1e-5, activation="sigmoid")
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    assert rel_err(ref.float(), gated_rms_norm(x.cpu(), g.contiguous().cpu(), w.cpu(), 1e-5).float()) > 0.05
    _same_codes(codes, out, packed)
    plain = gated_rms_norm_triton(x, g, w, 1e-5, activation="sigmoid")
    assert rel_err(plain.float().cpu(), ref.float()) < TOL
    with pytest.raises(ValueError, match="activation must be one of"):
        gated_rms_norm_triton(x, g, w, 1e-5, activation="tanh")


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
def test_sigmoid_gated_reference_is_transformers_kda_output_norm(family):
    """The reference with the sigmoid gate is transformers' KDA output norm of Kimi Linear and Ling / Ring, bit for
    bit on the CPU (float32 and bf16 inputs)."""
    module = pytest.importorskip(f"transformers.models.{family}.modeling_{family}")  # 5.17 has no bailing_hybrid
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RMSNormGated"))
    norm = cls(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.5)
    for dtype in (torch.float32, torch.bfloat16):
        x, z = (torch.randn(3, 5, 4, 64) * 3).to(dtype), (torch.randn(3, 5, 4, 64) * 2).to(dtype)
        assert torch.equal(gated_rms_norm(x, z, norm.weight, 1e-6, activation="sigmoid"), norm(x, z)), dtype


def test_gated_norm_reads_a_grouped_gate_in_place(codes_path):
    """qwen3_next: z read where in_proj_qkvz wrote it (per key head, G groups of R value heads, between other
    columns), a token's G * R rows spanning two strides; the codes are still per whole token."""
    T, G, R, V = 5, 3, 2, 24
    x, w = _randn(T, G, R, V), _randn(V)
    fused = _randn(T, G, 4 * R * V)  # per group: other columns, then this gate's R * V
    g = fused[..., 3 * R * V:].unflatten(-1, (R, V))
    packed = _packed(G * R * V, 16)
    out, codes = gated_rms_norm_triton(x, g, w, 1e-5, packed=packed, token_rows=G * R)
    ref = gated_rms_norm(x.cpu(), g.contiguous().cpu(), w.cpu(), 1e-5)
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    _same_codes(codes, out, packed)
    with pytest.raises(ValueError, match="whole tokens"):
        gated_rms_norm_triton(x, g, w, 1e-5, packed=packed, token_rows=4)


@pytest.mark.parametrize("n_out", [0, 5])
@pytest.mark.parametrize("round_normed", [True, False])
def test_gate_first_grouped_norm_writes_codes_of_whole_tokens(n_out, round_normed, codes_path):
    """Mamba2's gated norm (the gate first, groups of the token's row normalized apart, the normalized rows
    rounded before the weight) and Falcon-H1's gate-first one (no rounding before the weight), the gate read in
    place out of in_proj's output; the codes per whole token."""
    T, G, D = 5, 3, 40
    x, w = _randn(T, G, D), _randn(G, D)
    proj = _randn(T, 3 * G * D)  # in_proj: z first, then other columns
    z = proj[:, :G * D].unflatten(-1, (G, D))
    packed = _packed(G * D, 16, n_out)
    out, codes = gated_rms_norm_triton(x, z, w, 1e-5, packed=packed, gate_first=True, round_normed=round_normed)
    ref = gated_rms_norm(x.cpu(), z.contiguous().cpu(), w.cpu(), 1e-5, gate_first=True, round_normed=round_normed)
    assert rel_err(out.float().cpu(), ref.float()) < TOL
    assert rel_err(ref.float(), gated_rms_norm(x.cpu(), z.cpu(), w.cpu(), 1e-5).float()) > 0.05  # not fla's form
    _same_codes(codes, out, packed)
    plain = gated_rms_norm_triton(x, z, w, 1e-5, gate_first=True, round_normed=round_normed)  # no codes
    assert rel_err(plain.float().cpu(), ref.float()) < TOL
    with pytest.raises(ValueError, match="weight has 7 elements"):
        gated_rms_norm_triton(x, z, w.flatten()[:7], 1e-5, gate_first=True)


@pytest.mark.parametrize("family", ["bamba", "nemotron_h", "granitemoehybrid"])
def test_gate_first_reference_is_transformers_mamba_gated_norm(family):
    """The reference's gate-first form is transformers' ``MambaRMSNormGated`` of these families, group by
    group, bit for bit (bf16); the classes of transformers versions before the groups (no ``group_size``: one
    group, the whole row, as Mamba2Mixer.norm_and_out takes them) too."""
    import importlib
    import inspect

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RMSNormGated"))
    grouped = "group_size" in inspect.signature(cls.__init__).parameters
    G, D = (4, 32) if grouped else (1, 128)
    norm = (cls(G * D, group_size=D, eps=1e-5) if grouped else cls(G * D, eps=1e-5)).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(G * D))
    x, z = (torch.randn(3, 2, G * D) * 3).bfloat16(), (torch.randn(3, 2, G * D) * 2).bfloat16()
    got = gated_rms_norm(x.unflatten(-1, (G, D)), z.unflatten(-1, (G, D)), norm.weight.view(G, D), 1e-5,
                         gate_first=True, round_normed=True)
    assert torch.equal(got.flatten(-2), norm(x, z))


@pytest.mark.parametrize("n_out", [0, 7])
def test_swiglu_writes_the_down_projections_codes(n_out):
    y = _randn(7, 2 * 300, scale=2.0)
    gate, up = y.split(300, dim=-1)
    packed = _packed(300, 40, n_out)
    out, codes = swiglu_triton(gate, up, packed)
    assert rel_err(out.float().cpu(), swiglu(gate.cpu(), up.cpu()).float()) < TOL
    _same_codes(codes, out, packed)


@pytest.mark.gpu
@pytest.mark.parametrize("n_out", [0, 16])
def test_prefill_sized_codes_are_a_quantization_pass(n_out):
    """At a prefill's token count (above TILED_CODES_MIN_TOKENS, as the model runs them, bf16): the norm's
    and SwiGLU's codes equal quantize_rows' of their output, GLA 1.37B's widths and a 7B's."""
    from laquant.kernels.rowwise.fused import TILED_CODES_MIN_TOKENS

    M = TILED_CODES_MIN_TOKENS + 261
    for width in (2048, 4096):
        x, r, w = _randn(M, width, scale=2.0), _randn(M, width), _randn(width)
        packed = _packed(width, 64, n_out)
        out, _, codes = rms_norm_triton(x, w, 1e-6, r, packed=packed)
        _same_codes(codes, out, packed)
    for width in (5632, 11008):
        y = _randn(M, 2 * width, scale=2.0)
        gate, up = y.split(width, dim=-1)
        packed = _packed(width, 64, n_out)
        out, codes = swiglu_triton(gate, up, packed)
        assert rel_err(out.float().cpu(), swiglu(gate.cpu(), up.cpu()).float()) < TOL
        _same_codes(codes, out, packed)


def test_codes_of_a_7b_wide_row():
    """A 7B model's down_proj (11,008 inputs: above 8,192, one program of 16 warps holds the row): SwiGLU's
    codes equal quantize_rows', and both equal PyTorch's per-token quantization of the kept columns."""
    from laquant.kernels.rowwise.fused import MAX_CODES_WIDTH, codes_fit

    y = _randn(3, 2 * 11008, scale=2.0)
    gate, up = y.split(11008, dim=-1)
    packed = _packed(11008, 16)
    assert codes_fit(packed) and packed.qweight.shape[1] <= MAX_CODES_WIDTH
    out, codes = swiglu_triton(gate, up, packed)
    _same_codes(codes, out, packed)


def test_codes_for_the_wrong_gemm_are_refused():
    with pytest.raises(ValueError, match="codes for a GEMM of 64 inputs"):
        rms_norm_triton(_randn(3, 200), _randn(200), 1e-6, packed=_packed(64, 8))


@pytest.mark.parametrize("M,K,R,C,scaling,clamp_min", [(3, 200, 16, 72, "per_channel", None),
                                                       (37, 96, 12, 40, "per_tensor", -2.0)])
def test_low_rank_gate_in_one_kernel(M, K, R, C, scaling, clamp_min):
    """Both weight-only int8 projections of a quantized low-rank gate and its tail in one kernel,
    against the modules' own path (each W8A16 output rounded as the module returns it, then the
    tail's reference)."""
    from laquant.kernels.gla.gate import low_rank_gate_log_decay_triton
    from laquant.quant.fused import low_rank_gate
    from laquant.quant.modules import QuantGate

    gen = torch.Generator().manual_seed(M)
    first, second = torch.nn.Linear(K, R, bias=False), torch.nn.Linear(R, C)
    with torch.no_grad():
        for lin in (first, second):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * 0.1)
        second.bias.copy_(torch.randn(C, generator=gen))
    none = torch.zeros(0, dtype=torch.long)
    gate = QuantGate(QuantLinear.from_linear(first.to(DTYPE), none, act_granularity="none"),
                     QuantLinear.from_linear(second.to(DTYPE), none, act_granularity="none"),
                     n_channels=C, scaling=scaling)
    gate.calibrate(-torch.rand(C, generator=gen) * 4 - 1, torch.rand(C, generator=gen) * 2)
    gate = gate.to(DEVICE)
    x = (torch.randn(M, K, generator=gen) * 2).to(DEVICE, DTYPE)
    treatment = gate.logit_treatment()
    out = low_rank_gate_log_decay_triton(x, gate[0].packed(), gate[1].packed(), 16, clamp_min, **treatment)
    cpu = gate.cpu()
    ref = gate_log_decay(cpu.project(x.cpu()), 16, clamp_min, **cpu.logit_treatment())
    assert out.dtype == torch.float32 and out.shape == (M, C)
    assert rel_err(out.cpu(), ref) < (1e-5 if INTERPRETED else 1e-2)
    if not INTERPRETED:
        assert low_rank_gate(gate.to(DEVICE), x) is not None  # the model's gate takes this kernel


def test_low_rank_gate_refuses_what_it_cannot_fuse():
    from laquant.kernels.gla.gate import low_rank_gate_log_decay_triton

    first = QuantLinear.from_linear(torch.nn.Linear(32, 8, bias=False), torch.tensor([3]), act_granularity="none")
    second = QuantLinear.from_linear(torch.nn.Linear(8, 16), torch.zeros(0, dtype=torch.long), act_granularity="none")
    with pytest.raises(ValueError, match="outlier"):
        low_rank_gate_log_decay_triton(torch.randn(2, 32), first.packed(), second.packed(), 16)
