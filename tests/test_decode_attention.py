"""The static decode steps' attention kernel (kernels/attention/decode.py): its spec against transformers' eager
attention, the kernel against the spec on odd shapes (interpreted on CPU, float32; bf16 on the GPU), split and
unsplit, hidden positions weighed zero and the unwritten room never read, and static_decode_attention taking it."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels

from laquant.kernels.attention.decode import decode_attention, fits

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16
MIN = torch.finfo(torch.float32).min


def _inputs(B, Hq, Hkv, T, S, D, DV, gen, dtype=DTYPE, device=DEVICE):
    q = torch.randn(B, Hq, T, D, generator=gen)
    k = torch.randn(B, Hkv, S, D, generator=gen)
    v = torch.randn(B, Hkv, S, DV, generator=gen)
    return tuple(x.to(dtype).to(device) for x in (q, k, v))


def _static_mask(B, T, S, seen, dtype=DTYPE, device=DEVICE):
    """A static cache's mask after ``seen`` tokens, T new ones causal (position seen + t sees up to itself), padded
    past S by three columns as transformers may pass it."""
    pos = torch.arange(S + 3)
    allowed = pos[None, :] <= (seen + torch.arange(T))[:, None]
    mask = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask.expand(B, 1, T, S + 3).contiguous().to(device)


def test_spec_is_transformers_eager_attention():
    from transformers.models.qwen3_next.modeling_qwen3_next import eager_attention_forward

    gen = torch.Generator().manual_seed(0)
    for T, D, DV, masked in ((1, 32, 32, True), (3, 24, 24, True), (1, 48, 32, False)):
        q, k, v = _inputs(2, 6, 2, T, 19, D, DV, gen, torch.float32, "cpu")
        mask = torch.where(torch.rand(2, 1, T, 19, generator=gen) < 0.3, MIN, 0.0) if masked else None
        module = torch.nn.Module()
        module.num_key_value_groups, module.training = 3, False
        want, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.7)
        torch.testing.assert_close(decode_attention(q, k, v, mask, 0.7), want, atol=1e-5, rtol=1e-5)


def test_spec_gives_zeros_to_a_row_that_sees_nothing():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _inputs(1, 2, 1, 2, 5, 16, 16, gen, torch.float32, "cpu")
    mask = torch.zeros(1, 1, 2, 5)
    mask[:, :, 1] = float("-inf")
    out = decode_attention(q, k, v, mask, 0.25)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1])) and out[:, 0].abs().sum() > 0


@pytest.mark.parametrize("B,Hq,Hkv,T,S,seen,D,DV,splits", [
    (2, 6, 2, 1, 19, 11, 32, 32, None),      # groups of 3, one block
    (3, 4, 4, 1, 300, 200, 48, 32, 1),       # no groups, D no power of two, blocks past the written ones
    (3, 4, 4, 1, 300, 200, 48, 32, 3),       # the same split in three spans, combined
    (1, 16, 2, 3, 257, 130, 64, 64, 2),      # three tokens (a verify step), groups of 8
    (2, 8, 1, 1, 130, 129, 16, 24, 4),       # the last position written; 4 spans asked, 3 of one block each
    (2, 4, 2, 1, 1, 0, 32, 32, None),        # one position
])
def test_kernel_matches_the_spec(B, Hq, Hkv, T, S, seen, D, DV, splits):
    require_triton_kernels()
    from laquant.kernels.attention.decode import decode_attention_triton

    gen = torch.Generator().manual_seed(B * S + T)
    q, k, v = _inputs(B, Hq, Hkv, T, S, D, DV, gen)
    mask = _static_mask(B, T, S, max(0, min(seen, S - T)))
    want = decode_attention(q, k, v, mask, D ** -0.5)
    got = decode_attention_triton(q, k, v, mask, D ** -0.5, splits=splits)
    assert got.shape == (B, T, Hq, DV) and got.dtype == q.dtype and torch.isfinite(got).all()
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)
    # no mask: every position
    assert rel_err(decode_attention_triton(q, k, v, None, 0.3, splits=splits).float().cpu(),
                   decode_attention(q, k, v, None, 0.3).float().cpu()) < (1e-5 if INTERPRETED else 1e-2)


@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_does_not_read_the_unwritten_room(splits):
    """Keys and values past the last position the mask shows are NaN: a kernel that read them would return NaN; the
    result equals attention over the written positions alone."""
    require_triton_kernels()
    from laquant.kernels.attention.decode import decode_attention_triton

    gen = torch.Generator().manual_seed(3)
    B, Hq, Hkv, S, seen, D = 2, 4, 2, 400, 70, 32
    q, k, v = _inputs(B, Hq, Hkv, 1, S, D, D, gen)
    mask = _static_mask(B, 1, S, seen)
    k[:, :, seen + 1:] = float("nan")
    v[:, :, seen + 1:] = float("nan")
    got = decode_attention_triton(q, k, v, mask, 0.2, splits=splits)
    want = decode_attention(q, k[:, :, :seen + 1], v[:, :, :seen + 1], None, 0.2)
    assert torch.isfinite(got).all()
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)


@pytest.mark.parametrize("splits", [1, 2])
def test_kernel_weighs_hidden_positions_zero(splits):
    """A mask with random holes, a block hidden from every row in the middle, -inf and the dtype's minimum both
    hiding, and one token's row hidden everywhere (zeros, as the spec gives it)."""
    require_triton_kernels()
    from laquant.kernels.attention.decode import decode_attention_triton

    gen = torch.Generator().manual_seed(7)
    B, Hq, Hkv, T, S, D = 2, 6, 3, 2, 200, 32
    q, k, v = _inputs(B, Hq, Hkv, T, S, D, D, gen)
    holes = torch.rand(B, 1, T, S, generator=gen) < 0.3
    holes[..., 64:128] = True
    mask = torch.where(holes, torch.finfo(DTYPE).min, 0.0).to(DTYPE)
    mask[..., 150:160] = float("-inf")
    mask[:, :, 1] = torch.finfo(DTYPE).min
    mask = mask.to(DEVICE)
    want = decode_attention(q, k, v, mask, 0.3)
    got = decode_attention_triton(q, k, v, mask, 0.3, splits=splits)
    assert torch.isfinite(got).all() and torch.equal(got[:, 1].cpu(), torch.zeros_like(got[:, 1]).cpu())
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)


