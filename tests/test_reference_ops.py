"""The GLA reference ops agree with each other: chunked == recurrent == naive O(T^2)."""

import pytest
import torch

from conftest import rel_err
from laquant.kernels import chunk_gla, naive_gla, recurrent_gla, recurrent_gla_step


def _inputs(B=2, T=37, H=3, K=8, V=12, dtype=torch.float64, decay_scale=1.0):
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = torch.randn(B, T, H, K, dtype=dtype)
    v = torch.randn(B, T, H, V, dtype=dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, dtype=dtype)) * decay_scale
    h0 = torch.randn(B, H, K, V, dtype=dtype)
    return q, k, v, g, h0


@pytest.mark.parametrize("chunk_size", [16, 8, 5, 64])
@pytest.mark.parametrize("T", [1, 37, 64])
def test_chunked_equals_recurrent_equals_naive(chunk_size, T):
    q, k, v, g, h0 = _inputs(T=T)
    o_chunk, s_chunk = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=chunk_size)
    o_rec, s_rec = recurrent_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    o_naive = naive_gla(q, k, v, g, initial_state=h0)
    assert rel_err(o_chunk, o_naive) < 1e-12
    assert rel_err(o_rec, o_naive) < 1e-12
    assert rel_err(s_chunk, s_rec) < 1e-12


def test_no_initial_state_and_custom_scale():
    q, k, v, g, _ = _inputs()
    o_chunk, _ = chunk_gla(q, k, v, g, scale=0.3)
    o_naive = naive_gla(q, k, v, g, scale=0.3)
    assert rel_err(o_chunk, o_naive) < 1e-12
    # the scale matters: a different one gives a different answer
    assert rel_err(chunk_gla(q, k, v, g)[0], o_naive) > 1e-3


@pytest.mark.parametrize("split", [1, 16, 20, 36])
def test_state_carried_across_split_equals_whole(split):
    q, k, v, g, h0 = _inputs(T=37)
    whole, s_whole = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    first, s_mid = chunk_gla(q[:, :split], k[:, :split], v[:, :split], g[:, :split], initial_state=h0,
                             output_final_state=True)
    second, s_end = chunk_gla(q[:, split:], k[:, split:], v[:, split:], g[:, split:], initial_state=s_mid,
                              output_final_state=True)
    assert rel_err(torch.cat([first, second], 1), whole) < 1e-12
    assert rel_err(s_end, s_whole) < 1e-12


def test_decode_steps_continue_a_chunked_prefill():
    q, k, v, g, h0 = _inputs(T=30)
    whole, _ = chunk_gla(q, k, v, g, initial_state=h0)
    _, state = chunk_gla(q[:, :21], k[:, :21], v[:, :21], g[:, :21], initial_state=h0, output_final_state=True)
    outs = []
    for t in range(21, 30):
        o, state = recurrent_gla_step(q[:, t], k[:, t], v[:, t], g[:, t], state)
        outs.append(o)
    assert rel_err(torch.stack(outs, 1), whole[:, 21:]) < 1e-12


def test_scalar_per_head_decay_is_a_special_case():
    q, k, v, _, h0 = _inputs()
    g_head = torch.nn.functional.logsigmoid(torch.randn(2, 37, 3, 1, dtype=torch.float64))
    g = g_head.expand(-1, -1, -1, 8)
    o, _ = chunk_gla(q, k, v, g, initial_state=h0)
    # scalar decay: o_t = sum_s exp(G_t - G_s) (q_t . k_s) v_s + exp(G_t) q_t h0, checked directly
    G = g_head[..., 0].cumsum(1)  # [B, T, H]
    scores = torch.einsum("bthk,bshk->bhts", q * 8**-0.5, k)
    decay = (G.transpose(1, 2)[..., :, None] - G.transpose(1, 2)[..., None, :])
    scores = scores * decay.masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), float("-inf")).exp()
    ref = torch.einsum("bhts,bshv->bthv", scores, v)
    ref = ref + torch.einsum("bthk,bhkv->bthv", q * 8**-0.5 * G[..., None].exp(), h0)
    assert rel_err(o, ref) < 1e-12


def test_strong_decay_stays_finite():
    q, k, v, g, h0 = _inputs(T=50, decay_scale=200.0)  # exp(g) underflows to 0 in places
    o, s = chunk_gla(q.float(), k.float(), v.float(), g.float(), initial_state=h0.float(), output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert rel_err(o, naive_gla(q, k, v, g, initial_state=h0)) < 1e-5


def test_float32_and_bfloat16_inputs_accumulate_in_float32():
    q, k, v, g, h0 = _inputs(T=45)
    ref = naive_gla(q, k, v, g, initial_state=h0)
    o32, s32 = chunk_gla(q.float(), k.float(), v.float(), g.float(), initial_state=h0.float(), output_final_state=True)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    assert rel_err(o32, ref) < 1e-5
    bf = [x.bfloat16() for x in (q, k, v, g)]
    o16, s16 = chunk_gla(*bf, initial_state=h0.float(), output_final_state=True)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    ref16 = naive_gla(*[x.double() for x in bf], initial_state=h0)
    assert rel_err(o16, ref16) < 1e-2


def test_non_contiguous_inputs():
    q, k, v, g, h0 = _inputs(T=33)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not qt.is_contiguous()
    assert rel_err(chunk_gla(qt, k, v, g, initial_state=h0)[0], naive_gla(q, k, v, g, initial_state=h0)) < 1e-12


def test_bad_shapes_are_named():
    q, k, v, g, h0 = _inputs()
    with pytest.raises(ValueError, match=r"v must be \[B, T, H, V\]"):
        chunk_gla(q, k, v[:, :5], g)
    with pytest.raises(ValueError, match="initial_state must be"):
        chunk_gla(q, k, v, g, initial_state=h0[:, :1])
