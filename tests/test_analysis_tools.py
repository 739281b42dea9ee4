"""The analysis tools whose numbers the results cite:

* tools/sass_mix.py compiles the decode and verify kernels as Triton's JIT compiles the launch a model makes,
  specialized on the launch's own arguments (without that its counts were those of another program: no vectorized
  access, spills the GPU's kernel does not have);
* tools/group_codes_ppl.py's per-group W8A8 reference is the per-token one when a group spans the row, and keeps the
  outlier columns out of the groups;
* tools/step_ablation.py drops the launches of the kernels named, and only those, and puts every module's launches
  back;
* tools/static_codes_ppl.py's static W8A8 reference rounds to one calibrated scale and clips beyond it;
* tools/probe_decode_prefetch.py (and tools/with_decode_launch.py) set one decode launch for B = 64 and put the
  tables back."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from laquant.kernels import int8_outlier_linear


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_group_codes_reference_is_per_token_when_a_group_spans_the_row():
    group_codes_linear = _tool("group_codes_ppl").group_codes_linear
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 300, generator=gen) * torch.rand(300, generator=gen) * 4
    outliers = torch.tensor([3, 200])
    keep = torch.tensor([i for i in range(300) if i not in (3, 200)])
    w = torch.randint(-127, 128, (40, keep.numel()), generator=gen, dtype=torch.int8)
    ws, ow = torch.rand(40, 1, generator=gen) / 100, torch.randn(40, 2, generator=gen)
    per_token = int8_outlier_linear(x, w, ws, keep, outliers, ow)
    wide = group_codes_linear(512)(x, w, ws, keep, outliers, ow)
    torch.testing.assert_close(wide, per_token, rtol=1e-5, atol=1e-4 * per_token.abs().max().item())
    grouped = group_codes_linear(128)(x, w, ws, keep, outliers, ow)
    assert torch.isfinite(grouped).all() and not torch.allclose(grouped, per_token)
    # an outlier column's value reaches the output only through its float weight: not through any group's codes
    x_big = x.clone()
    x_big[:, 3] = 1e4
    moved = group_codes_linear(128)(x_big, w, ws, keep, outliers, torch.zeros_like(ow))
    torch.testing.assert_close(moved, group_codes_linear(128)(x, w, ws, keep, outliers, torch.zeros_like(ow)))


@pytest.fixture(scope="module")
def sass_mix():
    pytest.importorskip("triton")
    return _tool("sass_mix")


def test_loop_body_is_the_largest_loop(sass_mix):
    sass = """        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   FADD R2, R2, 1 ;
        /*0020*/              @P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0030*/                   FFMA R3, R3, R4, R5 ;
        /*0040*/                   FMUL R3, R3, R3 ;
        /*0050*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*0060*/                   IADD3 R6, R6, 1, RZ ;
        /*0070*/              @!P1 BRA !P2, `(.L_x_2) ;
        /*0080*/                   EXIT ;"""
    body = sass_mix.loop_body(sass)
    assert body.startswith(".L_x_2:") and body.rstrip().endswith("`(.L_x_2) ;")
    assert sass_mix.mix(body) == {"FFMA": 1, "FMUL": 1, "BRA": 2, "IADD3": 1}
    assert sass_mix.loop_body(sass.replace("`(.L_x_2)", "`(.L_x_4)").replace("`(.L_x_1)", "`(.L_x_5)")) == ""


def _index(fn, name):
    return (fn.arg_names.index(name),)


@pytest.mark.parametrize("kernel, commit", [("gla", False), ("delta", False), ("gla_verify", False),
                                            ("gla_verify", True), ("delta_verify", False), ("delta_verify", True)])
def test_model_launch_is_specialized_as_the_jit_does(kernel, commit, sass_mix):
    fn, args, kwargs = sass_mix.model_launch(kernel, "int8_row:stochastic", 16, 1, tokens=4, commit=commit)
    options, signature, constexprs, attrs = sass_mix.jit_specialization(fn, args, kwargs)
    assert options.num_warps == 1 and constexprs[_index(fn, "SR")]
    if kernel.endswith("_verify"):
        assert constexprs[_index(fn, "COMMIT")] == commit
    else:
        assert constexprs[_index(fn, "BLOCK_K")] == 16 and constexprs[_index(fn, "PDL")] == 2
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


