"""The instruction mix and register use of the state decode and verify kernels, compiled offline for sm_90
(no GPU needed: Triton's bundled ptxas, nvdisasm and cuobjdump). Static counts over the kernel's code, not
executed ones, from this machine's Triton (the lent GPU's may differ): enough to see spills, register
pressure, conversions and the cost of a numerics change without device time.

    python tools/sass_mix.py [--kernel delta|gla] [--format int8_row:stochastic ...] [--blocks 16x1 128x4 ...]
    python tools/sass_mix.py --kernel gla_verify --blocks 32x32x1 16x64x2 [--tokens 4] [--commit] [--prefetch]

Blocks are ``BLOCK_K x num_warps`` for the decode kernels and ``BLOCK_K x BLOCK_V x num_warps`` for the
verify kernels (the delta rule's verify takes the whole K whatever BLOCK_K says; a scaled format the whole V).

The decode kernels are compiled from the launch a model makes at B = 64 (:func:`model_launch`: the wrapper called on
CPU tensors laid out as the layer hands them over, PDL on as on Hopper, GLA with its fused output norm and codes),
specialized as Triton's JIT specializes a launch (:func:`compile_like_jit`: pointers 16-byte aligned, integers equal to
1 made constants, multiples of 16 marked so). Without that, a stride of 1 stays a runtime value and no access can be
vectorized: the GLA kernel compiled that way showed 255 registers and 189 spill instructions, the launch the GPU runs
238 registers and none. The verify kernels are still compiled from a signature made here, without the
specialization: their counts overstate what runs.
"""

from __future__ import annotations

import argparse
import inspect
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

    if not isinstance(fn, JITFunction):  # under TRITON_INTERPRET=1: the same function, for its binder alone
        fn = JITFunction(fn.fn)
    backend = make_backend(GPUTarget(*TARGET))
    kwargs = {k: v for k, v in kwargs.items() if k != "launch_pdl"}  # a launch option, not a compile option
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