def test_kernel_takes_strided_inputs_and_broadcast_masks(monkeypatch):
    """q in transformers' layout (``[B, T, H, D]`` transposed), keys and values slices of a longer cache, a mask of one
    row for every sequence and token (``[1, 1, 1, S']``), a float32 mask for another dtype's scores; and the default
    split rule at an H100's SM count (132 here too), split and unsplit."""
    require_triton_kernels()
    import laquant.kernels.attention.decode as dec

    gen = torch.Generator().manual_seed(8)
    B, Hq, Hkv, T, S, D = 3, 6, 2, 2, 150, 32
    q = torch.randn(B, T, Hq, D, generator=gen).to(DTYPE).to(DEVICE).transpose(1, 2)
    cache_k, cache_v = (torch.randn(B, Hkv, S + 40, D, generator=gen).to(DTYPE).to(DEVICE) for _ in range(2))
    k, v = cache_k[:, :, 10:10 + S], cache_v[:, :, 10:10 + S]
    mask = torch.zeros(1, 1, 1, S + 5, device=DEVICE)
    mask[..., 100:] = torch.finfo(torch.float32).min
    want = decode_attention(q, k, v, mask, 0.4)
    for programs_an_sm in (False, True):
        sms = B * Hkv * (2 if programs_an_sm else 40)  # 12: one span; 240: ~2 programs an SM
        monkeypatch.setattr(dec, "sm_count", lambda device, sms=sms: sms)
        got = dec.decode_attention_triton(q, k, v, mask, 0.4)
        assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2), sms


def test_kernel_refuses_what_it_does_not_take():
    require_triton_kernels()
    from laquant.kernels.attention.decode import decode_attention_triton

    q, k, v = _inputs(2, 6, 2, 1, 10, 16, 16, torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match="Hq a multiple of Hkv"):
        decode_attention_triton(q[:, :5], k, v, None, 0.5)
    with pytest.raises(ValueError, match="mask"):
        decode_attention_triton(q, k, v, torch.zeros(2, 1, 1, 9, dtype=DTYPE, device=DEVICE), 0.5)


