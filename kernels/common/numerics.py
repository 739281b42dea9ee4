"""The one quantize/dequantize implementation: modules, references and kernels all call these.

Symmetric absmax quantization: ``scale = absmax / qmax`` over the reduced dimension(s),
``q = clamp(round(x / scale), -qmax, qmax)`` (int8, int4) or ``q = fp8(x / scale)`` (e4m3, round to
nearest even by the cast), ``x ~= q * scale``. int4 codes (``[-7, 7]``) are stored two per byte
(:func:`pack_int4`): ``uint8`` data is packed int4 wherever it is dequantized. Scales are float32;
an all-zero slice gets scale ``tiny`` so dequantization returns exact zeros and nothing divides by zero.

``rounding="stochastic"`` rounds ``x / scale`` to one of its two neighbouring codes instead, up with
probability equal to its distance from the lower one (so the expected code is ``x / scale``: small
decays and updates survive in expectation where round-to-nearest would drop them). The caller gives
8 random bits per element (``random``, integers 0..255): the Triton kernels draw them from Philox at
:data:`STATE_PHILOX_ROUNDS` rounds (:func:`philox4x32`, bit-identical to ``tl.philox``) and so do the references,
so both round alike.
"""

from __future__ import annotations

import torch

from . import format_names

INT8_MAX = 127.0
INT4_MAX = 7.0
FP8_E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
_TINY = torch.finfo(torch.float32).tiny


def absmax_scale(x: torch.Tensor, dim: int | tuple[int, ...] | None, qmax: float) -> torch.Tensor:
    """float32 scale with ``dim`` kept (``None``: one scale for the whole tensor). Divided by a
    tensor: CUDA divides by a Python number as a multiplication by its reciprocal, an ulp away from
    the CPU's quotient."""
    amax = x.detach().abs().float()
    amax = amax.amax() if dim is None else amax.amax(dim=dim, keepdim=True)
    return (amax / amax.new_tensor(qmax)).clamp_min(_TINY)


ROUNDINGS = format_names.ROUNDINGS
RANDOM_BITS = 8  # random bits per element of a stochastic rounding: bias at most 2**-9 of a step


