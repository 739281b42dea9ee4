"""The rotary embedding's cos and sin in one launch (laquant.kernels.attention.rotary, laquant.models.fused_rotary):
the spec against each table class's transformers forward, the kernel against the spec (interpreted on CPU; on the GPU
at a model's size), and the installed forward with its first-use check."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from test_hybrid import VOCAB, _model

from laquant.adapters import get_adapter, install
from laquant.adapters.hybrid import _resolve
from laquant.kernels.attention.rotary import rotary_cos_sin
from laquant.models import fused_rotary

FAMILIES = ("qwen3_next", "bailing_hybrid", "minimax", "bamba", "granitemoehybrid", "falcon_h1", "zamba2",
            "olmo_hybrid")


def _text_model(family):
    try:
        model = _model(family)
    except (AttributeError, ImportError, KeyError):
        pytest.skip(f"this transformers has no {family}")
    install(model)
    return model, _resolve(model, get_adapter(model).prefix)


def _present(family) -> bool:
    try:
        _model(family)
    except (AttributeError, ImportError, KeyError, pytest.skip.Exception):
        return False
    return True


@pytest.fixture
def fresh_checks(monkeypatch):
    """The kernel taken on this device (interpreted on CPU), each class checked anew."""
    monkeypatch.setattr(fused_rotary, "_CHECKED", {})
    monkeypatch.setattr(fused_rotary, "use_triton", lambda x, state_format=None: True)


@torch.no_grad()
def test_the_spec_is_each_table_class_forward():
    """Every class in ROTARIES computes rotary_cos_sin with its table's output dtype, bit for bit on the CPU, in
    float32 and bfloat16, positions to 40,000."""
    seen = {}
    present = [family for family in FAMILIES if _present(family)]  # transformers 5.17 has no Ling / Ring
    for family in present:
        _, text = _text_model(family)
        rotary = text.rotary_emb
        assert isinstance(rotary, fused_rotary._FusedRotary), family
        seen[rotary._laquant_base.__name__] = rotary
    assert len(seen) == len(present) and set(seen) <= set(fused_rotary.ROTARIES)
    if len(present) == len(FAMILIES):
        assert sorted(seen) == sorted(fused_rotary.ROTARIES)  # every row is checked
    positions = torch.randint(0, 40000, (3, 7), generator=torch.Generator().manual_seed(0))
    for name, rotary in seen.items():
        for dtype in (torch.float32, torch.bfloat16):
            rotary.to(dtype)  # the buffers as a model cast to that dtype holds them
            x = torch.randn(3, 7, 16, dtype=dtype)
            out = x.dtype if fused_rotary.ROTARIES[name] == "input" else torch.float32
            want = rotary_cos_sin(positions, rotary.inv_freq, rotary.attention_scaling, out)
            got = rotary._laquant_base.forward(rotary, x, positions)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (name, dtype)


@pytest.mark.parametrize("shape, half, dtype", [((2, 5), 32, torch.float32), ((1, 1), 5, torch.float32),
                                                ((3, 0), 8, torch.float32),
                                                pytest.param((64, 1), 32, torch.bfloat16, marks=pytest.mark.gpu),
                                                pytest.param((2, 4096), 64, torch.bfloat16, marks=pytest.mark.gpu)])
def test_kernel_matches_the_spec(shape, half, dtype):
    require_triton_kernels()
    from laquant.kernels.attention.rotary import rotary_cos_sin_triton

    gen = torch.Generator().manual_seed(half)
    positions = torch.randint(0, 100000, shape, generator=gen).to(DEVICE)
    inv_freq = (1.0 / (10000 ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half)))).to(DEVICE)
    got = rotary_cos_sin_triton(positions, inv_freq, 1.25, dtype)
    want = rotary_cos_sin(positions, inv_freq, 1.25, dtype)
    for g, w in zip(got, want):
        assert g.shape == (*shape, 2 * half) and g.dtype == dtype and torch.isfinite(g).all()
        if g.numel():
            assert rel_err(g, w) < (1e-6 if dtype == torch.float32 else 4e-3)
            if not INTERPRETED:  # libdevice's cosf / sinf, as CUDA's: within an ulp of the dtype at most
                assert fused_rotary.outputs_agree(g, w) is None
    with pytest.raises(ValueError, match="integer position_ids"):
        rotary_cos_sin_triton(positions.float(), inv_freq, 1.0, dtype)
    # a model cast to bf16 casts its inv_freq too: taken to float32 as transformers' forward takes it
    low = inv_freq.to(torch.bfloat16)
    got = rotary_cos_sin_triton(positions, low, 1.0, torch.float32)
    want = rotary_cos_sin(positions, low, 1.0, torch.float32)
    assert all(rel_err(g, w) < 1e-6 for g, w in zip(got, want) if g.numel())


@torch.no_grad()
def test_the_installed_forward_takes_the_kernel_after_its_check(fresh_checks, monkeypatch):
    require_triton_kernels()
    from laquant.kernels.attention import rotary as kernels

    model, text = _text_model("qwen3_next")
    model.to(DEVICE)
    rotary = text.rotary_emb
    calls = []
    real = kernels.rotary_cos_sin_triton
    monkeypatch.setattr(kernels, "rotary_cos_sin_triton", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(2, 6, 16, device=DEVICE)
    positions = torch.arange(6, device=DEVICE).expand(2, 6) + torch.tensor([[0], [9]], device=DEVICE)
    theirs = rotary._laquant_base.forward(rotary, x, positions)
    ours, again = rotary(x, positions), rotary(x, positions)
    assert calls == [1, 1] and fused_rotary._CHECKED == {rotary._laquant_base: True}
    assert all(fused_rotary.outputs_agree(a, b) is None for a, b in zip(ours, theirs))
    assert all(torch.equal(a, b) for a, b in zip(ours, again))
    # the whole model through it: transformers' logits
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got = model(ids).logits
    monkeypatch.setenv("LAQUANT_FUSED_ROTARY", "0")
    assert rel_err(got, model(ids).logits) < 1e-6 and len(calls) == 3
    monkeypatch.delenv("LAQUANT_FUSED_ROTARY")
    rotary.rope_type = "dynamic"  # a rope that updates its frequencies keeps transformers' forward
    rotary(x, positions)
    assert len(calls) == 3


@torch.no_grad()
def test_a_class_that_differs_keeps_transformers_forward(fresh_checks, monkeypatch):
    require_triton_kernels()
    from laquant.kernels.attention import rotary as kernels

    model, text = _text_model("minimax")
    rotary = text.rotary_emb.to(DEVICE)
    real = kernels.rotary_cos_sin_triton
    monkeypatch.setattr(kernels, "rotary_cos_sin_triton", lambda *a: tuple(t * 1.01 for t in real(*a)))
    x, positions = torch.randn(1, 4, 8, device=DEVICE), torch.arange(4, device=DEVICE)[None]
    theirs = rotary._laquant_base.forward(rotary, x, positions)
    with pytest.warns(UserWarning, match="fused forward of MiniMaxRotaryEmbedding does not reproduce"):
        first = rotary(x, positions)
    second = rotary(x, positions)
    assert fused_rotary._CHECKED == {rotary._laquant_base: False}
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, second, theirs))
