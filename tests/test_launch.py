"""kernels/common/launch.py: ``launch_kernel`` launches what ``kernel[grid]`` would, a compiled kernel per
specialization Triton's binder gives (a stand-in kernel on the CPU), and on a GPU the same results as
``kernel[grid]`` across pointer alignments, streams and a CUDA graph capture."""

import pytest
import torch

from laquant.kernels.common import launch as launch_mod


class _Compiled:
    def __init__(self, n: int):
        self.n, self.function, self.packed_metadata, self.runs = n, f"function{n}", f"meta{n}", []

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream)

    def run(self, *args):
        self.runs.append(args)


class _Kernel:
    """Triton's shape of a JITFunction: ``device_caches[device][4]`` is the binder, ``kernel[grid](...)`` the
    slow launch (compiling a new kernel each time it is called here). The binder specializes tensors on their
    16-byte alignment and integers on being 1, as Triton's does."""

    def __init__(self):
        self.device_caches = {0: (None, None, None, None, self.binder)}
        self.compiled = []

    @staticmethod
    def binder(*args, **kwargs):
        bound = {f"a{i}": a for i, a in enumerate(args)}
        bound.update((k, v) for k, v in kwargs.items() if k != "enable_fp_fusion")  # a compile option alone
        spec = [("*", a.data_ptr() % 16 == 0) if torch.is_tensor(a) else ("i32", a == 1) for a in args]
        return bound, spec, {k: v for k, v in kwargs.items() if k in ("num_warps", "launch_pdl", "enable_fp_fusion")}

    def __getitem__(self, grid):
        def slow(*args, **kwargs):
            self.compiled.append(_Compiled(len(self.compiled)))
            self.compiled[-1].runs.append(("slow", grid, args, kwargs))
            return self.compiled[-1]
        return slow


@pytest.fixture
def cpu_cuda(monkeypatch):
    """The device and stream lookups launch_kernel makes, answered on the CPU."""
    monkeypatch.setattr(launch_mod, "ENABLED", True)
    monkeypatch.setattr(launch_mod, "_COMPILED", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)


def test_the_first_launch_of_a_specialization_compiles_through_triton_the_next_reuse_it(cpu_cuda):
    kernel = _Kernel()
    buf = torch.zeros(64)
    x, y = buf[:32], buf[32:]
    first = launch_mod.launch_kernel(kernel, (3,), x, 7, num_warps=4)
    assert first is kernel.compiled[0] and first.runs[0][0] == "slow"
    again = launch_mod.launch_kernel(kernel, (5, 2), y, 7, num_warps=4)  # same specialization, other grid and data
    assert again is first and len(kernel.compiled) == 1
    grid0, grid1, grid2, stream, function, meta, launch_meta, _, _, *args = first.runs[1]
    assert (grid0, grid1, grid2, stream, function, meta) == (5, 2, 1, 1234, "function0", "meta0")
    assert launch_meta == ("metadata", (5, 2), 1234)
    assert args[0] is y and args[1:] == [7, 4]  # every bound argument, in order, the keyword ones last


@pytest.mark.parametrize("change", ["alignment", "integer", "option", "kernel"])
def test_another_specialization_or_option_compiles_again(cpu_cuda, change):
    kernel = _Kernel()
    buf = torch.zeros(64)
    launch_mod.launch_kernel(kernel, (1,), buf[:16], 7, num_warps=4)
    args, kwargs, target = (buf[:16], 7), dict(num_warps=4), kernel
    if change == "alignment":
        args = (buf[1:17], 7)  # 4 bytes past a 16-byte boundary
    elif change == "integer":
        args = (buf[:16], 1)
    elif change == "option":
        kwargs = dict(num_warps=8)
    else:
        target = _Kernel()
    out = launch_mod.launch_kernel(target, (1,), *args, **kwargs)
    assert out.runs[-1][0] == "slow" and len(target.compiled) == (1 if target is not kernel else 2)