def test_fits_refuses_what_the_kernel_does_not_take():
    gen = torch.Generator().manual_seed(4)
    q, k, v = _inputs(2, 6, 2, 1, 10, 16, 16, gen, torch.float32, "cpu")
    assert fits(q, k, v, None) and fits(q, k, v, torch.zeros(2, 1, 1, 12))
    assert not fits(q[:, :5], k, v, None)  # 5 query heads over 2 key heads
    assert not fits(q, k, v, torch.zeros(2, 6, 1, 10))  # a mask per head
    assert not fits(q, k, v, torch.zeros(2, 1, 1, 9))  # shorter than the keys
    assert not fits(q, k, v, torch.zeros(2, 1, 1, 10, dtype=torch.bool))
    assert not fits(q, k.half(), v.half(), None)
    assert not fits(q.expand(2, 6, 200, 16), k, v, None)  # 600 rows a group
    assert not fits(q[:, :, :0], k, v, None) and not fits(q, k[:, :, :0], v[:, :, :0], None)  # nothing to attend
    assert not fits(q[:0], k[:0], v[:0], None)
    assert not fits(q.double(), k.double(), v.double(), None) and not fits(q, k, v, torch.zeros(2, 1, 1, 10).double())
    assert not fits(*(x.to(torch.int8) for x in (q, k, v)), None)


def test_static_decode_attention_takes_the_kernel(monkeypatch):
    """Where Triton runs, static_decode_attention calls the kernel (here under the interpreter, made to think it
    may) and agrees with its eager formula; more query rows a key head than one program holds stay on the eager
    formula."""
    require_triton_kernels()
    import laquant.kernels.attention.decode as dec
    import laquant.models.static_hybrid as sh

    calls = []
    kernel = dec.decode_attention_triton
    monkeypatch.setattr(dec, "decode_attention_triton", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    gen = torch.Generator().manual_seed(5)
    q, k, v = _inputs(2, 6, 2, 1, 70, 32, 32, gen, torch.float32, DEVICE)
    mask = _static_mask(2, 1, 70, 40, torch.float32)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 3, False
    eager, _ = sh.static_decode_attention(module, q.cpu(), k.cpu(), v.cpu(), mask.cpu(), scaling=0.5)
    assert not calls  # CPU tensors: the eager formula
    monkeypatch.setattr(sh, "use_triton", lambda x: True)
    got, _ = sh.static_decode_attention(module, q, k, v, mask, scaling=0.5)
    assert calls == [1] and rel_err(got.float().cpu(), eager) < (1e-5 if INTERPRETED else 1e-2)
    long_q = torch.randn(2, 6, 50, 32, generator=gen).to(DEVICE)  # 3 heads x 50 tokens
    long_mask = _static_mask(2, 50, 70, 10, torch.float32)
    got, _ = sh.static_decode_attention(module, long_q, k, v, long_mask, scaling=0.5)
    assert calls == [1]
    torch.testing.assert_close(got, sh.grouped_eager_attention(long_q, k, v, long_mask, 0.5))
    module.training = True  # dropout in training: the eager formula (which drops nothing either; as before)
    sh.static_decode_attention(module, q, k, v, mask, scaling=0.5, dropout=0.1)
    module.training = False
    with torch.enable_grad():  # a gradient wanted through the values: the differentiable formula
        sh.static_decode_attention(module, q, k, v.clone().requires_grad_(), mask, scaling=0.5)
    sh.static_decode_attention(module, q, k, v, mask == 0, scaling=0.5)  # a bool mask: the eager formula, as before
    assert calls == [1]


@pytest.mark.gpu
def test_gpu_decode_attention_at_model_shapes():
    """bf16 at a Zamba2-like (32 key heads) and a Falcon-H1-like (4 key heads, groups of 4) layer, B = 1 and 64, a
    static cache of 2,048 positions with 1,030 written: the spec's result to bf16 rounding, both split choices."""
    from laquant.kernels.attention.decode import decode_attention_triton

    gen = torch.Generator().manual_seed(6)
    for B, Hq, Hkv in ((64, 32, 32), (64, 16, 4), (1, 16, 4)):
        q, k, v = _inputs(B, Hq, Hkv, 1, 2048, 128, 128, gen, torch.bfloat16, "cuda")
        mask = _static_mask(B, 1, 2048, 1030, torch.bfloat16, "cuda")
        want = decode_attention(q, k, v, mask, 128 ** -0.5).float()
        for splits in (None, 1):
            got = decode_attention_triton(q, k, v, mask, 128 ** -0.5, splits=splits).float()
            assert torch.isfinite(got).all() and rel_err(got, want) < 1e-2, (B, Hq, Hkv, splits)
