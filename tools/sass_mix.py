"""The instruction mix and register use of the state decode and verify kernels, compiled offline for sm_90
(no GPU needed: Triton's bundled ptxas, nvdisasm and cuobjdump). Static counts over the kernel's code, not
executed ones, from this machine's Triton (the lent GPU's may differ): enough to see spills, register
pressure, conversions and the cost of a numerics change without device time.

    python tools/sass_mix.py [--kernel delta|gla] [--format int8_row:stochastic ...] [--blocks 16x1 128x4 ...]
    python tools/sass_mix.py --kernel gla_verify --blocks 32x32x1 16x64x2 [--tokens 4] [--commit] [--prefetch]

"loop" counts the largest loop's instructions (:func:`loop_body`: the decode kernels' walk over the state's row
blocks, where their time goes), "loop / element" those a thread spends on each state element it holds there.

Blocks are ``BLOCK_K x num_warps`` for the decode kernels and ``BLOCK_K x BLOCK_V x num_warps`` for the
verify kernels (the delta rule's verify takes the whole K whatever BLOCK_K says; a scaled format the whole V).

Each kernel is compiled from the launch a model makes at B = 64 (:func:`model_launch`: the wrapper called on CPU
tensors laid out as the layer hands them over; the decode steps with PDL on, as on Hopper, GLA's with its fused output
norm and codes), specialized as Triton's JIT specializes a launch (:func:`compile_like_jit`: pointers 16-byte aligned,
integers equal to 1 made constants, multiples of 16 marked so). Until 2026-12-03 the tool compiled from a signature of
its own, without that: a stride of 1 stayed a runtime value and no access could be vectorized. The GLA decode kernel
compiled that way showed 255 registers and 189 spill instructions; the launch the GPU runs has 238 and none.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import tempfile
from collections import Counter

CLASSES = {
    "convert": ("F2I", "I2F", "FRND", "F2F", "I2I", "F2FP", "I2FP", "F2IP"),
    "spill": ("STL", "LDL"),
    "global": ("LDG", "STG"),
    "shared": ("LDS", "STS"),
    "shuffle": ("SHFL",),
    "float": ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK"),
    "int": ("IMAD", "IADD3", "LOP3", "SHF", "LEA", "SEL", "ISETP", "PRMT", "IMNMX", "IABS", "SGXT", "BMSK"),
    "special": ("MUFU",),
}
SHAPES = {"delta": dict(H=32, GROUP=2, K=128, V=128), "gla": dict(H=16, K=64, V=128)}
SHAPES.update(delta_verify=SHAPES["delta"], gla_verify=SHAPES["gla"])


TARGET = ("cuda", 90, 32)
SEED = 12345  # the stochastic rounding's seed, a runtime integer (1 or a multiple of 16 would be specialized)


def jit_specialization(fn, args: tuple, kwargs: dict) -> tuple:
    """``(options, signature, constexprs, attrs)`` of the launch ``fn[grid](*args, **kwargs)`` on sm_90, as
    Triton's JIT makes them: its binder's specialization of each argument (16-byte aligned pointers, integers
    equal to 1 made constants, multiples of 16 marked) and its options."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from laquant.kernels.common.launch import FP_FUSION

    if not isinstance(fn, JITFunction):  # under TRITON_INTERPRET=1: the same function, for its binder alone
        fn = JITFunction(fn.fn)
    backend = make_backend(GPUTarget(*TARGET))
    kwargs = {k: v for k, v in kwargs.items() if k != "launch_pdl"}  # a launch option, not a compile option
    kwargs.setdefault("enable_fp_fusion", FP_FUSION)  # as launch_kernel, which the recorder stands in for, sets it
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, options)