def test_off_or_interpreted_launches_through_kernel_grid(cpu_cuda, monkeypatch):
    kernel = _Kernel()
    monkeypatch.setattr(launch_mod, "ENABLED", False)
    for _ in range(2):
        out = launch_mod.launch_kernel(kernel, (1,), torch.zeros(4), 3)
        assert out.runs == [("slow", (1,), (out.runs[0][2][0], 3), {"enable_fp_fusion": True})]
    monkeypatch.setattr(launch_mod, "ENABLED", True)

    class Interpreted:  # Triton's interpreter gives functions without device_caches
        def __getitem__(self, grid):
            return lambda *args, **kwargs: ("interpreted", grid, args)

    assert launch_mod.launch_kernel(Interpreted(), (2,), 5) == ("interpreted", (2,), (5,))
    kernel.device_caches = {0: (None, None, None, None)}  # a Triton whose per-device caches look otherwise
    out = launch_mod.launch_kernel(kernel, (1,), torch.zeros(4), 3)
    assert out.runs[0][0] == "slow" and len(out.runs) == 1


def test_every_launch_asks_for_fmas_unless_it_says_otherwise(cpu_cuda):
    """mul + add contracted (``enable_fp_fusion``) whatever Triton's default is (3.9 warns that 3.10 turns it off);
    a launch that turns it off keeps that, and compiles a kernel of its own."""
    kernel = _Kernel()
    x = torch.zeros(16)
    fused = launch_mod.launch_kernel(kernel, (1,), x, 7)
    assert fused.runs[0][3] == {"enable_fp_fusion": True}
    unfused = launch_mod.launch_kernel(kernel, (1,), x, 7, enable_fp_fusion=False)
    assert unfused is not fused and unfused.runs[0][3] == {"enable_fp_fusion": False}
    assert launch_mod.launch_kernel(kernel, (1,), x, 7) is fused and len(kernel.compiled) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_results_equal_kernel_grid_across_alignments_streams_and_graphs():
    import triton
    import triton.language as tl

    @triton.jit
    def scaled_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * alpha + tl.load(y_ptr + offs, mask=m), mask=m)

    torch.manual_seed(0)
    buf = torch.randn(3 * 4099 + 64, device="cuda")
    for offset, n in ((0, 4096), (1, 4099), (3, 1), (16, 777), (0, 4096)):  # aligned, misaligned, n == 1, again
        x, y = buf[offset:offset + n], buf[5000 + offset:5000 + offset + n]
        out = torch.empty(n + 1, device="cuda")[1:]  # 4 bytes past the allocation's alignment
        want = x * 0.5 + y  # a power of two: the kernel's fused multiply-add and this rounding agree
        launch_mod.launch_kernel(scaled_add, (triton.cdiv(n, 256),), x, y, out, n, 0.5, BLOCK=256)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    side = torch.cuda.Stream()
    x, y = buf[:4096], buf[5000:9096]
    out = torch.empty(4096, device="cuda")
    with torch.cuda.stream(side):  # launched on the current stream, not the default one
        launch_mod.launch_kernel(scaled_add, (16,), x, y, out, 4096, 2.0, BLOCK=256)
    side.synchronize()
    torch.testing.assert_close(out, x * 2.0 + y, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_mod.launch_kernel(scaled_add, (16,), x, y, out, 4096, 3.0, BLOCK=256)
    out.zero_()
    x.add_(1.0)
    graph.replay()
    want = torch.empty_like(out)
    # the kernel's own fused multiply-add, launched plainly (with the option launch_kernel sets)
    scaled_add[(16,)](x, y, want, 4096, 3.0, BLOCK=256, enable_fp_fusion=launch_mod.FP_FUSION)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_environment_switches_are_read_as_os_environ_has_them(monkeypatch):
    """The launch paths' environment reads (``kernels/common/env.py``) see every change made through ``os.environ``,
    as ``os.environ.get`` does, with or without the fast lookup."""
    import os

    from laquant.kernels.common import env
    from laquant.kernels.common.dispatch import kernel_choice

    name = "LAQUANT_TEST_SWITCH"
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(env, "_DATA", None)
        monkeypatch.delenv(name, raising=False)
        assert env.getenv(name, "dflt") == "dflt"
        monkeypatch.setenv(name, "on")
        assert env.getenv(name, "dflt") == "on" == os.environ.get(name)
        os.environ[name] = "é"
        assert env.getenv(name, "dflt") == "é"
        del os.environ[name]
        assert env.getenv(name, "dflt") == "dflt"
    monkeypatch.setenv("LAQUANT_KERNELS", "reference")
    assert kernel_choice() == "reference"
    monkeypatch.setenv("LAQUANT_KERNELS", "bogus")
    with pytest.raises(ValueError, match="LAQUANT_KERNELS"):
        kernel_choice()
