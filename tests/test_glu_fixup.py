"""A per-group MLP's gate/up GEMM writing down's codes in its split-K fixup (``kernels/gemm/glu.py``): the same
activation, codes, scales and outlier values as the GEMM followed by the GLU kernel, bit for bit (CPU under Triton's
interpreter, and the GPU); the model path with ``LAQUANT_GLU_FIXUP=1``."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.quant.modules import QuantLinear
from test_per_group_gemm import DTYPE, _linear, _outliers


def _module(K, N, n_out, seed, bias=False, outliers=None):
    """A per-group QuantLinear on the test device (``outliers``: these columns, else ``n_out`` random ones)."""
    outliers = _outliers(K, n_out, seed) if outliers is None else outliers
    return QuantLinear.from_linear(_linear(K, N, bias, seed, DTYPE), outliers,
                                   act_granularity="per_group").to(DEVICE), outliers


@pytest.mark.parametrize("M,K,NA,n_in,n_down,split,act", [(3, 300, 256, 5, 3, 2, "silu"),
                                                          (17, 256, 384, 0, 0, 1, "silu"),
                                                          (2, 256, 300, 4, 2, 3, "sigmoid"),
                                                          (65, 384, 256, 20, 70, 2, "silu")])
def test_glu_fixup_equals_the_gemm_then_the_glu_kernel(M, K, NA, n_in, n_down, split, act):
    """gate and up stacked as the model fuses them (``[gate; up]``), down's per-group weight with its outlier columns
    (70: more than one outlier block), 65 tokens: two row blocks; 300 activation columns: a short last group. The
    reference: gate's and up's split-K GEMMs on the same tiles (each from its first row, as the fixup's tiles fall),
    then the GLU kernel. (Under the interpreter a tile's float products may sum in another order where its columns
    fall elsewhere in it.)"""
    require_triton_kernels()
    from laquant.kernels.gemm import int8
    from laquant.kernels.gemm.glu import glu_codes_triton, glu_config
    from laquant.kernels.rowwise.fused import glu_triton
    from laquant.quant.fused import _fuse

    gate, outliers = _module(K, NA, n_in, seed=1)
    up, _ = _module(K, NA, n_in, seed=4, outliers=outliers)
    down, _ = _module(NA, 40, n_down, seed=2)
    p, pd = _fuse([gate, up]), down.packed()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(M, K, generator=gen)
    x[:, outliers] *= 30
    codes = int8.quantize_groups(x.to(DEVICE, DTYPE), p)
    cfg = dict(glu_config(M, NA, p.qweight.shape[1], p.group, pd.group, torch.device(DEVICE)), SPLIT_K=split,
               num_stages=2)
    halves = []
    for m in (gate, up):
        y = torch.empty(M, NA, dtype=DTYPE, device=DEVICE)
        int8.int8_gemm(*codes, m.packed(), y, dict(BM=cfg["BM"], BN=cfg["BN"], BK=cfg["BK"], SPLIT_K=split,
                                                   FIXUP=True, num_warps=cfg["num_warps"], num_stages=2))
        halves.append(y)
    h_ref, ref = glu_triton(*halves, pd, act)
    h, out = glu_codes_triton(codes, p, pd, act, cfg)
    assert out.packed is pd and torch.isfinite(h.float()).all()
    assert torch.equal(h, h_ref)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert torch.equal(out[2][:, :n_down], ref[2][:, :n_down]) and not out[2][:, n_down:pd.outlier_idx.numel()].any()
    assert out[0].abs().max() > 100  # codes that use the range: the test compares something


def test_glu_fixup_takes_only_what_fits():
    require_triton_kernels()
    from laquant.kernels.gemm.glu import glu_fixup_fits

    gate_up, _ = _module(256, 512, 0, seed=1)
    down, _ = _module(256, 40, 0, seed=2)
    assert glu_fixup_fits(gate_up.packed(), down.packed(), 64)
    assert not glu_fixup_fits(gate_up.packed(), down.packed(), 257)  # prefill sizes: the tiled GEMM
    assert not glu_fixup_fits(gate_up.packed(), _module(128, 40, 0, seed=2)[0].packed(), 64)  # down reads 128
    with_bias, _ = _module(256, 512, 0, seed=1, bias=True)
    assert not glu_fixup_fits(with_bias.packed(), down.packed(), 64)


@torch.no_grad()
def test_gla_per_group_mlp_takes_the_fixup_when_asked(monkeypatch):
    """The GLA model's GPU wiring on the CPU under the interpreter: with LAQUANT_GLU_FIXUP=1 each MLP runs the fixup
    launch (no GLU kernel) and the logits equal those of the two launches to float rounding (the tiles differ)."""
    if not INTERPRETED:
        pytest.skip("checks the wiring under TRITON_INTERPRET=1")
    from test_per_group_gemm import _interpreted_gla_kernels, _per_group_gla

    from laquant.kernels.gemm import glu
    from laquant.kernels.rowwise import fused as rowwise

    model = _per_group_gla(vocab=128, calib_len=32)
    ids = torch.randint(0, 128, (2, 3))
    _interpreted_gla_kernels(monkeypatch)
    two_launches = model(ids).logits
    calls = {"fixup": 0, "glu": 0}
    real_fixup, real_glu = glu.glu_codes_triton, rowwise.glu_triton
    monkeypatch.setattr(glu, "glu_codes_triton", lambda *a, **k: calls.update(fixup=calls["fixup"] + 1)
                        or real_fixup(*a, **k))
    monkeypatch.setattr(rowwise, "glu_triton", lambda *a, **k: calls.update(glu=calls["glu"] + 1) or real_glu(*a, **k))
    monkeypatch.setenv("LAQUANT_GLU_FIXUP", "1")
    fixed = model(ids).logits
    assert calls == {"fixup": 2, "glu": 0}  # one a layer
    assert torch.isfinite(fixed).all() and rel_err(fixed, two_launches) < 1e-5
