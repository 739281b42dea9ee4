"""The non-causal (bidirectional) linear-attention kernels against the reference."""

import pytest
import torch

from conftest import DEVICE, rel_err, require_triton_kernels
from laquant.kernels.gla.reference import noncausal_linear_attention, naive_gla

triton = require_triton_kernels()
from laquant.kernels.gla.noncausal import noncausal_linear_attention_triton  # noqa: E402


def test_reference_is_full_attention_without_mask():
    q, k, v = torch.randn(2, 9, 2, 8, dtype=torch.float64), torch.randn(2, 9, 2, 8, dtype=torch.float64), \
        torch.randn(2, 9, 2, 4, dtype=torch.float64)
    expected = torch.einsum("bihk,bjhk,bjhv->bihv", q * 8 ** -0.5, k, v)
    assert rel_err(noncausal_linear_attention(q, k, v), expected) < 1e-12
    # its last position equals causal attention without decay at the last position
    causal = naive_gla(q, k, v, torch.zeros_like(q))
    assert rel_err(noncausal_linear_attention(q, k, v)[:, -1], causal[:, -1]) < 1e-12


@pytest.mark.parametrize("B,T,H,K,V", [(2, 300, 3, 16, 24), (1, 1, 1, 16, 16), (3, 64, 2, 32, 32)])
def test_kernel_matches_reference(B, T, H, K, V):
    q, k, v = (torch.randn(B, T, H, d, device=DEVICE) for d in (K, K, V))
    ref = noncausal_linear_attention(q, k, v)
    assert rel_err(noncausal_linear_attention_triton(q, k, v), ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("T", [4096, 65536])
def test_bf16_long_on_gpu(T):
    q, k, v = (torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k = k.transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous [B, T, H, K] view
    ref = noncausal_linear_attention(q, k, v)
    assert rel_err(noncausal_linear_attention_triton(q, k, v).float(), ref.float()) < 2e-2
