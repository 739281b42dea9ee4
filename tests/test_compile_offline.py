"""Kernels compile for sm_90 without a GPU (tools/compile_offline.py): the CPU suite runs them only under Triton's
interpreter, which does not check what the compiler rejects (a prompt short conv that could never have compiled
passed every interpreted test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TOOLS = Path(__file__).parents[1] / "tools"


def _run(code: str, tmp_path, interpret: bool = False) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python without TRITON_INTERPRET (the kernels then are JIT functions; ``interpret``: with
    it), tools/ importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(TOOLS), str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module", autouse=True)
def _compiler():
    pytest.importorskip("triton")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError:
        pytest.skip("Triton without its NVIDIA backend")


def test_the_kernels_compile_for_sm90(tmp_path):
    """... each with the FMA contraction it asks for: none leaves it to Triton's default (Triton 3.9 warns where one
    does, and 3.10 turns the default off)."""
    done = _run("import compile_offline, sys; sys.exit(compile_offline.main([]))", tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert sum(line.startswith("ok") for line in lines) >= 50 and not any("FAILED" in line for line in lines)
    assert "TRITON_DEFAULT_FP_FUSION" not in done.stderr, done.stderr[-4000:]


def test_gathered_columns_in_aligned_runs_are_read_with_wide_loads(tmp_path):
    """The prompt conv over qwen3_next-like columns (aligned runs of a head's 128) has the plain conv's vectorized
    reads in its run path; over rows whose runs cannot be aligned it has none. Which path a block takes at run time is
    tests/test_short_conv.py's (interpreted)."""
    code = textwrap.dedent('''
        import torch, compile_offline
        [(fn, args, kwargs)] = compile_offline.short_conv_runs()
        print("RUNS", compile_offline.wide_loads(fn, args, kwargs))
        from laquant.kernels.conv import short_conv as sc
        with compile_offline.captured(sc) as launches:
            x = torch.randn(1, 64, 769, dtype=torch.bfloat16)[..., 1:]  # rows of odd length: no aligned run
            sc.short_conv_triton(x, None, torch.randn(512, 4, dtype=torch.bfloat16), None, "silu", args[1])
        print("UNALIGNED", compile_offline.wide_loads(*launches[0]))
        ''')
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = dict(line.split() for line in done.stdout.splitlines() if line.startswith(("RUNS", "UNALIGNED")))
    assert int(counts["RUNS"]) >= 8 and int(counts["UNALIGNED"]) == 0, counts


def test_a_kernel_the_interpreter_runs_but_the_compiler_rejects_fails(tmp_path):
    """The pattern the prompt short conv had: a name re-typed inside a runtime ``if``."""
    (tmp_path / "retyped.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def retyped(x_ptr, BLOCK: tl.constexpr):
            src = tl.arange(0, BLOCK)
            tl.store(x_ptr + src, src)
            if tl.program_id(0) == 0:
                src = tl.zeros([2 * BLOCK], dtype=tl.int64)
                tl.store(x_ptr + src, src)
        '''))
    code = textwrap.dedent('''
        import torch, compile_offline, retyped
        x = torch.zeros(64, dtype=torch.int64)
        [(fn, kw, error)] = compile_offline.compile_launches([(retyped.retyped, (x,), dict(BLOCK=16))])
        print("ERROR", error)
        ''')
    done = _run(code, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "ERROR CompilationError" in done.stdout


def test_launches_recorded_in_an_interpreted_run_compile(tmp_path):
    """tools/launch_record.py records what a CPU run launches (each distinct specialization once), and
    compile_offline.py --recorded compiles each for sm_90, and reports a launch it cannot rebuild."""
    path = tmp_path / "launches.jsonl"
    record = textwrap.dedent(f'''
        import json, torch, launch_record
        from laquant.kernels.conv.short_conv import short_conv_step_triton
        from laquant.kernels.moe.combine import gated_shared_sum_triton
        recorder = launch_record.Recorder()
        for C in (37, 37, 64):  # the second launch specializes as the first: recorded once
            x, prev = torch.randn(2, C)[:, :C], torch.randn(2, 3, C)
            short_conv_step_triton(x, prev, torch.randn(C, 4), None, "silu", None, state_out=torch.empty_like(prev))
        x, shared, gate = torch.randn(3, 40), torch.randn(3, 40), torch.randn(1, 40)
        gated_shared_sum_triton(x, gate, shared, torch.randn(6, 40), 2)
        recorder.stop()
        recorder.records["bogus"] = dict(kernel="laquant.kernels.moe.combine:_no_such_kernel", args=[], kwargs={{}})
        recorder.write({str(path)!r})
        ''')
    done = _run(record, tmp_path, interpret=True)
    assert done.returncode == 0, done.stderr[-4000:]
    kernels = [json.loads(line)["kernel"] for line in path.read_text().splitlines()]
    assert sorted(k.rsplit(":", 1)[1] for k in kernels) == ["_gated_shared_sum_kernel", "_no_such_kernel",
                                                            "_short_conv_step_kernel", "_short_conv_step_kernel"]
    done = _run(f"import compile_offline, sys; sys.exit(compile_offline.main(['--recorded', {str(path)!r}]))",
                tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and sum(line.startswith("ok") for line in lines) == 3, done.stdout + done.stderr
    assert any(line.startswith("FAILED") and "not rebuilt" in line for line in lines)


def test_a_recorded_launch_keeps_its_layout():
    """What specializes a compile survives the record: dtype, shape, strides, 16-byte alignment, scalars, dtypes."""
    sys.path.insert(0, str(TOOLS))
    try:
        import launch_record
    finally:
        sys.path.remove(str(TOOLS))
    import torch

    for t in (torch.randn(5, 8)[:, 1:], torch.randn(4, 6, dtype=torch.float64).t(), torch.zeros(0, 3, dtype=torch.int8),
              torch.randn(16, dtype=torch.bfloat16)[8:]):
        back = launch_record.decode_value(json.loads(json.dumps(launch_record.encode_value(t))))
        assert (back.dtype, back.shape, back.stride()) == (t.dtype, t.shape, t.stride())
        assert (back.data_ptr() % 16 == 0) == (t.data_ptr() % 16 == 0)
    for v in (3, 1, 2.5, True, None, "silu", torch.int32):
        assert launch_record.decode_value(json.loads(json.dumps(launch_record.encode_value(v)))) == v
    assert launch_record.encode_launch(type("K", (), {"fn": lambda: None})(), (), {}) is None  # not laquant's