def test_step_ablation_skips_only_the_named_kernels_and_puts_the_launches_back(monkeypatch):
    """tools/step_ablation.py's ``skip:KERNEL`` (what a kernel adds to the graphed step's critical path) replaces
    ``launch_kernel`` in every laquant module that launches kernels; the named kernel's launches are dropped, the
    others still launched, and every module gets the original back afterwards, also after an error."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    step_ablation = _tool("step_ablation")
    from laquant.kernels.common import launch
    from laquant.kernels.gla import decode
    from laquant.kernels.rowwise import fused

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    launched = []

    class Kernel:
        def __init__(self, name):
            self.__name__ = name

        def __getitem__(self, grid):  # launch_kernel's path for a kernel without Triton's device caches
            return lambda *args, **kwargs: launched.append(self.__name__) or self.__name__

    original = launch.launch_kernel
    with step_ablation.ablated("skip:_gla_decode_kernel+_rms_norm_kernel"):
        assert decode.launch_kernel is not original and fused.launch_kernel is decode.launch_kernel
        assert decode.launch_kernel(Kernel("_gla_decode_kernel"), (1,)) is None
        assert fused.launch_kernel(Kernel("_rms_norm_kernel"), (1,)) is None
        assert fused.launch_kernel(Kernel("_swiglu_kernel"), (1,), 3) == "_swiglu_kernel"
    assert launched == ["_swiglu_kernel"]
    assert decode.launch_kernel is original and fused.launch_kernel is original and launch.launch_kernel is original
    with pytest.raises(RuntimeError), step_ablation.ablated("skip:_gla_decode_kernel"):
        raise RuntimeError("the step failed")
    assert decode.launch_kernel is original
    import laquant.errors

    assert not hasattr(laquant.errors, "launch_kernel")  # a module that launches nothing is left alone
    with pytest.raises(SystemExit, match="unknown ablation"), step_ablation.ablated("skip_decode"):
        pass


def test_static_codes_reference_rounds_to_one_scale_and_clips(monkeypatch):
    """tools/static_codes_ppl.py's static W8A8 product: the kept columns' codes ``clamp(round(x / s))`` times ``s`` with
    the dequantized weight, the outlier columns in float; a value beyond ``127 s`` clips; the scale comes from the
    largest bound of the non-outlier columns."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    static_codes = _tool("static_codes_ppl")
    from laquant.quant.modules import QuantLinear

    torch.manual_seed(0)
    linear = torch.nn.Linear(40, 24)
    module = QuantLinear.from_linear(linear, torch.tensor([3, 17]))
    bound = torch.rand(40) + 0.5
    bound[3] = 100.0  # an outlier column's bound is not the scale's
    scale = static_codes.static_scale(module, bound)
    assert scale.item() == pytest.approx(bound[module.keep_idx].max().item() / 127)
    x = torch.randn(5, 40)
    x[0, 5] = 1000.0  # clips to 127 s
    y = static_codes.static_forward(module, scale)(x)
    w = module.dequantized_weight()
    kept = torch.clamp(torch.round(x[:, module.keep_idx] / scale), -127, 127) * scale
    want = kept @ w[:, module.keep_idx].T + x[:, module.outlier_idx] @ w[:, module.outlier_idx].T + linear.bias
    assert torch.allclose(y, want, atol=1e-4) and torch.isfinite(y).all()
    assert (y - module(x)).abs().max() > 1  # the clipped value: not the per-token product


