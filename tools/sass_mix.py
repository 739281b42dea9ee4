"""The instruction mix and register use of the state decode and verify kernels, compiled offline for sm_90
(no GPU needed: Triton's bundled ptxas, nvdisasm and cuobjdump). Static counts over the kernel's code, not
executed ones, from this machine's Triton (the lent GPU's may differ): enough to see spills, register
pressure, conversions and the cost of a numerics change without device time.

    python tools/sass_mix.py [--kernel delta|gla] [--format int8_row:stochastic ...] [--blocks 16x1 128x4 ...]
    python tools/sass_mix.py --kernel gla_verify --blocks 32x32x1 16x64x2 [--tokens 4] [--commit] [--prefetch]

Blocks are ``BLOCK_K x num_warps`` for the decode kernels and ``BLOCK_K x BLOCK_V x num_warps`` for the
verify kernels (the delta rule's verify takes the whole K whatever BLOCK_K says; a scaled format the whole V).
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


def compile_sass(kernel: str, fmt: str, block_k: int, num_warps: int, block_v: int | None = None, tokens: int = 4,
                 commit: bool = False, prefetch: bool = False) -> tuple[str, str]:
    """The kernel's SASS and its resource line (``REG:n STACK:n ...``) for one launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from laquant.kernels.delta import decode as delta_decode
    from laquant.kernels.delta import verify as delta_verify
    from laquant.kernels.gla import decode as gla_decode
    from laquant.kernels.gla import verify as gla_verify

    fn = {"delta": delta_decode._delta_decode_kernel, "gla": gla_decode._gla_decode_kernel,
          "delta_verify": delta_verify._delta_verify_kernel, "gla_verify": gla_verify._gla_verify_kernel}[kernel]
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
    compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, enable_fp_fusion=not kernel.startswith("delta")))
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    return sass, usage


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