def compile_like_jit(fn, args: tuple, kwargs: dict):
    """``fn[grid](*args, **kwargs)`` compiled for sm_90 as Triton's JIT compiles it (:func:`jit_specialization`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options, signature, constexprs, attrs = jit_specialization(fn, args, kwargs)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(*TARGET),
                          options=options.__dict__)


def model_launch(kernel: str, fmt: str, block_k: int, num_warps: int, block_v: int | None = None, tokens: int = 4,
                 commit: bool = False, prefetch: bool = False, batch: int = 64) -> tuple:
    """``(kernel function, args, kwargs)`` of the launch a model layer makes at ``batch`` sequences: the wrapper
    (decode step, verify step of ``tokens`` tokens, or its commit) run on CPU tensors with the layer's layouts (q, k
    and v views of one projection or conv output; GLA's decode step with its gated output norm writing o_proj's
    codes, 8 outlier columns as ``gla_int8_all`` keeps), its launch captured instead of run, PDL on as on Hopper."""
    import torch

    from laquant.kernels.common.state import StateQuantizer
    from laquant.kernels.delta import decode as delta_decode
    from laquant.kernels.delta import verify as delta_verify
    from laquant.kernels.gla import decode as gla_decode
    from laquant.kernels.gla import verify as gla_verify

    name, _, rounding = fmt.partition(":")
    quant = StateQuantizer(name, rounding=rounding or "nearest")
    module = {"gla": gla_decode, "delta": delta_decode, "gla_verify": gla_verify, "delta_verify": delta_verify}[kernel]
    shape = SHAPES[kernel]
    H, K, V = shape["H"], shape["K"], shape["V"]
    Hk = H // shape.get("GROUP", 1)
    decode = not kernel.endswith("_verify")
    T = 1 if decode else tokens
    state = torch.zeros(batch, H, K, V, dtype=quant.format.storage_dtype or torch.float32)
    scale = torch.ones(batch, H, K) if quant.format.is_scaled else None
    pool = (state, scale, torch.arange(batch, dtype=torch.int32), quant)
    n_stores = torch.zeros(batch, dtype=torch.int32)
    widths = [(Hk, K), (Hk, K), (H, V)] + ([(H, V)] if kernel == "gla" else [])  # q, k, v (and GLA's output gate z)
    proj = torch.zeros(batch, T, sum(h * d for h, d in widths), dtype=torch.bfloat16)
    views, at = [], 0
    for h, d in widths:
        view = proj[:, :, at:at + h * d].view(batch, T, h, d)
        views.append(view[:, 0] if decode else view)
        at += h * d
    q, k, v = views[:3]
    lead = (batch,) if decode else (batch, T)
    launch = dict(num_warps=num_warps, seed=SEED)
    if not decode:
        launch.update(block_v=block_v, prefetch=prefetch)
    with captured(module) as launches:
        if kernel == "gla":
            from laquant.kernels.gemm.int8 import PackedOutlierWeight

            width, n_out = H * V, 8
            outliers = torch.arange(n_out) * (width // n_out)
            keep = torch.tensor(sorted(set(range(width)) - set(outliers.tolist())))
            packed = PackedOutlierWeight.pack(torch.zeros(width, -(-keep.numel() // 16) * 16, dtype=torch.int8),
                                              torch.ones(width), keep, outliers,
                                              torch.zeros(width, n_out, dtype=torch.bfloat16), None, width)
            module.gla_decode_step(q, k, v, torch.zeros(batch, H, K), *pool, n_stores, block_k=block_k,
                                   norm=(views[3], torch.ones(V), 1e-6), packed=packed, early_state=True, **launch)
        elif kernel == "delta":
            module.delta_decode_step(q, k, v, torch.zeros(batch, H), torch.zeros(batch, H), *pool, n_stores,
                                     use_qk_l2norm=True, block_k=block_k, early_state=True, **launch)
        elif kernel == "gla_verify":
            g = torch.zeros(*lead, H, K)
            if commit:
                module.gla_commit(q, k, v, g, *pool, T, n_stores, block_k=block_k, **launch)
            else:
                module.gla_verify(q, k, v, g, *pool, n_stores, block_k=block_k, **launch)
        else:
            g, beta = torch.zeros(*lead, H), torch.zeros(*lead, H)
            if commit:
                module.delta_commit(q, k, v, g, beta, *pool, T, n_stores, use_qk_l2norm=True, **launch)
            else:
                module.delta_verify(q, k, v, g, beta, *pool, n_stores, use_qk_l2norm=True, **launch)
    return launches[0]


@contextlib.contextmanager
def captured(module):
    """``module.launch_kernel`` (and its PDL options where it has them, as on Hopper) replaced by a recorder: yields
    the list of ``(kernel, args, kwargs)`` the wrappers called inside launch instead of running them."""
    launches = []
    saved = module.launch_kernel, getattr(module, "pdl_launch", None)
    module.launch_kernel = lambda fn, grid, *args, **kwargs: launches.append((fn, args, kwargs))
    if saved[1] is not None:
        module.pdl_launch = lambda device, rows: {"PDL": 1 if rows <= 16 else 2, "launch_pdl": True}
    try:
        yield launches
    finally:
        module.launch_kernel = saved[0]
        if saved[1] is not None:
            module.pdl_launch = saved[1]


def cubin_sass(cubin: bytes) -> tuple[str, str]:
    """The SASS of a cubin and its resource line (``REG:n STACK:n ...``), by Triton's bundled tools."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    return sass, usage


