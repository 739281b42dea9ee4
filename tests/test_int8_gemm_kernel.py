"""The int8 outlier-split GEMM kernels against the reference (the QuantLinear module's CPU path)."""

import pytest
import torch

from conftest import DEVICE, rel_err, require_triton_kernels
from laquant.quant.modules import QuantLinear
from laquant.kernels.common.numerics import quantize_int8

triton = require_triton_kernels()
from laquant.kernels.gemm.int8 import (  # noqa: E402
    int8_outlier_linear_triton,
    quantize_rows,
)

# the interpreter's bf16 tl.dot is broken (see test_chunk_kernel): interpreted runs use float32
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


def _module(K, N, n_out, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=gen) * 0.05)
    outliers = torch.randperm(K, generator=gen)[:n_out]
    return QuantLinear.from_linear(lin.to(DTYPE), outliers).to(DEVICE), outliers


def _x(M, K, outliers, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    x[:, outliers] *= 30  # the columns the split exists for
    return x.to(DEVICE, DTYPE)


def _reference(mod, x):
    from laquant.kernels import int8_outlier_linear

    return int8_outlier_linear(x.cpu(), *(t.cpu() if t is not None else None for t in (
        mod.qweight[:, :mod.n_main], mod.weight_scale, mod.keep_idx if mod.n_outliers else None, mod.outlier_idx,
        mod.outlier_weight, mod.bias)), "per_token").to(DEVICE)


@pytest.mark.parametrize("M,K,N,n_out", [(5, 200, 72, 7), (33, 64, 40, 0), (1, 96, 130, 70), (130, 256, 48, 3),
                                         (2, 9000, 16, 5)])  # the last: rows too long for one tile
def test_gemm_matches_reference(M, K, N, n_out):
    mod, outliers = _module(K, N, n_out)
    x = _x(M, K, outliers)
    y = int8_outlier_linear_triton(x, mod.packed())
    assert y.dtype == x.dtype and y.shape == (M, N)
    assert rel_err(y.float(), _reference(mod, x).float()) < (1e-2 if DTYPE == torch.bfloat16 else 1e-5)


def test_activation_codes_are_the_references():
    """Per-token scales and int8 codes equal numerics.quantize_int8 exactly (same division and rounding)."""
    mod, outliers = _module(96, 16, 5)
    x = _x(9, 96, outliers)
    xq, xs, xo = quantize_rows(x, mod.packed())
    q_ref, s_ref = quantize_int8(x[:, mod.keep_idx].cpu(), dim=-1)
    assert torch.equal(xq[:, :mod.n_main].cpu(), q_ref)  # packed like the weight: the kept columns, in order
    assert torch.equal(xs.cpu(), s_ref.squeeze(-1))
    # the outlier block: the 5 columns, then the last again up to 16 (OUTLIER_ALIGN), whose weights are zero
    assert torch.equal(xo.cpu(), x[:, mod.outlier_idx[[0, 1, 2, 3] + [4] * 12]].cpu())
    packed = mod.packed()
    assert torch.equal(packed.outlier_weight[:, :5], mod.outlier_weight) and not packed.outlier_weight[:, 5:].any()


def test_packing_shares_the_module_weight():
    mod, _ = _module(96, 16, 5)
    assert mod.packed().qweight.data_ptr() == mod.qweight.data_ptr()  # no second copy of the weight


def test_packing_maps_every_input_column_once():
    """``dest``: each kept column's packed position, ``-1 - slot`` for an outlier; columns neither kept nor outliers
    are refused by name."""
    from laquant.kernels.gemm.int8 import PackedOutlierWeight

    mod, _ = _module(96, 16, 5)
    packed = mod.packed()
    dest = packed.dest.cpu()
    assert torch.equal(dest[mod.keep_idx.cpu()], torch.arange(91, dtype=torch.int32))
    assert torch.equal(dest[mod.outlier_idx.cpu()], -1 - torch.arange(5, dtype=torch.int32))
    assert packed.n_out == 5 and packed.outlier_idx.numel() == 16  # padded to OUTLIER_ALIGN
    with pytest.raises(ValueError, match="90 kept and 5 outlier columns do not make the layer's 96 inputs"):
        PackedOutlierWeight.pack(mod.qweight, mod.weight_scale, mod.keep_idx[:90], mod.outlier_idx,
                                 mod.outlier_weight, None, 96)


def test_batched_non_contiguous_input_and_repack_after_reload():
    mod, outliers = _module(64, 32, 4, bias=False)
    x = _x(2 * 7, 64 * 2, torch.tensor([], dtype=torch.long)).view(2, 7, 128)[..., ::2]  # strided last dim
    y = mod(x) if DEVICE == "cuda" else int8_outlier_linear_triton(x, mod.packed())
    assert rel_err(y.float(), _reference(mod, x.reshape(14, 64)).view(2, 7, 32).float()) < 1e-2
    before = mod.packed()
    mod.load_state_dict({k: v.clone() * (2 if k == "weight_scale" else 1) for k, v in mod.state_dict().items()})
    assert mod.packed() is not before  # new buffers -> repacked


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 2048])
def test_model_shaped_gemm_on_gpu(M):
    mod, outliers = _module(4096, 4096, 8, bias=False)
    x = _x(M, 4096, outliers)
    assert rel_err(mod(x).float(), _reference(mod, x).float()) < 1e-2
