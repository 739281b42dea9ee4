"""tools/sass_mix.py compiles the decode kernels as Triton's JIT compiles the launch a model makes: specialized on
the launch's own arguments. Without that its counts were those of another program (no vectorized access, spills the
GPU's kernel does not have)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")

spec = importlib.util.spec_from_file_location("sass_mix", Path(__file__).parents[1] / "tools" / "sass_mix.py")
sass_mix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_mix)


def _index(fn, name):
    return (fn.arg_names.index(name),)


@pytest.mark.parametrize("kernel", ["gla", "delta"])
def test_decode_launch_is_specialized_as_the_jit_does(kernel):
    fn, args, kwargs = sass_mix.model_launch(kernel, "int8_row:stochastic", 16, 1)
    options, signature, constexprs, attrs = sass_mix.jit_specialization(fn, args, kwargs)
    assert options.num_warps == 1 and constexprs[_index(fn, "BLOCK_K")] == 16
    assert constexprs[_index(fn, "SR")] and constexprs[_index(fn, "PDL")] == 2
    # the unit strides of q, k and v (views of one projection or conv output) are constants, as on the GPU
    for stride in ("s_qk", "s_kk", "s_vv"):
        assert signature[stride] == "constexpr" and constexprs[_index(fn, stride)] == 1
    # the state pool's pointer is aligned and its row stride a multiple of 16: the loads can be vectorized
    assert ["tt.divisibility", 16] in attrs[_index(fn, "state_ptr")]
    assert ["tt.divisibility", 16] in attrs[_index(fn, "s_sk")]
    # the stochastic rounding's seed stays a runtime value
    assert signature["seed"] == "i32" and not attrs.get(_index(fn, "seed"))
    if kernel == "gla":
        assert constexprs[_index(fn, "GNORM")] and constexprs[_index(fn, "CODES")]
