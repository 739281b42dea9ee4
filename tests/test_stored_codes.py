"""``triton_numerics.stored_int8_codes``: the codes of ``x / scale`` from the row's reciprocal and one residual step
equal ``torch.round(x / scale).clamp(-127, 127)`` (IEEE division) bit for bit, on the values where that is hardest:
quotients at and next to half-integers, scales whose significands are all ones or a power of two, tiny scales, and
every bf16 value against many scales (GPU; a sample of them under the CPU interpreter)."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, require_triton_kernels

triton = require_triton_kernels()
import triton.language as tl  # noqa: E402

from laquant.kernels.common.triton_numerics import quantize_int8, stored_int8_codes  # noqa: E402


@triton.jit
def _codes_kernel(x_ptr, s_ptr, q_ptr, C, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=ok, other=0.0)
    tl.store(q_ptr + row * C + cols, stored_int8_codes(x, tl.load(s_ptr + row)), mask=ok)


@triton.jit
def _division_kernel(x_ptr, s_ptr, q_ptr, C: tl.constexpr):
    """The division's form (``quantize_int8``: ``div_rn``, then the conversion), as the kernels stored codes before."""
    row = tl.program_id(0)
    cols = tl.arange(0, C)
    tl.store(q_ptr + row * C + cols, quantize_int8(tl.load(x_ptr + row * C + cols), tl.load(s_ptr + row)))


def _codes(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    R, C = x.shape
    q = torch.empty(R, C, dtype=torch.int8, device=x.device)
    _codes_kernel[(R, triton.cdiv(C, 1024))](x, scale, q, C, BLOCK=1024)
    return q


def _expected(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round(x / scale[:, None]).clamp(-127, 127).to(torch.int8)


def _hard_scales(n: int) -> torch.Tensor:
    """Scales of every kind the absmax rule makes (``absmax / 127``, at least float32's tiny) and the ones a
    reciprocal gets wrong most easily."""
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0x00800000, 0x7B000000, (n,), generator=g, dtype=torch.int64)  # (n + 1/2) scale finite
    odd = [0x3F7FFFFF, 0x3FFFFFFF, 0x3F800000, 0x3F800001, 0x00800000, 0x00FFFFFF, 0x0C000000, 0x0D7FFFFF]
    scales = torch.cat([bits, torch.tensor(odd)]).to(torch.int32).view(torch.float32)
    absmax = torch.rand(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-30, 30, (n,), generator=g)
    return torch.cat([scales, (absmax.float() / 127.0).clamp_min(torch.finfo(torch.float32).tiny)])


def _near_half_integers(scale: torch.Tensor, per_row: int) -> torch.Tensor:
    """For each scale: ``(n + 1/2) * scale`` and its float32 neighbours, n over -127..126, and random x in range."""
    R = scale.numel()
    n = torch.randint(-127, 127, (R, per_row // 4), generator=torch.Generator().manual_seed(2)).double() + 0.5
    mid = (n * scale.double()[:, None]).float()
    ints = mid.view(torch.int32)
    near = torch.cat([mid, (ints + 1).view(torch.float32), (ints - 1).view(torch.float32)], 1)
    rand = (torch.rand(R, per_row - near.shape[1], generator=torch.Generator().manual_seed(3)) * 2 - 1) * 127
    return torch.cat([near, (rand.double() * scale.double()[:, None]).float()], 1)


def test_codes_equal_the_division_near_every_rounding_boundary():
    scale = _hard_scales(64 if INTERPRETED else 20000)
    x = _near_half_integers(scale, 256 if INTERPRETED else 1024)
    assert torch.isfinite(x).all()
    got = _codes(x.to(DEVICE), scale.to(DEVICE)).cpu()
    assert torch.equal(got, _expected(x, scale))


def test_codes_equal_the_division_at_the_smallest_scales():
    """Scales just above float32's tiny (the absmax of rows of ~1e-36..1e-32), where the residual of an unscaled
    quotient would fall among the subnormals: the rows scaled by 2**64 first."""
    g = torch.Generator().manual_seed(5)
    n = 48 if INTERPRETED else 4096
    exponent = torch.randint(1, 15, (n,), generator=g, dtype=torch.int64)  # 2**-126 .. 2**-112
    bits = (exponent << 23) | torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int64)
    scale = bits.to(torch.int32).view(torch.float32)
    x = _near_half_integers(scale, 1024)
    got = _codes(x.to(DEVICE), scale.to(DEVICE)).cpu()
    assert torch.equal(got, _expected(x, scale))


def test_codes_equal_the_division_for_every_bf16_value():
    """Every finite bf16 value as x (the producers' rows hold bf16 values) against scales of each kind; elements whose
    quotient passes 127 clamp, as the division's."""
    allbits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = allbits[torch.isfinite(allbits)]
    scale = _hard_scales(8 if INTERPRETED else 512)
    if INTERPRETED:
        x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(4))[:2048]]
    rows = x[None, :].expand(scale.numel(), -1).contiguous()
    got = _codes(rows.to(DEVICE), scale.to(DEVICE)).cpu()
    assert torch.equal(got, _expected(rows, scale))


@pytest.mark.parametrize("value", [0.0, -0.0, float("inf"), float("nan")])
def test_codes_of_special_values_are_those_of_the_division_pass(value):
    """Zeros give 0; an infinite or NaN element (a broken row) clamps as the conversion of the division does."""
    scale = torch.tensor([0.5, torch.finfo(torch.float32).tiny])
    x = torch.full((2, 8), value)
    got = _codes(x.to(DEVICE), scale.to(DEVICE)).cpu()
    ref = torch.empty(2, 8, dtype=torch.int8, device=DEVICE)
    _division_kernel[(2,)](x.to(DEVICE), scale.to(DEVICE), ref, C=8)
    assert torch.equal(got, ref.cpu())
