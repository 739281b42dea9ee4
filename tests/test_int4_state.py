"""The 4-bit recurrent state (``int4_row``, issue #16's stretch item): int4 codes in [-7, 7] with a
float32 scale per K row, two codes per byte, rounded to nearest or stochastically with the 8-bit
formats' Philox bits; reference path only."""

import pytest
import torch

from laquant.errors import LaquantError
from laquant.kernels.common.formats import KERNEL_FORMATS, get_format, kernel_code
from laquant.kernels.common.numerics import (INT4_PAD, codes, pack_int4, quantize_int4, round_stochastic_int,
                                             unpack_int4)
from laquant.kernels.common.state import State, StateQuantizer, StoreKey, state_random_bytes

SHAPES = [(1,), (7,), (3, 5), (2, 3, 1), (2, 3, 4, 9), (1, 2, 3, 128), (2, 1, 5, 33)]


@pytest.mark.parametrize("shape", SHAPES)
def test_packing_is_exact_two_codes_per_byte(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    q = torch.randint(-7, 8, shape, generator=gen, dtype=torch.int8)
    q.view(-1)[:2] = torch.tensor([-7, 7][: q.numel()], dtype=torch.int8)[: min(2, q.numel())]
    packed = pack_int4(q)
    V = shape[-1]
    assert packed.dtype == torch.uint8 and packed.shape == (*shape[:-1], (V + 1) // 2)
    assert torch.equal(unpack_int4(packed), q) and torch.equal(codes(packed), q)
    # byte j: code 2j in the low nibble, code 2j + 1 in the high one (4-bit two's complement)
    flat_q, flat_p = q.reshape(-1, V), packed.reshape(-1, packed.shape[-1])
    low = int(flat_q[0, 0]) & 0xF
    high = (int(flat_q[0, 1]) & 0xF) if V > 1 else INT4_PAD
    assert int(flat_p[0, 0]) == low | high << 4
    if V % 2:
        assert ((flat_p[:, -1] >> 4) == INT4_PAD).all()  # the pad: a code never stored


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("V", [16, 9, 1])
def test_round_trip_within_the_grid(rounding, V):
    gen = torch.Generator().manual_seed(V)
    x = torch.randn(3, 2, 5, V, generator=gen) * torch.logspace(-3, 2, 5).view(5, 1)  # rows of many magnitudes
    quant = StateQuantizer("int4_row", rounding=rounding)
    stored = quant.store_state(x, None, seed=11)
    assert stored.data.dtype == torch.uint8 and stored.data.shape == (3, 2, 5, (V + 1) // 2)
    assert stored.scale.shape == (3, 2, 5, 1)
    scale = x.abs().amax(-1, keepdim=True) / 7
    assert torch.equal(stored.scale, scale)
    q = codes(stored.data).float()
    assert q.abs().max() <= 7 and (q.abs().amax(-1) == 7).all()  # every row's absmax lands on the top code
    y = stored.load()
    assert y.shape == x.shape and torch.isfinite(y).all()
    err = (y - x).abs()
    step = scale.expand_as(x)
    if rounding == "nearest":
        assert (err <= step / 2 * (1 + 1e-5)).all()
        assert torch.equal(q, (x / scale).round())
    else:
        assert (err < step * (1 + 1e-5)).all()  # one of the two neighbouring codes
        assert ((q - x / scale).abs() < 1).all()
    if V > 1:  # (V = 1: each element is its row's absmax, exact)
        assert (err > step / 8).any()  # a 4-bit grid is coarse: the test sees its error


def test_zero_rows_and_static_scales():
    x = torch.randn(1, 1, 3, 6)
    x[..., 1, :] = 0
    stored = StateQuantizer("int4_row").store_state(x)
    assert torch.equal(stored.load()[0, 0, 1], torch.zeros(6))
    static = torch.full((1, 3, 1), 0.01)
    clipped = StateQuantizer("int4_row", renorm_interval=0, static_scale=static).store_state(x * 10)
    assert codes(clipped.data).abs().max() == 7 and (clipped.load().abs() <= 0.07 + 1e-7).all()


def test_stochastic_bits_are_the_8bit_formats_philox_bits():
    """int4_row draws element (h, k, v)'s byte exactly as int8_row does (state_random_bytes keyed by
    seed, slot, store count, sub-store), so the codes are the int8 rule on the int4 grid."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 21, generator=gen)
    key = StoreKey(1234567, torch.tensor([3, 8]), torch.tensor([17, 2]), sub=1)
    data, scale = StateQuantizer("int4_row", rounding="stochastic").store(x, key=key)
    r = state_random_bytes(1234567, torch.tensor([3, 8]), torch.tensor([17, 2]), 1, x.shape)
    expected = round_stochastic_int((x / scale).clamp(-7, 7), r)
    assert torch.equal(codes(data).float(), expected)
    again, _ = StateQuantizer("int4_row", rounding="stochastic").store(x, key=key)
    assert torch.equal(again, data)  # reproducible
    other, _ = StateQuantizer("int4_row", rounding="stochastic").store(x, key=StoreKey(1234568, key.slots, key.position, 1))
    assert not torch.equal(other, data)
    nearest, _ = quantize_int4(x, scale=scale)
    assert not torch.equal(nearest, data)


def test_stochastic_rounding_is_unbiased():
    gen = torch.Generator().manual_seed(0)
    values = torch.tensor([0.3, -0.77, 0.05, 5.123, 6.6, -3.49, 1e-2])
    n = 20000
    x = values.repeat(n, 1)
    r = torch.randint(0, 256, x.shape, generator=gen)
    q, _ = quantize_int4(x, scale=torch.tensor(1.0), rounding="stochastic", random=r)
    mean = codes(q).float().mean(0)
    tol = 5 * 0.5 / n ** 0.5 + 1 / 512  # 5 sigma of a two-point draw plus the 8-bit bias bound
    assert ((mean - values).abs() <= tol).all(), (mean, values)
    qn, _ = quantize_int4(x, scale=torch.tensor(1.0))
    assert ((codes(qn).float().mean(0) - values).abs() > tol).any()  # nearest is biased here: the test can tell


def test_decay_survives_stochastic_rounding_only():
    """A row decaying by 0.95 a step on a 4-bit grid: nearest stalls, stochastic follows in expectation."""
    width, steps, start = 512, 30, 3.0
    init = torch.full((1, 1, 1, width), start)
    init[..., 0] = 7.0  # the anchor holds the scale at one unit per code
    results = {}
    for rounding in ("nearest", "stochastic"):
        quant = StateQuantizer("int4_row", 1, rounding=rounding)
        stored = quant.store_state(init, None, seed=5)
        for _ in range(steps):
            h = stored.load()
            h[..., 1:] *= 0.95
            stored = quant.store_state(h, stored, seed=5)
        results[rounding] = stored.load()[..., 1:].mean().item()
    expected = start * 0.95 ** steps
    assert results["nearest"] == start
    assert abs(results["stochastic"] - expected) < 0.1 * expected + 0.05, (results, expected)


def test_bytes_per_state_halves_int8_data():
    int4, int8 = get_format("int4_row"), get_format("int8_row")
    for k, v, heads in ((64, 128, 4), (16, 33, 2), (3, 1, 1)):
        scales = 4 * heads * k
        assert int4.bytes_per_state(k, v, heads) - scales == heads * k * ((v + 1) // 2)
        if v % 2 == 0:
            assert 2 * (int4.bytes_per_state(k, v, heads) - scales) == int8.bytes_per_state(k, v, heads) - scales
        stored = StateQuantizer("int4_row").store_state(torch.randn(1, heads, k, v))
        assert stored.nbytes() == int4.bytes_per_state(k, v, heads)
    assert State.empty((2, 3, 4, 9), "int4_row", "cpu").data.shape == (2, 3, 4, 5)


def test_kernels_refuse_int4_and_the_dispatch_keeps_it_on_the_references():
    from laquant.kernels.common.dispatch import use_triton
    from laquant.kernels.common.state_io import pool_args

    assert "int4_row" not in KERNEL_FORMATS and get_format("int4_row").kernel_code is None
    with pytest.raises(ValueError, match="store states as fp32, bf16, fp8_row, int8_row, not 'int4_row'"):
        kernel_code("int4_row")
    stored = StateQuantizer("int4_row").store_state(torch.randn(2, 1, 4, 8))
    with pytest.raises(ValueError, match="not 'int4_row'"):
        pool_args(stored.data, stored.row_scale, torch.arange(2, dtype=torch.int32), None, StateQuantizer("int4_row"),
                  1, 4, None, None)
    assert not use_triton(torch.zeros(1), "int4_row")


def test_recipes_accept_int4_row():
    from laquant.recipe import load_recipe

    r = load_recipe("gla_fp8_state", ["state.format=int4_row", "state.rounding=stochastic"])
    assert r["state"]["format"] == "int4_row" and r["state"]["rounding"] == "stochastic"
    assert load_recipe("gla_int8", ["state.format=int4_row", "state.rounding=nearest"])["state"]["format"] == "int4_row"
    with pytest.raises(LaquantError, match="allowed: .*int4_row"):
        load_recipe("gla_int8", ["state.format=int2_row"])


@torch.no_grad()
def test_gla_decodes_with_an_int4_state_on_cpu(tiny_model_dir):
    """Calibrated with int4_row stochastic: the cache holds packed uint8 states, decode is finite and
    close to the fp32 state's, prefill and decode stores agree in layout, the saturation counter
    counts the unpacked codes, and a prefill's checkpoints and a static copy keep the packing."""
    from laquant import calibrate
    from laquant.calibration.run import calibration_batches
    from laquant.eval.ppl import perplexity
    from laquant.loading import load_model
    from laquant.models.cache import CheckpointRequest
    from laquant.recipe import load_recipe

    ids = torch.randint(0, 8192, (200,), generator=torch.Generator().manual_seed(0))
    model, _ = load_model(tiny_model_dir)
    base = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False)
    calibrate(model, load_recipe("gla_fp8_state", ["state.format=int4_row", "state.rounding=stochastic"]),
              data=calibration_batches(ids, 2, 64, 0), progress=False)
    mixer = model.model.layers[0].attn
    assert mixer.state_quantizer.format.name == "int4_row" and mixer.state_quantizer.stochastic
    H, K, V = mixer.num_heads, mixer.head_k_dim, mixer.head_v_dim

    res = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False)
    assert res.ppl == res.ppl and abs(res.ppl / base.ppl - 1) < 0.05, (res.ppl, base.ppl)
    sat = res.saturation
    layers = len(model.model.layers)
    assert sat["state_formats"] == ["int4_row"] and sat["state_nonfinite"] == 0
    sequences = sat["state_elements"] // (47 * layers * H * K * V)  # elements counted unpacked
    assert sequences * 47 * layers * H * K * V == sat["state_elements"] and sequences > 0
    assert sat["state_at_limit"] >= sequences * 47 * layers * H * K  # >= one code at 7 per row and step

    cache = model.new_cache(seed=3)
    cache.checkpoints = CheckpointRequest(64)
    model(input_ids=ids[None, :130], past_key_values=cache, use_cache=True)
    ckpt = cache.checkpoints.states[0]
    assert ckpt.format == "int4_row" and ckpt.data.shape == (1, 2, H, K, (V + 1) // 2)
    out = [model(input_ids=ids[None, 130 + t:131 + t], past_key_values=cache, use_cache=True).logits for t in range(3)]
    state = cache.states[0]
    assert state.data.dtype == torch.uint8 and state.data.shape == (1, H, K, (V + 1) // 2)
    assert state.n_stores == 4 and all(torch.isfinite(o).all() for o in out)
    static = cache.static_copy()
    assert static.states[0].data.shape == state.data.shape and torch.equal(static.states[0].load(), state.load())



def test_group_probe_with_whole_rows_is_int4_row():
    """tools/int4_group_probe.py's fake-quantized store with one group per row is int4_row's round
    trip bit for bit (its numbers for smaller groups rest on this); smaller groups err less."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("int4_group_probe",
                                                  Path(__file__).parents[1] / "tools" / "int4_group_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    x = torch.randn(3, 2, 8, 64) * torch.rand(3, 2, 8, 64) ** 4  # heavy-tailed rows
    key = StoreKey(7, torch.arange(3), 5)
    quant = StateQuantizer("int4_row", rounding="stochastic")
    row = quant.load(*quant.store(x, key=key))
    assert torch.equal(probe.GroupInt4(64, "stochastic").store(x, key=key)[0], row)
    group16 = probe.GroupInt4(16, "stochastic").store(x, key=key)[0]
    assert (group16 - x).norm() < (row - x).norm()
    e2m1 = probe.GroupInt4(64, "nearest", "e2m1").store(x)[0]
    assert torch.allclose(e2m1.abs().amax(-1), x.abs().amax(-1), rtol=1e-6, atol=0)  # each row's absmax kept
    assert ((e2m1 - x).abs() > 0).any()
    h = probe.hadamard(64, "cpu")
    assert torch.allclose(h @ h.T, torch.eye(64), atol=1e-6)  # orthonormal: the rotation loses nothing
    rotated = probe.GroupInt4(64, "stochastic", rotate=True).store(x, key=key)[0]
    assert (rotated - x).norm() < (row - x).norm()  # heavy-tailed rows spread out: a smaller step


@pytest.mark.gpu
@torch.no_grad()
def test_int4_state_on_cuda_takes_the_reference_path(tiny_model_dir):
    """On CUDA an int4_row state runs on the references (no kernel stores it): the stores equal the
    CPU's bit for bit, a model decodes eagerly with packed uint8 states, and a CUDA-graphed decode
    (which needs in-place kernel stores) falls back to the eager loop, or refuses when insisted on."""
    from laquant.generate import generate
    from laquant.kernels.common.state import StateQuantizer
    from laquant.loading import load_model

    x = torch.randn(3, 2, 8, 33)
    quant = StateQuantizer("int4_row", rounding="stochastic")
    cpu = quant.store_state(x, None, seed=9)
    gpu = quant.store_state(x.cuda(), None, seed=9)
    assert torch.equal(gpu.data.cpu(), cpu.data) and torch.equal(gpu.scale.cpu(), cpu.scale)

    model, _ = load_model(tiny_model_dir, device="cuda")
    for layer in model.model.layers:
        layer.attn.state_quantizer = StateQuantizer("int4_row", rounding="stochastic")
    ids = torch.randint(0, 8192, (2, 70), device="cuda")
    eager = generate(model, ids, 8, graphed=False)
    assert torch.equal(generate(model, ids, 8), eager)  # graphed=None: the eager loop
    with pytest.raises(LaquantError, match="in place"):
        generate(model, ids, 8, graphed=True)