def test_probe_decode_prefetch_sets_one_launch_and_puts_the_tables_back():
    from laquant.kernels.common import state_io

    probe = _tool("probe_decode_prefetch")
    assert probe.parse_launch("8x1p") == (8, 1, True) and probe.parse_launch("16x2") == (16, 2, False)
    copy = lambda: ({g: dict(e) for g, e in state_io.STEP_DECODE_LAUNCH.items()}, set(state_io.DECODE_PREFETCH))  # noqa: E731
    before = copy()
    gpu = next(iter(state_io.STEP_DECODE_LAUNCH))
    with probe.tabled("ssd", (32, 2, False), gpu):
        assert state_io.decode_launch("ssd", "int8_row", 10**6, gpu) == (32, 2)
        assert not state_io.decode_prefetch("ssd", "int8_row", 10**6)
        assert state_io.decode_launch("ssd", "int8_row", 1, gpu) == state_io.bucket_launch(
            state_io.decode_table("ssd", gpu)["int8_row"], 1)  # the small-batch buckets untouched
        assert state_io.decode_launch("ssd", "int8_row", 10**6, "NVIDIA Z9") != (32, 2)  # another GPU's untouched
    with probe.tabled("gla", (16, 1, True), "NVIDIA Z9"):  # a GPU without an entry gets one
        assert state_io.decode_launch("gla", "int8_row", 10**6, "NVIDIA Z9") == (16, 1)
        assert state_io.decode_prefetch("gla", "int8_row", 10**6)
        assert state_io.decode_launch("delta", "int8_row", 10**6, "NVIDIA Z9") == state_io.decode_launch(
            "delta", "int8_row", 10**6, "NVIDIA H200")  # what it took from the H200's overlay, kept
    assert copy() == before
    with pytest.raises(SystemExit, match="no prefetching walk"):
        with probe.tabled("delta", (8, 1, True), gpu):
            pass
    assert copy() == before


def test_sweep_step_tiles_writes_each_gpus_overlay(tmp_path, monkeypatch):
    """tools/sweep_step_tiles.py --write merges the kept decode launches into STEP_DECODE_LAUNCH under their GPU (an
    entry None drops the committed one, other GPUs' stay) and leaves STEP_TABLES as committed when no tile changed."""
    import ast
    import shutil

    from laquant.kernels.common import state_io
    from laquant.kernels.gemm import configs

    lookups = configs._entry, state_io.decode_launch
    tool = _tool("sweep_step_tiles")
    assert (configs._entry, state_io.decode_launch) == lookups  # importing the tool leaves the lookups alone
    for sub, module in (("gemm", configs), ("common", state_io)):
        (tmp_path / sub).mkdir()
        shutil.copy(module.__file__, tmp_path / sub / Path(module.__file__).name)
    monkeypatch.setattr(tool.configs, "__file__", str(tmp_path / "gemm" / "configs.py"))
    h200 = dict(state_io.STEP_DECODE_LAUNCH["NVIDIA H200"])
    tool.write({}, {"NVIDIA X100": {("gla", "int8_row", None): (16, 1)},
                    "NVIDIA H200": {("delta", "int8_row", None): None}})

    def block(path, name):
        src = path.read_text()
        body = src.split("# --- generated by tools/sweep_step_tiles.py: begin ---\n")[1].split("# --- generated")[0]
        assert body.startswith(f"{name}: dict = ")
        return ast.literal_eval(body.split("=", 1)[1].strip())

    written = block(tmp_path / "common" / "state_io.py", "STEP_DECODE_LAUNCH")
    h200.pop(("delta", "int8_row", None))
    assert written == {**{g: e for g, e in state_io.STEP_DECODE_LAUNCH.items() if g != "NVIDIA H200"},
                       "NVIDIA H200": h200, "NVIDIA X100": {("gla", "int8_row", None): (16, 1)}}
    assert block(tmp_path / "gemm" / "configs.py", "STEP_TABLES") == configs.STEP_TABLES


def test_read_floor_kernel_sums_each_programs_chunk():
    """tools/read_floor_probe.py's read-only kernel reads every word of the weight once: its per-program sums (int32,
    wrapping) are the chunks' (interpreted here)."""
    from conftest import INTERPRETED, require_triton_kernels

    require_triton_kernels()
    probe = _tool("read_floor_probe")
    device = "cpu" if INTERPRETED else "cuda"
    gen = torch.Generator().manual_seed(0)
    for N, K, programs in ((64, 96, 3), (40, 1024, 7)):
        words = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=gen).view(torch.int32).reshape(-1)
        got = probe.read_all(words.to(device), programs, torch.empty(programs, dtype=torch.int32, device=device))
        assert torch.equal(got.cpu(), probe.read_reference(words, programs))
        assert not torch.equal(probe.read_reference(words, programs), probe.read_reference(words.roll(1), programs))


