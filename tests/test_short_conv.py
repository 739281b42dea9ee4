"""A decode token's short conv in one kernel (laquant.kernels.conv.short_conv): the spec against the model's
F.conv1d path, the kernel against the spec (interpreted on CPU, float32; bf16 on the GPU), and the kernel
inside a qwen3_next model, where it also gathers q, k and v out of the fused projection."""

import pytest
import torch
import torch.nn as nn

from conftest import DEVICE, INTERPRETED, greedy_decode_steps, rel_err, require_triton_kernels
from laquant.kernels.conv.short_conv import short_conv_step
from laquant.models.hybrid_mixers import short_conv

triton = require_triton_kernels()
from laquant.kernels.conv.short_conv import short_conv_step_triton  # noqa: E402

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16


class _Store:
    """A state store as short_conv reads it: the kept inputs per layer, a static (graphed) cache or not."""

    def __init__(self, static):
        self.conv, self.static = {}, static


def _conv(C, W, bias, gen, dtype):
    conv = nn.Conv1d(C, C, W, groups=C, bias=bias, padding=W - 1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(C, 1, W, generator=gen) * 0.5)
        if bias:
            conv.bias.copy_(torch.randn(C, generator=gen))
    return conv.to(DEVICE, dtype)


@pytest.mark.parametrize("B,C,W", [(3, 37, 4), (1, 130, 2), (5, 8, 3)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
def test_spec_is_the_model_path(B, C, W, bias, activation):
    """short_conv_step equals short_conv's F.conv1d path for one token after a prompt, kept inputs included
    (the CPU: the reference path runs there)."""
    gen = torch.Generator().manual_seed(B * 100 + C + W)
    conv = _conv(C, W, bias, gen, torch.float32).cpu()
    store = _Store(static=False)
    prompt, token = torch.randn(B, 6, C, generator=gen), torch.randn(B, 1, C, generator=gen)
    short_conv(prompt, store, 0, conv, activation)
    kept = store.conv[0].clone()
    want = short_conv(token, store, 0, conv, activation)[:, 0]
    state = kept.clone()
    got = short_conv_step(token[:, 0], state, conv.weight.view(C, W), conv.bias, activation)
    assert rel_err(got, want) < 1e-6
    assert torch.equal(state, store.conv[0])


@pytest.mark.parametrize("B,C,W,N", [(3, 37, 4, 37), (2, 300, 4, 333), (1, 1100, 2, 1100), (4, 24, 3, 50)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("in_place", [True, False])
def test_kernel_matches_spec(B, C, W, N, bias, in_place):
    """Odd channel counts, a gather of scattered columns out of a wider strided row (N > C), both widths,
    state updated in place or into another tensor."""
    gen = torch.Generator().manual_seed(B * 1000 + C + N)
    conv = _conv(C, W, bias, gen, DTYPE)
    rows = torch.randn(B, 2 * N, generator=gen).to(DEVICE, DTYPE)
    x = rows[:, ::2]  # strided: every other column of a wider buffer
    cols = None if N == C else torch.randperm(N, generator=gen)[:C].to(DEVICE, torch.int32)
    state = torch.randn(B, W - 1, C, generator=gen).to(DEVICE, DTYPE)
    weight = conv.weight.view(C, W)
    ref_state = state.clone()
    want = short_conv_step(x, ref_state, weight, conv.bias, "silu", cols)
    out_state = state if in_place else torch.empty_like(state)
    before = state.clone()
    got = short_conv_step_triton(x, state, weight, conv.bias, "silu", cols, state_out=None if in_place else out_state)
    assert got.dtype == x.dtype and got.shape == (B, C) and torch.isfinite(got).all()
    assert rel_err(got.float(), want.float()) < (1e-6 if DTYPE == torch.float32 else 1e-2)
    assert torch.equal(out_state, ref_state)  # the shift is a copy: exact
    if not in_place:
        assert torch.equal(state, before)


def test_refuses_bad_input():
    state = torch.randn(2, 3, 8, device=DEVICE)
    weight = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(ValueError, match="activation"):
        short_conv_step_triton(torch.randn(2, 8, device=DEVICE), state, weight, None, "gelu")
    with pytest.raises(ValueError, match="cols"):
        short_conv_step_triton(torch.randn(2, 9, device=DEVICE), state, weight, None, "silu")
    with pytest.raises(TypeError, match="int32"):
        short_conv_step_triton(torch.randn(2, 9, device=DEVICE), state, weight, None, "silu",
                               torch.arange(8, device=DEVICE))
    with pytest.raises(ValueError, match="does not fit"):
        short_conv_step_triton(torch.randn(2, 8, device=DEVICE), state, torch.randn(8, 3, device=DEVICE), None, "silu")


@pytest.mark.parametrize("static", [False, True])
@torch.no_grad()
def test_model_decode_steps_take_the_kernel(static, monkeypatch):
    """In a qwen3_next laquant model (float32, two key heads of two value heads each), each decode step's conv is
    the one kernel, reading q, k and v out of in_proj_qkvz's per-key-head layout in place, on the dynamic cache
    and on the static one a graph replays; the logits equal transformers' own model's over the whole sequence.
    The prompt keeps short_conv's PyTorch path (more than one token)."""
    import copy

    import laquant.kernels.conv.short_conv as module
    import test_hybrid
    from laquant.adapters import install
    from laquant.models import hybrid_mixers

    torch.manual_seed(0)
    reference = test_hybrid.qwen3_next(linear_num_key_heads=2, linear_num_value_heads=4).float().eval().to(DEVICE)
    model = copy.deepcopy(reference)
    install(model)
    ids = torch.randint(0, test_hybrid.VOCAB, (2, 9), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    calls = []
    real = module.short_conv_step_triton
    monkeypatch.setattr(module, "short_conv_step_triton", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    if INTERPRETED:  # the mixers' side only: the state kernels keep their references
        monkeypatch.setattr(hybrid_mixers, "use_triton", lambda x, state_format=None: state_format is None)
    got, seq = greedy_decode_steps(model, ids, static=static)
    assert len(calls) == 3 * 3 and all(cols is not None for cols in calls)  # 3 linear-attention layers, 3 steps
    want = reference(input_ids=seq).logits[:, ids.shape[1] - 1:]
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-4
