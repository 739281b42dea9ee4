"""The gated delta rule's one-launch gate tail (laquant.kernels.delta.gating) against its PyTorch spec
(interpreted on CPU, float32); test_quantizing_rowwise runs it inside the hybrids' models."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.kernels.delta.gating import gdn_gating

triton = require_triton_kernels()
from laquant.kernels.delta.gating import gdn_gating_triton  # noqa: E402

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16


def _treatment(C, per_channel, bounds, gen):
    lo = -torch.rand(C, generator=gen) * 4 - 1
    hi = torch.rand(C, generator=gen) * 4 + 1
    amax = torch.maximum(lo.abs(), hi.abs())
    scale = amax / 127 if per_channel else amax.max().reshape(1) / 127
    return {"logit_min": lo.to(DEVICE) if bounds else None, "logit_max": hi.to(DEVICE) if bounds else None,
            "logit_scale": scale.to(DEVICE)}


@pytest.mark.parametrize("lead", [(2, 3), (1, 1), (5,)])
@pytest.mark.parametrize("quant", [None, "per_channel", "per_tensor_no_bounds"])
def test_fused_ba_layout(lead, quant):
    """qwen3_next's in_proj_ba: per key head, r beta logits then r decay logits; the treatment over all 2H
    channels; a and b read as strided views, the treatment's tensors viewed the same way."""
    gen = torch.Generator().manual_seed(len(lead) * 7 + (quant or "").__len__())
    Hk, r = 3, 2
    ba = (torch.randn(*lead, Hk * 2 * r, generator=gen) * 5).to(DEVICE, DTYPE)  # past the calibrated bounds too
    A_log = torch.randn(Hk * r, generator=gen).to(DEVICE)
    dt_bias = torch.randn(Hk * r, generator=gen).to(DEVICE)
    t = None if quant is None else _treatment(Hk * 2 * r, quant == "per_channel", quant == "per_channel", gen)
    grouped = ba.unflatten(-1, (Hk, 2 * r))

    def view(part):
        if t is None:
            return None
        return {k: None if v is None else v if v.numel() == 1 else v.view(Hk, 2 * r)[:, part] for k, v in t.items()}

    a, b = grouped[..., r:], grouped[..., :r]
    g, beta = gdn_gating_triton(a, b, A_log, dt_bias, a_treatment=view(slice(r, None)), b_treatment=view(slice(0, r)))
    g_ref, beta_ref = gdn_gating(a.cpu(), b.cpu(), A_log.cpu(), dt_bias.cpu(),
                                 a_treatment=None if t is None else {k: None if v is None else v.cpu() for k, v in
                                                                     view(slice(r, None)).items()},
                                 b_treatment=None if t is None else {k: None if v is None else v.cpu() for k, v in
                                                                     view(slice(0, r)).items()})
    assert g.shape == beta.shape == (*lead, Hk * r) and g.dtype == beta.dtype == torch.float32
    assert torch.isfinite(g).all() and torch.isfinite(beta).all() and (g <= 0).all()
    assert rel_err(g.cpu(), g_ref) < 1e-5 and rel_err(beta.cpu(), beta_ref) < 1e-5
    if t is not None:  # the treatment changed the logits: the untreated tail is far from it
        assert rel_err(g.cpu(), gdn_gating(a.cpu(), b.cpu(), A_log.cpu(), dt_bias.cpu())[0]) > 1e-3