def model_launch(kernel: str, fmt: str, block_k: int, num_warps: int, batch: int = 64) -> tuple:
    """``(kernel function, args, kwargs)`` of the decode launch a model layer makes at ``batch`` sequences: the
    wrapper run on CPU tensors with the layer's layouts (q, k and v views of one projection or conv output; GLA with
    its gated output norm writing o_proj's codes, 8 outlier columns as ``gla_int8_all`` keeps), its launch captured
    instead of run, PDL on as on Hopper."""
    import torch

    from laquant.kernels.common.state import StateQuantizer
    from laquant.kernels.delta import decode as delta_decode
    from laquant.kernels.gla import decode as gla_decode

    name, _, rounding = fmt.partition(":")
    quant = StateQuantizer(name, rounding=rounding or "nearest")
    module = {"gla": gla_decode, "delta": delta_decode}[kernel]
    shape = SHAPES[kernel]
    H, K, V = shape["H"], shape["K"], shape["V"]
    Hk = H // shape.get("GROUP", 1)
    state = torch.zeros(batch, H, K, V, dtype=quant.format.storage_dtype or torch.float32)
    scale = torch.ones(batch, H, K) if quant.format.is_scaled else None
    pool = (state, scale, torch.arange(batch, dtype=torch.int32), quant)
    n_stores = torch.zeros(batch, dtype=torch.int32)
    captured = []
    saved = module.launch_kernel, module.pdl_launch
    module.launch_kernel = lambda fn, grid, *a, **kw: captured.append((fn, a, kw))
    module.pdl_launch = lambda device, rows: {"PDL": 1 if rows <= 16 else 2, "launch_pdl": True}
    try:
        if kernel == "gla":
            from laquant.kernels.gemm.int8 import PackedOutlierWeight

            proj = torch.zeros(batch, 2 * H * K + 2 * H * V, dtype=torch.bfloat16)  # q, k, v, z
            q, k = (proj[:, i * H * K:(i + 1) * H * K].view(batch, H, K) for i in range(2))
            v, z = (proj[:, 2 * H * K + i * H * V:2 * H * K + (i + 1) * H * V].view(batch, H, V) for i in range(2))
            width, n_out = H * V, 8
            outliers = torch.arange(n_out) * (width // n_out)
            keep = torch.tensor(sorted(set(range(width)) - set(outliers.tolist())))
            packed = PackedOutlierWeight.pack(torch.zeros(width, -(-keep.numel() // 16) * 16, dtype=torch.int8),
                                              torch.ones(width), keep, outliers,
                                              torch.zeros(width, n_out, dtype=torch.bfloat16), None, width)
            module.gla_decode_step(q, k, v, torch.zeros(batch, H, K), *pool, n_stores, block_k=block_k,
                                   num_warps=num_warps, seed=SEED, norm=(z, torch.ones(V), 1e-6), packed=packed,
                                   early_state=True)
        else:
            conv = torch.zeros(batch, 2 * Hk * K + H * V, dtype=torch.bfloat16)  # q, k, v
            q, k = (conv[:, i * Hk * K:(i + 1) * Hk * K].view(batch, Hk, K) for i in range(2))
            v = conv[:, 2 * Hk * K:].view(batch, H, V)
            module.delta_decode_step(q, k, v, torch.zeros(batch, H), torch.zeros(batch, H), *pool, n_stores,
                                     use_qk_l2norm=True, block_k=block_k, num_warps=num_warps, seed=SEED,
                                     early_state=True)
    finally:
        module.launch_kernel, module.pdl_launch = saved
    return captured[0]


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
    """The kernel's SASS and its resource line (``REG:n STACK:n ...``) for one launch."""
    if kernel in ("gla", "delta"):
        return cubin_sass(compile_like_jit(*model_launch(kernel, fmt, block_k, num_warps)).asm["cubin"])
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from laquant.kernels.delta import verify as delta_verify
    from laquant.kernels.gla import verify as gla_verify

    fn = {"delta_verify": delta_verify._delta_verify_kernel, "gla_verify": gla_verify._gla_verify_kernel}[kernel]
    from laquant.kernels.common.formats import get_format, kernel_code

    name, _, rounding = fmt.partition(":")
    shape = SHAPES[kernel]
    spec = get_format(name)
    scaled = spec.is_scaled
    if kernel == "delta_verify":
        block_k = shape["K"]
    consts = dict(shape, BLOCK_K=block_k, BLOCK_V=shape["V"] if scaled or not block_v else block_v,
                  FMT=kernel_code(spec), RENORM=1, QMAX=spec.qmax if scaled else 1.0,  # as pool_args passes them
                  SR=rounding == "stochastic", L2NORM=True, PDL=False, BLOCK_T=1 << (tokens - 1).bit_length(),
                  KEEP=False, COMMIT=commit, PREFETCH=prefetch)
    for p, param in inspect.signature(fn.fn).parameters.items():  # constexprs the call leaves at their defaults
        if p not in consts and param.default is not inspect.Parameter.empty:  # (the GLA kernel's SSD, DT_*)
            consts[p] = param.default
    state = {"fp32": "*fp32", "bf16": "*bf16", "fp8_row": "*fp8e4nv", "int8_row": "*i8"}[name]
    sig = {}
    for p in inspect.signature(fn.fn).parameters:
        if p in consts:
            sig[p] = "constexpr"
        elif p in ("state_ptr", "kept_ptr"):
            sig[p] = state
        elif p in ("idx_ptr", "nstore_ptr", "steps_ptr"):
            sig[p] = "*i32"
        elif p in ("q_ptr", "k_ptr", "v_ptr", "o_ptr"):
            sig[p] = "*bf16"
        elif p.endswith("_ptr"):
            sig[p] = "*fp32"
        elif p == "qk_scale":
            sig[p] = "fp32"
        else:
            sig[p] = "i32"
    consts = {k: v for k, v in consts.items() if k in sig}
    compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget(*TARGET),
                              options=dict(num_warps=num_warps, enable_fp_fusion=not kernel.startswith("delta")))
    return cubin_sass(compiled.asm["cubin"])


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", choices=sorted(SHAPES), default="delta")
    p.add_argument("--format", nargs="+", default=["int8_row:stochastic", "fp8_row:stochastic", "bf16", "fp32"])
    p.add_argument("--blocks", nargs="+", default=["16x1", "16x2", "32x4", "128x4"])
    p.add_argument("--tokens", type=int, default=4, help="verify kernels: tokens a step")
    p.add_argument("--commit", action="store_true", help="verify kernels: the commit")
    p.add_argument("--prefetch", action="store_true", help="verify kernels: the next token's inputs loaded ahead")
    args = p.parse_args(argv)
    head = ["format", "blocks", "registers", "stack", "instructions"] + list(CLASSES)
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for fmt in args.format:
        for blocks in args.blocks:
            sizes = list(map(int, blocks.split("x")))
            bk, w, bv = (sizes[0], sizes[-1], sizes[1] if len(sizes) == 3 else None)
            sass, usage = compile_sass(args.kernel, fmt, bk, w, bv, args.tokens, args.commit, args.prefetch)
            ops = mix(sass)
            counts = [sum(ops[o] for o in names) for names in CLASSES.values()]
            regs, stack = resources(usage)
            print(f"| {fmt} | {blocks} | {regs} | {stack} | {sum(ops.values())} | " + " | ".join(map(str, counts))
                  + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
