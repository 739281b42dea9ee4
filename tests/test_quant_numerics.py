"""The one quantize/dequantize implementation, state formats, and the int8 outlier GEMM reference."""

import pytest
import torch

from conftest import rel_err
from laquant.kernels import chunk_gla, int8_matmul_exact, int8_outlier_linear
from laquant.kernels.gemm.reference import int8_matmul_float64
from laquant.quant import StateFormat, StateQuantizer, dequantize, quantize_fp8, quantize_int8
from laquant.quant.modules import QuantLinear


def test_int8_roundtrip_error_is_at_most_half_a_step():
    x = torch.randn(37, 53) * torch.logspace(-2, 2, 53)
    q, scale = quantize_int8(x, dim=-1)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scale.shape == (37, 1)
    assert ((dequantize(q, scale) - x).abs() <= scale / 2 + 1e-7).all()
    assert (q.abs().amax(-1) == 127).all()  # absmax maps to the end of the range


def test_fp8_roundtrip_relative_error():
    x = torch.randn(64, 100)
    q, scale = quantize_fp8(x, dim=-1)
    assert q.dtype == torch.float8_e4m3fn
    y = dequantize(q, scale)
    normal = x.abs() > scale * 2**-6  # outside fp8's subnormal range
    assert ((y - x).abs()[normal] <= x.abs()[normal] * 2**-4 + 1e-9).all()


def test_zeros_quantize_to_zeros_without_nan():
    for fn in (quantize_int8, quantize_fp8):
        q, s = fn(torch.zeros(3, 8))
        assert torch.equal(dequantize(q, s), torch.zeros(3, 8))


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8_row", "fp8_head", "fp8_tensor", "int8_row"])
def test_state_formats_roundtrip_and_bytes(fmt):
    state = torch.randn(1, 3, 16, 24) * torch.logspace(-3, 1, 16).view(1, 1, 16, 1)
    sq = StateQuantizer(fmt)
    data, scale = sq.store(state)
    back = sq.load(data, scale)
    err = rel_err(back, state)
    assert err == 0 if fmt == "fp32" else 0 < err < 0.05
    stored = data.numel() * data.element_size() + (scale.numel() * 4 if scale is not None else 0)
    assert stored == StateFormat(fmt).bytes_per_state(16, 24, 3)


def test_per_row_scales_keep_small_rows_precise():
    # rows 10^6 apart: with one scale the smallest rows fall below fp8's subnormals
    state = torch.randn(1, 2, 16, 32) * torch.logspace(-6, 0, 16).view(1, 1, 16, 1)
    row_err = lambda fmt: ((StateQuantizer(fmt).roundtrip(state) - state).norm(dim=-1) / state.norm(dim=-1)).max()
    assert row_err("fp8_row") < 0.05 < row_err("fp8_tensor")


def test_renorm_interval_and_static_scales():
    sq = StateQuantizer("fp8_row", renorm_interval=3)
    big, small = torch.full((1, 1, 2, 4), 100.0), torch.full((1, 1, 2, 4), 1.0)
    _, s1 = sq.store(big, None, 1)
    _, s2 = sq.store(small, s1, 2)  # between renormalisations the scale only grows
    _, s3 = sq.store(small, s2, 3)  # a renormalisation recomputes it from the fresh state
    assert torch.equal(s2, s1) and torch.allclose(s3, torch.full_like(s3, 1.0 / 448))
    static = StateQuantizer("fp8_tensor", renorm_interval=0, static_scale=torch.tensor(1.0 / 448))
    assert static.roundtrip(big).max() == 1.0  # beyond the calibrated range: clipped
    with pytest.raises(ValueError, match="static_scale"):
        StateQuantizer("fp8_row", renorm_interval=0)
    with pytest.raises(ValueError, match="unknown state format"):
        StateQuantizer("fp4")


@pytest.mark.parametrize("M,K,N", [(33, 1000, 17), (1, 2048, 300), (5, 7, 3), (64, 96, 40)])
def test_int8_matmul_is_exact_integer_arithmetic(M, K, N):
    """The CPU's int32 path (torch._int_mm) and the float64 emulation give the exact integer sums,
    also for a weight that is a column slice of a padded buffer (as QuantLinear holds it)."""
    a = torch.randint(-127, 128, (M, K), dtype=torch.int8)
    padded = torch.randint(-127, 128, (N, K + 9), dtype=torch.int8)
    b = padded[:, :K]
    exact = a.long() @ b.long().T
    assert torch.equal(int8_matmul_exact(a, b).long(), exact)
    assert torch.equal(int8_matmul_float64(a, b).long(), exact)
    extreme = torch.full((M, K), -127, dtype=torch.int8)  # the largest sums
    assert torch.equal(int8_matmul_exact(extreme, b).long(), extreme.long() @ b.long().T)


