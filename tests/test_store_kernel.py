"""The Triton state-store kernel (a prefill's final state and checkpoints in a per-row 8-bit format)
against its PyTorch reference, StateQuantizer.store_state / state_io.store_states (GPU, or CPU under
TRITON_INTERPRET=1)."""

import pytest
import torch

from conftest import DEVICE, INTERPRETED, rel_err, require_triton_kernels
from laquant.kernels.common.state import State, StateQuantizer
from laquant.kernels.common.state_io import store_states

require_triton_kernels()
from laquant.kernels.common.store import store_rows_triton, store_state_triton, store_states_triton  # noqa: E402


def _states(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.logspace(-3, 1, shape[-2]).view(*([1] * (len(shape) - 2)), shape[-2], 1)
    return (torch.randn(*shape, generator=gen) * rows).to(DEVICE)


def _assert_codes_match(new: State, ref: State, fmt: str) -> None:
    assert new.data.dtype == ref.data.dtype and new.data.shape == ref.data.shape
    assert new.scale.shape == new.data.shape[:-1] + (1,)  # per row (a static [H, K, 1] scale expanded)
    assert rel_err(new.scale, ref.scale.expand_as(new.scale)) < 1e-6  # the same absmax, grown or static scale
    a, b = new.data.float(), ref.data.float()
    assert torch.isfinite(a).all()
    mismatched = (a != b).float().mean().item()
    if fmt == "int8_row":  # x * (1 / scale) against x / scale: only rounding-boundary flips, by one step
        assert mismatched < 0.005 and (a - b).abs().max() <= 1
    else:  # fp8: the interpreter's e4m3 conversion misrounds a binade carry (see test_decode_kernel)
        assert mismatched < (0.1 if INTERPRETED else 0.005)
    if fmt == "int8_row" or not INTERPRETED:
        assert rel_err(new.load(), ref.load()) < 0.01


@pytest.mark.parametrize("fmt", ["fp8_row", "int8_row"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("N,H,K,V", [(3, 2, 20, 40), (1, 1, 16, 16), (2, 3, 7, 10), (2, 1, 9, 130)])
def test_final_store_matches_reference(fmt, rounding, N, H, K, V):
    quant = StateQuantizer(fmt, rounding=rounding)
    state = _states((N, H, K, V), N * 100 + K + V)
    for prev in (None, State(*StateQuantizer(fmt).store(state * 2), fmt, n_stores=4)):
        new = store_state_triton(quant, state, prev, seed=11)
        ref = quant.store_state(state.clone(), prev, seed=11)
        assert new.n_stores == ref.n_stores == (5 if prev is not None else 1)
        _assert_codes_match(new, ref, fmt)


def test_stochastic_store_draws_its_keyed_bits():
    """Stochastic codes follow the seed and the store count (and equal the reference's), not nearest."""
    quant = StateQuantizer("int8_row", rounding="stochastic")
    state = _states((2, 2, 16, 64), 7)
    nearest = store_state_triton(StateQuantizer("int8_row"), state)
    first = store_state_triton(quant, state, seed=3)
    assert (first.data != nearest.data).float().mean() > 0.2
    assert not torch.equal(first.data, store_state_triton(quant, state, seed=4).data)
    again = store_state_triton(quant, state, State(first.data, first.scale, "int8_row", n_stores=1), seed=3)
    assert not torch.equal(first.data, again.data)  # store 2, other bits
    _assert_codes_match(first, quant.store_state(state, seed=3), "int8_row")


@pytest.mark.parametrize("fmt", ["fp8_row", "int8_row"])
@pytest.mark.parametrize("position", [6, 5])  # renorm_interval 3: 6 renormalises, 5 only grows the old scales
def test_renorm_and_static_scales_match_reference(fmt, position):
    state = _states((2, 2, 12, 24), position)
    prev_quant = StateQuantizer(fmt)
    prev = State(*prev_quant.store(state * torch.rand(2, 2, 12, 1, device=DEVICE) * 3), fmt, n_stores=position - 1)
    grown = StateQuantizer(fmt, renorm_interval=3, rounding="stochastic")
    _assert_codes_match(store_state_triton(grown, state, prev, seed=1), grown.store_state(state, prev, seed=1), fmt)
    static = (state.abs().amax((0, -1)) * 0.5 / prev_quant.format.qmax).unsqueeze(-1).cpu()  # half the range: clips
    naive = StateQuantizer(fmt, renorm_interval=0, static_scale=static)
    new, ref = store_state_triton(naive, state, prev), naive.store_state(state, prev)
    _assert_codes_match(new, ref, fmt)
    assert ref.scale.shape == new.scale.shape == (2, 2, 12, 1)  # per state, not the static [H, K, 1]: kernels index it
    assert (new.data.float().abs() == naive.format.qmax).any()


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_checkpoints_match_reference(rounding):
    ckpt = _states((2, 3, 2, 16, 40), 5)
    subs = [4, 8, 12]
    new = store_states_triton(ckpt, "int8_row", rounding, 9, 2, subs)
    ref = store_states(ckpt.cpu(), "int8_row", rounding, 9, 2, subs)
    _assert_codes_match(State(new.data.cpu(), new.scale.cpu(), "int8_row"), ref, "int8_row")


def test_bad_arguments_are_named():
    state = _states((1, 1, 4, 16), 0)
    with pytest.raises(ValueError, match="per-row 8-bit formats"):
        store_rows_triton(state, StateQuantizer("bf16"), 1)
    with pytest.raises(ValueError, match="expected states"):
        store_rows_triton(state[0], StateQuantizer("int8_row"), 1)
    with pytest.raises(ValueError, match=r"\(c \+ 1\) \* step"):
        store_rows_triton(state[:, None].expand(1, 2, 1, 4, 16), StateQuantizer("int8_row"), 1, subs=[1, 3])
    plain = store_state_triton(StateQuantizer("bf16"), state)  # plain formats: the reference's cast
    assert plain.data.dtype == torch.bfloat16 and plain.n_stores == 1