def test_short_conv_bench_runs_both_paths(monkeypatch):
    """tools/bench_short_conv.py times the model's short_conv by the PyTorch path and by the kernel: both are taken
    (the switch reaches the model's function) and agree (interpreted here)."""
    from conftest import require_triton_kernels

    from laquant.kernels.conv import short_conv as module

    require_triton_kernels()
    bench = _tool("bench_short_conv")
    calls = []
    real = module.short_conv_triton
    monkeypatch.setattr(module, "short_conv_triton", lambda *a, **k: calls.append(1) or real(*a, **k))
    gen = torch.Generator().manual_seed(0)
    conv, x, cols = bench._case(40, 24, 4, 2, 9, "cpu", torch.float32, gen)
    (a, ka), (b, kb) = bench.run(conv, x, cols, False), bench.run(conv, x, cols, True)
    assert len(calls) == 1 and torch.allclose(a, b, rtol=1e-5, atol=1e-6) and torch.equal(ka, kb)
    for N, C, W, columns in bench.SHAPES.values():  # every timed case's layout builds (a wrong check stopped a run)
        _, x, cols = bench._case(N, C, W, 1, 2, "cpu", torch.float32, gen, columns)
        assert x.shape[-1] == N and (cols is None or (cols.numel() == C and int(cols.max()) < N))


def test_sweep_kernels_writes_the_sweeps_gpus_decode_table(tmp_path, monkeypatch):
    """tools/sweep_kernels.py state_decode --write puts the fastest launch per bucket into the sweep's GPU's table
    (a GPU without one starts from the table it took: the formats not swept keep those launches) and leaves the other
    GPUs' tables; rows of two GPUs are refused."""
    from laquant.kernels.common import state_io

    tool = _tool("sweep_kernels")
    written = []
    monkeypatch.setattr(tool, "_write_generated", lambda mode, lines: written.append((mode, "".join(lines))))
    us = {(64, 4): (2.0, 5.0, 30.0), (32, 2): (3.0, 4.0, 20.0), (16, 1): (9.0, 9.0, 10.0)}
    rows = [dict(device="NVIDIA X100", kernel="gla", shape=[B, 16, 16, 64, 128], B=B, programs=B * 16, format=fmt,
                 block_k=bk, num_warps=w,
                 us=us[bk, w][i]) for fmt in ("int8_row:stochastic", "fp32") for i, B in enumerate((1, 16, 64))
            for bk, w in us]
    tool._write_state_tables(rows)
    (mode, text), = written
    ns = {}
    exec(text, ns)
    tables = ns["DECODE_LAUNCH"]
    assert mode == "state_decode" and list(tables)[:-1] == list(state_io.DECODE_LAUNCH)
    assert all(tables[gpu] == kernels for gpu, kernels in state_io.DECODE_LAUNCH.items())
    own = tables["NVIDIA X100"]
    assert set(own) == {"gla"}
    assert own["gla"]["int8_row"] == own["gla"]["fp32"] == ((16, 64, 4), (256, 32, 2), (None, 16, 1))
    assert own["gla"]["fp8_row"] == state_io.decode_table("gla", "NVIDIA X100")["fp8_row"]  # not swept: as taken
    with pytest.raises(SystemExit, match="one GPU's sweep"):
        tool._write_state_tables(rows + [dict(rows[0], device="NVIDIA X200")])
    unnamed = tmp_path / "sweep.jsonl"  # rows from before a sweep named its GPU: --device names it
    unnamed.write_text("".join(json.dumps({k: v for k, v in row.items() if k != "device"}) + "\n" for row in rows))
    with pytest.raises(SystemExit, match="--device NAME"):
        tool.state_decode("--write", "--from", str(unnamed))
    tool.state_decode("--write", "--from", str(unnamed), "--device", "NVIDIA", "X100")
    assert written[-1] == written[0]