def test_outlier_linear_matches_float_reference_and_split_helps():
    torch.manual_seed(3)
    lin = torch.nn.Linear(96, 40, bias=True)
    x = torch.randn(4, 9, 96)
    x[..., [5, 50]] *= 60.0  # two outlier channels, as LLM activations have
    ref = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
    plain = QuantLinear.from_linear(lin, torch.tensor([], dtype=torch.long))
    split = QuantLinear.from_linear(lin, torch.tensor([50, 5]))
    err_plain, err_split = rel_err(plain(x), ref), rel_err(split(x), ref)
    assert err_split < 5e-3 and err_split < err_plain / 4
    # the module is the reference op with its stored tensors
    y = int8_outlier_linear(x, split.qweight[:, :split.n_main], split.weight_scale, split.keep_idx, split.outlier_idx,
                            split.outlier_weight, split.bias)
    assert torch.equal(y, split(x))
    assert rel_err(split.dequantized_weight(), lin.weight.detach()) < 1e-2


def test_weight_only_and_per_tensor_modes():
    lin = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(5, 32)
    ref = x.double() @ lin.weight.double().T
    w_only = QuantLinear.from_linear(lin, torch.tensor([], dtype=torch.long), "per_channel", "none")
    naive = QuantLinear.from_linear(lin, torch.tensor([], dtype=torch.long), "per_tensor", "per_tensor")
    assert rel_err(w_only(x), ref) < 1e-2 and rel_err(naive(x), ref) < 5e-2


def test_chunked_state_roundtrip_hook():
    B, T, H, K, V = 1, 150, 2, 8, 16
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, g = torch.randn(B, T, H, V), torch.nn.functional.logsigmoid(torch.randn(B, T, H, K)) * 0.1
    exact, _ = chunk_gla(q, k, v, g)
    calls = []
    same, _ = chunk_gla(q, k, v, g, state_roundtrip=lambda s: calls.append(1) or s)
    assert torch.equal(same, exact) and len(calls) == 2  # 10 chunks of 16: stores after chunks 4 and 8
    fp8, _ = chunk_gla(q, k, v, g, state_roundtrip=StateQuantizer("fp8_row").roundtrip)
    assert 0 < rel_err(fp8, exact) < 0.05


def test_casting_a_quantized_model_keeps_its_scales_float32():
    """``model.to(torch.bfloat16)`` after calibration casts the weights it keeps, not the weight scales, the gates'
    calibrated bounds and scales or a static state scale: rounded to bf16 they would change every value computed from
    them (and the gate kernels read them as float32)."""
    import laquant
    from laquant.models import GLAConfig, GLAForCausalLM
    from laquant.quant.modules import QuantGate, QuantLinear

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=128)).eval()
    laquant.calibrate(model, "gla_int8_all", torch.randint(0, 128, (2, 32)), progress=False)
    mixer = model.model.layers[0].attn
    mixer.register_buffer("state_static_scale", torch.rand(8) * 1e-3)
    names = ("weight_scale", "logit_min", "logit_max", "logit_scale", "state_static_scale")
    kept = {name: b.clone() for name, b in model.named_buffers() if name.rsplit(".", 1)[-1] in names}
    assert any(isinstance(m, QuantGate) for m in model.modules()) and len(kept) > 10
    model.to(torch.bfloat16)
    buffers = dict(model.named_buffers())
    for name, before in kept.items():
        assert buffers[name].dtype == torch.float32 and torch.equal(buffers[name], before), name
    linear = next(m for m in model.modules() if isinstance(m, QuantLinear) and m.n_outliers)
    assert linear.outlier_weight.dtype == torch.bfloat16  # what the model computes in follows the cast
    assert model.model.layers[0].attn_norm.weight.dtype == torch.bfloat16
    model.double()
    assert all(dict(model.named_buffers())[name].dtype == torch.float32 for name in kept)


def test_from_pretrained_in_bf16_keeps_the_scales_float32(tmp_path):
    """transformers' ``from_pretrained(dtype=torch.bfloat16)`` builds the model under bf16 and loads the checkpoint
    into it: the quantized modules' scales and the gates' calibrated bounds come back float32, bit for bit (they
    were created in the default dtype and rounded to bf16 on load)."""
    from transformers import AutoModelForCausalLM

    import laquant
    from laquant.models import GLAConfig, GLAForCausalLM

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=128)).eval()
    result = laquant.calibrate(model, "gla_int8_all", torch.randint(0, 128, (2, 32)), progress=False)
    laquant.save(result, tmp_path / "ckpt")
    names = ("weight_scale", "logit_min", "logit_max", "logit_scale")
    want = {n: b for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] in names}
    loaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16).named_buffers())
    assert any(n.endswith("logit_scale") for n in want)
    for name, buf in want.items():
        assert loaded[name].dtype == torch.float32 and torch.equal(loaded[name], buf), name
    assert loaded[next(n for n in loaded if n.endswith("outlier_weight"))].dtype == torch.bfloat16
