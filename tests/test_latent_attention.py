"""MLA's absorbed decode attention over the cached latents (kernels/attention/latent.py): its spec against the
PyTorch ops it replaces, the kernel against the spec on odd shapes (interpreted on CPU, float32; bf16 on the GPU),
split and unsplit, the unwritten room never read, and the absorbed step taking it."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels

from laquant.kernels.attention.latent import fits, latent_attention

DTYPE = torch.float32 if INTERPRETED else torch.bfloat16


def _inputs(B, H, S, R, P, gen, dtype=DTYPE, device=DEVICE):
    shapes = ((B, H, R), (B, H, P), (B, S, R), (B, S, P))
    return tuple(torch.randn(*s, generator=gen).to(dtype).to(device) for s in shapes)


def _static_mask(B, S, seen, dtype=DTYPE, device=DEVICE):
    """A static cache's one-token mask after ``seen`` tokens (the new one at position ``seen``), three columns wider."""
    mask = torch.where(torch.arange(S + 3) <= seen, 0.0, torch.finfo(dtype).min).to(dtype)
    return mask.expand(B, 1, 1, S + 3).contiguous().to(device)


def test_spec_is_the_absorbed_steps_ops():
    """The spec computes what mla_attention's PyTorch ops compute (float32): the latent and rope scores summed, scaled,
    the mask added, softmax, the weighted latents."""
    gen = torch.Generator().manual_seed(0)
    ql, qr, c, kr = _inputs(2, 5, 23, 40, 8, gen, torch.float32, "cpu")
    mask = torch.where(torch.rand(2, 1, 1, 23, generator=gen) < 0.3, torch.finfo(torch.float32).min, 0.0)
    scores = torch.baddbmm(torch.bmm(ql, c.transpose(1, 2)), qr, kr.transpose(1, 2)) * 0.3 + mask[:, 0]
    want = torch.bmm(torch.softmax(scores, -1), c)
    torch.testing.assert_close(latent_attention(ql, qr, c, kr, mask, 0.3), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("B,H,S,seen,R,P,splits", [
    (2, 3, 19, 11, 40, 8, None),       # R and H no powers of two, one block
    (3, 16, 300, 200, 64, 16, 1),      # blocks past the written ones
    (3, 16, 300, 200, 64, 16, 3),      # the same split in three spans, combined
    (1, 5, 130, 129, 24, 12, 5),       # the last position written; 5 spans of a block each
    (2, 4, 1, 0, 32, 16, None),        # one position
])
def test_kernel_matches_the_spec(B, H, S, seen, R, P, splits):
    require_triton_kernels()
    from laquant.kernels.attention.latent import latent_attention_triton

    gen = torch.Generator().manual_seed(B * S + H)
    ql, qr, c, kr = _inputs(B, H, S, R, P, gen)
    mask = _static_mask(B, S, seen)
    want = latent_attention(ql, qr, c, kr, mask, R ** -0.5)
    got = latent_attention_triton(ql, qr, c, kr, mask, R ** -0.5, splits=splits)
    assert got.shape == (B, H, R) and got.dtype == ql.dtype and torch.isfinite(got).all()
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)
    no_mask = latent_attention_triton(ql, qr, c, kr, None, 0.2, splits=splits)
    assert rel_err(no_mask.float().cpu(), latent_attention(ql, qr, c, kr, None, 0.2).float().cpu()) < \
        (1e-5 if INTERPRETED else 1e-2)


def test_kernel_takes_a_broadcast_mask_and_strided_queries():
    """A mask [1, 1, 1, S'] shared by the batch, and q_latent as the absorbed step makes it (a transposed bmm output:
    heads strided by the batch)."""
    require_triton_kernels()
    from laquant.kernels.attention.latent import latent_attention_triton

    gen = torch.Generator().manual_seed(11)
    B, H, S, R, P = 3, 5, 90, 40, 8
    _, qr, c, kr = _inputs(B, H, S, R, P, gen)
    ql = torch.randn(H, B, R, generator=gen).to(DTYPE).to(DEVICE).transpose(0, 1)  # [B, H, R], strides (R, B R, 1)
    mask = _static_mask(1, S, 60)
    for splits in (1, 3):
        got = latent_attention_triton(ql, qr, c, kr, mask, 0.3, splits=splits)
        want = latent_attention(ql, qr, c, kr, mask.expand(B, 1, 1, -1), 0.3)
        assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)


@pytest.mark.parametrize("splits", [1, 4])
def test_kernel_does_not_read_the_unwritten_room(splits):
    """Latents and rope parts past the last position the mask shows are NaN: read, they would make the output NaN;
    hidden positions before it weigh zero."""
    require_triton_kernels()
    from laquant.kernels.attention.latent import latent_attention_triton

    gen = torch.Generator().manual_seed(7)
    ql, qr, c, kr = _inputs(2, 4, 260, 32, 16, gen)
    mask = _static_mask(2, 260, 70)
    mask[1, ..., 10:20] = float("-inf")  # a hole before the last seen position
    want = latent_attention(ql, qr, c, kr, mask, 0.2)
    c[:, 71:], kr[:, 71:] = float("nan"), float("nan")
    got = latent_attention_triton(ql, qr, c, kr, mask, 0.2, splits=splits)
    assert torch.isfinite(got).all()
    assert rel_err(got.float().cpu(), want.float().cpu()) < (1e-5 if INTERPRETED else 1e-2)


def test_fits_refuses_what_the_kernel_does_not_take():
    gen = torch.Generator().manual_seed(2)
    ql, qr, c, kr = _inputs(2, 3, 9, 16, 8, gen, torch.float32, "cpu")
    assert fits(ql, qr, c, kr, None) and fits(ql, qr, c, kr, torch.zeros(2, 1, 1, 12))
    assert not fits(ql, qr, c, kr, torch.zeros(2, 1, 1, 12, dtype=torch.bool))  # a boolean mask
    assert not fits(ql, qr, c, kr, torch.zeros(2, 1, 1, 8))  # narrower than the cache
    assert not fits(ql, qr, c[:, :0], kr[:, :0], None)  # empty
    assert not fits(ql, qr, c.double(), kr, None)  # dtypes differ
    assert not fits(ql, qr[..., :4], c, kr, None)  # the rope widths differ
    wide = torch.randn(2, 3, 520)
    assert not fits(wide, qr, torch.randn(2, 9, 520), kr, None)  # wider than MAX_WIDTH
    assert not fits(ql.transpose(1, 2).contiguous().transpose(1, 2), qr, c, kr, None)  # last dimension strided


@pytest.mark.gpu
def test_gpu_latent_attention_at_kimi_linears_shape():
    """Kimi Linear's MLA at B = 1 and 64 (16 heads, R = 512, P = 64, a static cache of 2,048 after 1,030 tokens),
    bf16: the kernel equals the spec to bf16 rounding."""
    from laquant.kernels.attention.latent import latent_attention_triton

    gen = torch.Generator().manual_seed(3)
    for B in (1, 64):
        ql, qr, c, kr = _inputs(B, 16, 2048, 512, 64, gen, torch.bfloat16, "cuda")
        mask = _static_mask(B, 2048, 1030, torch.bfloat16, "cuda")
        got = latent_attention_triton(ql, qr, c, kr, mask, 192 ** -0.5)
        assert rel_err(got.float(), latent_attention(ql, qr, c, kr, mask, 192 ** -0.5).float()) < 1e-2