def test_separate_projections_and_beta_scale():
    """Qwen3.5 / OLMo: a and b from their own projections, [..., 1, H]; beta doubled (allow_neg_eigval)."""
    gen = torch.Generator().manual_seed(1)
    H = 5
    a, b = ((torch.randn(4, 7, 1, H, generator=gen) * 3).to(DEVICE, DTYPE) for _ in range(2))
    A_log, dt_bias = torch.randn(H, generator=gen).to(DEVICE), torch.randn(H, generator=gen).to(DEVICE)
    t = _treatment(H, True, True, gen)
    t = {k: v.view(1, H) for k, v in t.items()}
    g, beta = gdn_gating_triton(a, b, A_log, dt_bias, beta_scale=2.0, a_treatment=t)
    g_ref, beta_ref = gdn_gating(a.cpu(), b.cpu(), A_log.cpu(), dt_bias.cpu(), beta_scale=2.0,
                                 a_treatment={k: v.cpu() for k, v in t.items()})
    assert rel_err(g.cpu(), g_ref) < 1e-5 and rel_err(beta.cpu(), beta_ref) < 1e-5
    assert beta.max() > 1.0  # doubled


@pytest.mark.parametrize("quant", [None, "per_channel", "per_tensor"])
def test_kda_forget_gate_per_channel_with_a_rate_per_head(quant):
    """Kimi Delta Attention's forget gate: decay logits [..., H, K] read out of a wider tensor, dt_bias per channel,
    A_log per head (broadcast over its K channels), no beta; the treatment per channel viewed [H, K]."""
    gen = torch.Generator().manual_seed(5)
    H, K = 3, 24
    wide = (torch.randn(2, 5, H * K + 7, generator=gen) * 4).to(DEVICE, DTYPE)
    a = wide[..., 7:].unflatten(-1, (H, K))
    A_log, dt_bias = torch.randn(H, generator=gen).to(DEVICE), torch.randn(H * K, generator=gen).to(DEVICE)
    t = None if quant is None else {k: None if v is None else v if v.numel() == 1 else v.view(H, K)
                                    for k, v in _treatment(H * K, quant == "per_channel", True, gen).items()}
    g, beta = gdn_gating_triton(a, None, A_log, dt_bias, a_treatment=t)
    cpu = None if t is None else {k: v.cpu() for k, v in t.items()}
    g_ref, beta_ref = gdn_gating(a.cpu(), None, A_log.cpu(), dt_bias.cpu(), a_treatment=cpu)
    assert beta is None and beta_ref is None and g.shape == (2, 5, H * K) and g.dtype == torch.float32
    assert torch.isfinite(g).all() and (g <= 0).all()
    assert rel_err(g.cpu(), g_ref) < 1e-5
    # the per-head rate is each head's exp(A_log) on all its channels
    untreated = gdn_gating(a.cpu(), None, A_log.cpu(), dt_bias.cpu())[0].unflatten(-1, (H, K))
    expected = -A_log.cpu().exp()[:, None] * torch.nn.functional.softplus(a.cpu().float() + dt_bias.cpu().view(H, K))
    assert torch.equal(untreated, expected)
    with pytest.raises(ValueError, match="one value per group"):
        gdn_gating_triton(a, None, torch.zeros(H + 1, device=DEVICE), dt_bias)
    with pytest.raises(ValueError, match="one value per group"):
        gdn_gating(a.cpu(), None, torch.zeros(H + 1), dt_bias.cpu())
    with pytest.raises(ValueError, match="without them"):
        gdn_gating_triton(a, None, A_log, dt_bias, b_treatment={"logit_min": None, "logit_max": None,
                                                                 "logit_scale": torch.ones(1, device=DEVICE)})


def test_refuses_mismatched_shapes():
    a = torch.randn(2, 3, 4, device=DEVICE)
    with pytest.raises(ValueError, match="one shape"):
        gdn_gating_triton(a, a[..., :2], torch.zeros(12, device=DEVICE), torch.zeros(12, device=DEVICE))
    bad = {"logit_min": torch.zeros(12, device=DEVICE), "logit_max": torch.zeros(12, device=DEVICE),
           "logit_scale": torch.ones(12, device=DEVICE)}
    with pytest.raises(ValueError, match=r"\[G, R\]"):
        gdn_gating_triton(a, a, torch.zeros(12, device=DEVICE), torch.zeros(12, device=DEVICE), a_treatment=bad)