def compile_sass(kernel: str, fmt: str, block_k: int, num_warps: int, block_v: int | None = None, tokens: int = 4,
                 commit: bool = False, prefetch: bool = False) -> tuple[str, str]:
    """The kernel's SASS and its resource line (``REG:n STACK:n ...``) for the model's launch (:func:`model_launch`)."""
    launch = model_launch(kernel, fmt, block_k, num_warps, block_v, tokens, commit, prefetch)
    return cubin_sass(compile_like_jit(*launch).asm["cubin"])


def resources(usage: str) -> tuple[int, int]:
    """Registers a thread and stack bytes (spill space) from cuobjdump's resource line."""
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def mix(sass: str) -> Counter:
    ops = Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def loop_body(sass: str) -> str:
    """The SASS of the kernel's largest loop: from a label to the last branch back to it (the decode kernels' walk
    over the state's row blocks; ``""`` for a kernel without a loop)."""
    lines = sass.splitlines()
    where = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best = (0, 0)
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+(?:!?U?P\w+,\s*)?`\((\.L_x_\d+)\)", line)
        if m and m.group(1) in where and where[m.group(1)] < i and i - where[m.group(1)] > best[1] - best[0]:
            best = (where[m.group(1)], i)
    return "\n".join(lines[best[0]:best[1] + 1]) if best[1] else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", choices=sorted(SHAPES), default="delta")
    p.add_argument("--format", nargs="+", default=["int8_row:stochastic", "fp8_row:stochastic", "bf16", "fp32"])
    p.add_argument("--blocks", nargs="+", default=["16x1", "16x2", "32x4", "128x4"])
    p.add_argument("--tokens", type=int, default=4, help="verify kernels: tokens a step")
    p.add_argument("--commit", action="store_true", help="verify kernels: the commit")
    p.add_argument("--prefetch", action="store_true", help="verify kernels: the next token's inputs loaded ahead")
    args = p.parse_args(argv)
    head = ["format", "blocks", "registers", "stack", "instructions", "loop", "loop / element"] + list(CLASSES)
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for fmt in args.format:
        for blocks in args.blocks:
            sizes = list(map(int, blocks.split("x")))
            bk, w, bv = (sizes[0], sizes[-1], sizes[1] if len(sizes) == 3 else None)
            sass, usage = compile_sass(args.kernel, fmt, bk, w, bv, args.tokens, args.commit, args.prefetch)
            ops = mix(sass)
            counts = [sum(ops[o] for o in names) for names in CLASSES.values()]
            regs, stack = resources(usage)
            loop = sum(mix(loop_body(sass)).values())
            # the decode kernels' loop holds one [BLOCK_K, V] block of the state, spread over the program's threads
            per = f"{loop / (bk * SHAPES[args.kernel]['V'] / (32 * w)):.1f}" if bv is None and loop else "-"
            print(f"| {fmt} | {blocks} | {regs} | {stack} | {sum(ops.values())} | {loop} | {per} | "
                  + " | ".join(map(str, counts)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
