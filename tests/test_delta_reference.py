"""The gated delta rule reference against transformers' own PyTorch implementation (Qwen3-Next)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from laquant.kernels.delta.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule
from laquant.quant import StateQuantizer

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _inputs(B=2, T=75, Hk=2, Hv=4, K=16, V=24, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    q, k, v = r(B, T, Hk, K), r(B, T, Hk, K), r(B, T, Hv, V)
    g = -F.softplus(r(B, T, Hv)) * 0.5
    beta = torch.sigmoid(r(B, T, Hv))
    h0 = r(B, Hv, K, V)
    return q, k, v, g, beta, h0


def _transformers(fn, q, k, v, g, beta, h0, **kw):
    # transformers resolves its hub kernel lazily; the undecorated function is the PyTorch reference.
    # Qwen3-Next repeats the key heads over the value heads before calling it (5.17's takes no groups)
    fn = getattr(fn, "__wrapped__", fn)
    r = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    return fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)


def test_recurrent_matches_transformers():
    q, k, v, g, beta, h0 = _inputs()
    o, s = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm=True)
    o_ref, s_ref = _transformers(qwen3_next.torch_recurrent_gated_delta_rule, q, k, v, g, beta, h0)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5  # transformers computes in float32


@pytest.mark.parametrize("T,chunk", [(75, 16), (64, 64), (1, 8), (130, 32)])
def test_chunked_matches_recurrent_and_transformers(T, chunk):
    q, k, v, g, beta, h0 = _inputs(T=T, seed=T)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm=True,
                                  chunk_size=chunk)
    o_rec, s_rec = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              use_qk_l2norm=True)
    assert rel_err(o, o_rec) < 1e-10 and rel_err(s, s_rec) < 1e-10
    o_ref, _ = _transformers(qwen3_next.torch_chunk_gated_delta_rule, q, k, v, g, beta, h0, chunk_size=chunk)
    assert rel_err(o, o_ref) < 1e-5


def test_state_format_round_trips_feed_back():
    """A quantized state changes what the delta rule writes next; fp8 must stay close, not exact."""
    q, k, v, g, beta, h0 = (x.float() for x in _inputs(T=200))
    exact, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True)
    fp8, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm=True,
                                    state_roundtrip=StateQuantizer("fp8_row").roundtrip)
    err = rel_err(fp8, exact)
    assert 0 < err < 5e-2


def test_bad_head_counts_are_named():
    q, k, v, g, beta, _ = _inputs(Hk=3, Hv=4)
    with pytest.raises(ValueError, match="multiple of key heads"):
        recurrent_gated_delta_rule(q, k, v, g, beta)
