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
    The prompt's conv is one kernel too (short_conv_triton), gathering the same columns."""
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

    calls, prompts = [], []
    real, real_prompt = module.short_conv_step_triton, module.short_conv_triton
    monkeypatch.setattr(module, "short_conv_step_triton", lambda *a, **k: calls.append(a[5]) or real(*a, **k))
    monkeypatch.setattr(module, "short_conv_triton", lambda *a, **k: prompts.append(a[5]) or real_prompt(*a, **k))
    if INTERPRETED:  # the mixers' side only: the state kernels keep their references
        monkeypatch.setattr(hybrid_mixers, "use_triton", lambda x, state_format=None: state_format is None)
    got, seq = greedy_decode_steps(model, ids, static=static)
    assert len(calls) == 3 * 3 and all(cols is not None for cols in calls)  # 3 linear-attention layers, 3 steps
    assert len(prompts) == 3 and all(cols is not None for cols in prompts)  # the prompt, each layer
    want = reference(input_ids=seq).logits[:, ids.shape[1] - 1:]
    assert torch.isfinite(got).all() and rel_err(got, want) < 1e-4


# ------------------------------------------------------------------------------------------------ a prompt's conv
@pytest.mark.parametrize("B,T,C,W", [(2, 9, 37, 4), (1, 2, 130, 4), (3, 5, 8, 3), (1, 40, 24, 2)])
@pytest.mark.parametrize("prev", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("masked", [False, True])
def test_prompt_spec_is_the_model_path(B, T, C, W, prev, activation, masked):
    """short_conv_reference equals short_conv's F.conv1d path for a prompt, after kept inputs or from none, with a
    padding mask or none, the kept inputs included (the CPU: the reference path runs there)."""
    from laquant.kernels.conv.short_conv import short_conv_reference

    gen = torch.Generator().manual_seed(B * 100 + T + C + W)
    conv = _conv(C, W, True, gen, torch.float32).cpu()
    store = _Store(static=False)
    if prev:
        short_conv(torch.randn(B, 3, C, generator=gen), store, 0, conv, activation)
    kept = store.conv.get(0)
    kept = kept.clone() if kept is not None else None
    x = torch.randn(B, T, C, generator=gen)
    mask = _token_mask(B, T, gen) if masked else None
    store.token_mask = mask
    want = short_conv(x, store, 0, conv, activation)
    got, got_kept = short_conv_reference(x, kept, conv.weight.view(C, W), conv.bias, activation, mask=mask)
    assert rel_err(got, want) < 1e-6
    assert torch.equal(got_kept, store.conv[0])


def _token_mask(B, T, gen):
    """A float mask of padding at the end of some rows (a graphed prefill's), one row without any real token."""
    mask = torch.ones(B, T)
    for row in range(B):
        mask[row, int(torch.randint(0, T + 1, (1,), generator=gen)):] = 0.0
    return mask


@pytest.mark.parametrize("B,T,C,W,N", [(2, 9, 37, 4, 37), (1, 70, 300, 4, 333), (3, 2, 24, 4, 50), (2, 33, 130, 2, 130),
                                       (1, 1, 16, 3, 40)])
@pytest.mark.parametrize("prev", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_prompt_kernel_matches_spec(B, T, C, W, N, prev, bias, masked):
    """Odd sizes, prompts shorter than the kept window, a gather of scattered columns out of a wider strided row,
    kept inputs before the prompt or none, padding masked (the kept inputs end at each row's last real token), the
    outputs and the inputs to keep."""
    from laquant.kernels.conv.short_conv import short_conv_reference, short_conv_triton

    gen = torch.Generator().manual_seed(B * 1000 + T + C + N)
    conv = _conv(C, W, bias, gen, DTYPE)
    rows = torch.randn(B, T, 2 * N, generator=gen).to(DEVICE, DTYPE)
    x = rows[:, :, ::2]  # strided: every other column of a wider buffer
    cols = None if N == C else torch.randperm(N, generator=gen)[:C].to(DEVICE, torch.int32)
    kept = torch.randn(B, W - 1, C, generator=gen).to(DEVICE, DTYPE) if prev else None
    mask = _token_mask(B, T, gen).to(DEVICE) if masked else None
    weight = conv.weight.view(C, W)
    want, want_kept = short_conv_reference(x, kept, weight, conv.bias, "silu", cols, mask)
    got, got_kept = short_conv_triton(x, kept, weight, conv.bias, "silu", cols, mask=mask)
    assert got.dtype == x.dtype and got.shape == (B, T, C) and torch.isfinite(got).all()
    if not want.any():  # every input masked, no bias: zeros
        assert not got.any()
    else:
        assert rel_err(got.float(), want.float()) < (1e-6 if DTYPE == torch.float32 else 1e-2)
    assert torch.equal(got_kept, want_kept)  # copies: exact
    out, none = short_conv_triton(x, kept, weight, conv.bias, None, cols, keep=False, mask=mask)
    plain = short_conv_reference(x, kept, weight, conv.bias, None, cols, mask)[0]
    assert none is None and (out - plain).abs().max() <= 1e-2 * max(plain.abs().max(), 1)


def _runs(starts, length: int) -> torch.Tensor:
    """Columns in runs of ``length`` from each of ``starts`` (qwen3_next's q, k and v: runs of a head's columns)."""
    return torch.cat([torch.arange(s, s + length) for s in starts]).to(torch.int32)


@pytest.mark.parametrize("cols,N", [
    (_runs([0, 384, 128, 512], 128), 768),  # blocks that are runs, aligned: read as one
    (_runs([3, 387], 128), 600),  # runs whose first column is not 16-byte aligned: gathered
    (_runs([0, 200, 64, 400], 64), 512),  # blocks of two runs each: gathered
    (_runs([256, 4], 100), 400),  # the second block partial (C = 200 of 128-channel blocks), one aligned run
])
@pytest.mark.parametrize("strided", [False, True])
def test_prompt_kernel_reads_runs_of_columns_as_one(cols, N, strided):
    """Gathered channels whose block of columns is one aligned run take the kernel's contiguous read; blocks that are
    not (unaligned, two runs, a partial block) its gather: every case gives the spec's outputs and kept inputs."""
    from laquant.kernels.conv.short_conv import short_conv_reference, short_conv_triton

    gen = torch.Generator().manual_seed(N)
    C, W, B, T = cols.numel(), 4, 2, 21
    conv = _conv(C, W, True, gen, DTYPE)
    rows = torch.randn(B, T, 2 * N, generator=gen).to(DEVICE, DTYPE)
    x = rows[:, :, ::2] if strided else rows[:, :, :N]
    kept = torch.randn(B, W - 1, C, generator=gen).to(DEVICE, DTYPE)
    mask = _token_mask(B, T, gen).to(DEVICE)
    weight, cols = conv.weight.view(C, W), cols.to(DEVICE)
    for m in (None, mask):
        want, want_kept = short_conv_reference(x, kept, weight, conv.bias, "silu", cols, m)
        got, got_kept = short_conv_triton(x, kept, weight, conv.bias, "silu", cols, mask=m)
        assert rel_err(got.float(), want.float()) < (1e-6 if DTYPE == torch.float32 else 1e-2)
        assert torch.equal(got_kept, want_kept)


def test_prompt_kernel_takes_the_run_path_where_a_block_is_an_aligned_run(monkeypatch):
    """Which blocks read their columns as one run (interpreted: the kernel's tile routine spied on): every block of
    aligned runs, none of runs one column off alignment, only the run block of a block of two runs and a run."""
    from conftest import INTERPRETED

    from laquant.kernels.conv import short_conv as sc

    if not INTERPRETED:
        pytest.skip("the tile routine is spied on under the interpreter")
    taken = []
    real = sc._conv_rows

    def spy(x_cols, col, *args, **kwargs):
        lanes = col.handle.data
        taken.append(bool((lanes == range(lanes.size)).all()))
        return real(x_cols, col, *args, **kwargs)

    monkeypatch.setattr(sc, "_conv_rows", spy)
    gen = torch.Generator().manual_seed(0)
    for cols, N, want in ((_runs([0, 384, 128, 512], 128), 768, [True] * 4), (_runs([1, 385], 128), 600, [False] * 2),
                          (_runs([256, 4], 100), 400, [False, True])):
        conv = _conv(cols.numel(), 4, False, gen, DTYPE)
        x = torch.randn(1, 5, N, generator=gen).to(DEVICE, DTYPE)
        taken.clear()
        sc.short_conv_triton(x, None, conv.weight.view(cols.numel(), 4), None, "silu", cols.to(DEVICE), keep=False)
        assert taken == want, (cols[:3], taken)


def test_prompt_kernel_refuses_bad_input():
    from laquant.kernels.conv.short_conv import short_conv_triton

    weight = torch.randn(8, 4, device=DEVICE)
    with pytest.raises(ValueError, match="activation"):
        short_conv_triton(torch.randn(2, 5, 8, device=DEVICE), None, weight, None, "gelu")
    with pytest.raises(ValueError, match="cols"):
        short_conv_triton(torch.randn(2, 5, 9, device=DEVICE), None, weight, None, "silu")
    with pytest.raises(TypeError, match="int32"):
        short_conv_triton(torch.randn(2, 5, 9, device=DEVICE), None, weight, None, "silu",
                          torch.arange(8, device=DEVICE))
    with pytest.raises(ValueError, match="kept inputs"):
        short_conv_triton(torch.randn(2, 5, 8, device=DEVICE), torch.randn(2, 2, 8, device=DEVICE), weight, None,
                          "silu")