def quantize_int8(x: torch.Tensor, dim: int | tuple[int, ...] | None = -1, scale: torch.Tensor | None = None,
                  rounding: str = "nearest", random: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 with absmax scales over ``dim`` (or the given ``scale``). Returns ``(q, scale)``."""
    return quantize_int(x, INT8_MAX, dim, scale, rounding, random)


# input columns one activation scale covers under per-group W8A8 (``act_granularity: per_group``): a token's
# scale per group of 128 consecutive columns of the int8 weight, as fp8 block recipes group them
ACT_GROUP = 128


def quantize_int8_groups(x: torch.Tensor, group: int = ACT_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of ``x [M, K]`` with one absmax scale per row and ``group`` consecutive columns (the last group
    may be shorter). Returns ``(q [M, K], scale [M, cdiv(K, group)])``."""
    M, K = x.shape
    padded = torch.nn.functional.pad(x.float(), (0, -K % group)).view(M, -1, group)
    q, scale = quantize_int8(padded, dim=-1)
    return q.view(M, -1)[:, :K], scale.squeeze(-1)


def quantize_int4(x: torch.Tensor, dim: int | tuple[int, ...] | None = -1, scale: torch.Tensor | None = None,
                  rounding: str = "nearest", random: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 codes in ``[-7, 7]`` with absmax scales over ``dim`` (or the given ``scale``), packed two
    per byte along the last dimension (:func:`pack_int4`). Returns ``(packed, scale)``."""
    q, scale = quantize_int(x, INT4_MAX, dim, scale, rounding, random)
    return pack_int4(q), scale


def quantize_int(x: torch.Tensor, qmax: float, dim: int | tuple[int, ...] | None = -1,
                 scale: torch.Tensor | None = None, rounding: str = "nearest",
                 random: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes in ``[-qmax, qmax]`` (held in int8, unpacked) and their scale: int8's and int4's rule."""
    scale = absmax_scale(x, dim, qmax) if scale is None else scale
    y = (x.float() / scale).clamp_(-qmax, qmax)
    if _stochastic(rounding, random, y):
        y = round_stochastic_int(y, random)
    return y.round_().to(torch.int8), scale


INT4_PAD = 0x8  # the nibble after an odd row's last code: -8, never a code, so packed data knows its width


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 codes in ``[-7, 7]`` ``[..., V]`` as ``uint8`` ``[..., ceil(V / 2)]``: code ``2j`` in the
    low nibble of byte ``j``, code ``2j + 1`` in its high nibble, each in 4-bit two's complement. An
    odd ``V``'s last byte holds :data:`INT4_PAD` in its high nibble, so :func:`unpack_int4` finds
    ``V`` from the data alone (every caller that loads a state passes ``(data, scale)`` only)."""
    if q.shape[-1] % 2:
        q = torch.cat([q, q.new_full((*q.shape[:-1], 1), INT4_PAD - 16)], -1)
    nib = q.to(torch.uint8) & 0xF
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The int8 codes ``[..., V]`` of :func:`pack_int4`'s ``packed`` ``[..., ceil(V / 2)]``."""
    low = (packed & 0xF).to(torch.int8)
    high = (packed >> 4).to(torch.int8)
    q = torch.stack([low, high], -1).flatten(-2)
    q = q - ((q >= 8).to(torch.int8) << 4)  # 4-bit two's complement
    if packed.numel() and int(packed.reshape(-1, packed.shape[-1])[0, -1]) >> 4 == INT4_PAD:
        q = q[..., :-1]  # an odd row's pad
    return q


def codes(data: torch.Tensor) -> torch.Tensor:
    """A stored tensor's codes or values, one per element: packed int4 unpacked, others as they are."""
    return unpack_int4(data) if data.dtype == torch.uint8 else data


def quantize_fp8(x: torch.Tensor, dim: int | tuple[int, ...] | None = -1, scale: torch.Tensor | None = None,
                 rounding: str = "nearest", random: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 with absmax scales over ``dim`` (or the given ``scale``). Returns ``(q, scale)``."""
    scale = absmax_scale(x, dim, FP8_E4M3_MAX) if scale is None else scale
    y = (x.float() / scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    if _stochastic(rounding, random, y):
        y = round_stochastic_fp8(y, random)  # on the e4m3 grid where normal: the cast keeps it
    return y.to(FP8_DTYPE), scale


def _stochastic(rounding: str, random: torch.Tensor | None, y: torch.Tensor) -> bool:
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    if rounding == "nearest":
        return False
    if random is None or random.shape != y.shape:
        raise ValueError(f"stochastic rounding needs random bits of the data's shape {tuple(y.shape)}; got "
                         f"{None if random is None else tuple(random.shape)}")
    return True


def round_stochastic_int(y: torch.Tensor, random: torch.Tensor) -> torch.Tensor:
    """``y`` (float32, ``|y| <= 127``) rounded to an integer, down or up: ``floor(round(256 * y) / 256 +
    r / 256)`` for the random byte ``r`` (``round``: half to even), so up with probability
    ``round(256 * frac) / 256``, ``frac = y - floor(y)``. ``y + 128 + 2**15`` in float32 is exactly
    ``2**15 + (128 + round(256 * y) / 256)`` (its ulp is ``2**-8``, and it stays inside ``[2**15, 2**16)``),
    so its bits less those of ``2**15 + 128`` are ``round(256 * y)``; adding ``r`` and shifting out 8 bits
    (arithmetic: a floor) rounds. Three integer and float operations and no sign test, the same in the
    kernels' twin (``triton_numerics.round_stochastic_int``). Until 2026-12-04 the rule rounded ``|y|`` and
    restored the sign (same probabilities; a negative ``y`` took ``r`` mirrored), three instructions more
    an element in the int8 state's decode step."""
    m = (y.float() + 32896.0).view(torch.int32)
    return ((m + random.to(torch.int32) - 0x47008000) >> 8).float()


def round_stochastic_fp8(y: torch.Tensor, random: torch.Tensor) -> torch.Tensor:
    """``y`` (``|y| <= 448``) rounded towards a neighbouring e4m3 value with the random byte ``r``,
    on float32's bits: e4m3 keeps 3 of the 23 mantissa bits, so adding ``r * 2**12 + 2**11`` to
    the 20 dropped bits carries into the kept ones exactly when ``frac * 2**20 + r * 2**12 + 2**11
    >= 2**20`` (``frac``: the distance to the lower neighbour in grid steps), that is with
    probability ``round(256 * frac) / 256``; truncating them leaves the result (a carry out of the
    mantissa lands on the next binade; the sign bit is untouched). Normal e4m3 magnitudes
    (``>= 2**-6``) come out exact; below, e4m3's subnormal grid is coarser than 3 mantissa bits and
    the cast to e4m3 rounds the result to nearest (elements under ``2**-6 / 448`` of their row's
    absmax). Four integer operations per element, the same in the kernels
    (``triton_numerics.round_stochastic_fp8``)."""
    bits = (y.view(torch.int32) + ((random.to(torch.int32) << 12) + 2048)) & -(1 << 20)
    return bits.view(torch.float32)


# Philox4x32-10 (Salmon et al., SC'11) exactly as Triton's ``tl.philox`` / ``tl.randint4x`` compute
# it (triton/language/random.py): uint32 words held in int64 tensors.
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
_U32 = 0xFFFFFFFF


# Rounds of Philox the state's random bytes take: 7, the fewest Salmon et al. found Crush-resistant for
# Philox4x32 (their default of 10 adds a safety margin; Triton's is 10 too). The bytes only dither a rounding:
# uniform and decorrelated across elements and stores is what they need. 7 rounds took the int8 state's decode
# step ~1.2 instructions an element fewer than 10 (of ~22; ``tools/sass_mix.py``).
STATE_PHILOX_ROUNDS = 7


def philox4x32(seed: int, c0, c1, c2, c3, n_rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """The four uint32 words (int64 tensors) of Philox for counters ``c0..c3`` (broadcast
    together) under the 64-bit key ``seed``: ``tl.philox(seed, c0, c1, c2, c3)``."""
    device = next((c.device for c in (c0, c1, c2, c3) if isinstance(c, torch.Tensor)), None)
    c0, c1, c2, c3 = torch.broadcast_tensors(*(torch.as_tensor(c, dtype=torch.int64, device=device) & _U32
                                               for c in (c0, c1, c2, c3)))
    k0, k1 = seed & _U32, (seed >> 32) & _U32
    for _ in range(n_rounds):
        prod_b = c2 * _PHILOX_ROUND_B  # < 2**64, wrapped in int64: the bits are the uint64 product's
        prod_a = c0 * _PHILOX_ROUND_A
        c0, c2, c1, c3 = (_mulhi(prod_b) ^ c1 ^ k0, _mulhi(prod_a) ^ c3 ^ k1, prod_b & _U32, prod_a & _U32)
        k0, k1 = (k0 + _PHILOX_KEY_A) & _U32, (k1 + _PHILOX_KEY_B) & _U32
    return c0, c1, c2, c3



def _mulhi(prod: torch.Tensor) -> torch.Tensor:
    """The high 32 bits of a 64-bit product held (wrapped) in int64."""
    return (prod >> 32) & _U32


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``dtype`` (int8, fp8 or packed int4 ``q``)."""
    return (codes(q).float() * scale).to(dtype)


def fake_quantize_int8(x: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor | None = None,
                       hi: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` clamped to ``[lo, hi]`` (bounds rounded to x's dtype; none: no clamp), rounded to int8
    with the static ``scale`` and back to x's dtype (calibrated gate logits)."""
    if lo is not None:
        x = torch.maximum(torch.minimum(x, hi.to(x.dtype)), lo.to(x.dtype))
    q, scale = quantize_int8(x, scale=scale)
    return dequantize(q, scale, x.dtype)
