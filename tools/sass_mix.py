"""The instruction mix of the state decode kernels, compiled offline for sm_90 (no GPU needed: Triton's
bundled ptxas and nvdisasm). Static counts over the kernel's code, not executed ones, from this
machine's Triton (the lent GPU's may differ): enough to see spills, conversions and the cost of a
numerics change without device time.

    python tools/sass_mix.py [--kernel delta|gla] [--format int8_row:stochastic ...] [--blocks 16x1 128x4 ...]
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
FORMAT_CODES = {"fp32": 0, "bf16": 1, "fp8_row": 2, "int8_row": 3}


def compile_sass(kernel: str, fmt: str, block_k: int, num_warps: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from laquant.kernels.delta import decode as delta_decode
    from laquant.kernels.gla import decode as gla_decode

    fn = (delta_decode._delta_decode_kernel if kernel == "delta" else gla_decode._gla_decode_kernel)
    name, _, rounding = fmt.partition(":")
    consts = dict(SHAPES[kernel], BLOCK_K=block_k, BLOCK_V=SHAPES[kernel]["V"], FMT=FORMAT_CODES[name], RENORM=1,
                  QMAX=127.0 if name == "int8_row" else 448.0, SR=rounding == "stochastic", L2NORM=True, PDL=False)
    state = {"fp32": "*fp32", "bf16": "*bf16", "fp8_row": "*fp8e4nv", "int8_row": "*i8"}[name]
    sig = {}
    for p in inspect.signature(fn.fn).parameters:
        if p in consts:
            sig[p] = "constexpr"
        elif p == "state_ptr":
            sig[p] = state
        elif p in ("idx_ptr", "nstore_ptr"):
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
                              options=dict(num_warps=num_warps, enable_fp_fusion=kernel != "delta"))
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout


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
    args = p.parse_args(argv)
    head = ["format", "block_k x warps", "instructions"] + list(CLASSES)
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for fmt in args.format:
        for blocks in args.blocks:
            bk, w = map(int, blocks.split("x"))
            ops = mix(compile_sass(args.kernel, fmt, bk, w))
            counts = [sum(ops[o] for o in names) for names in CLASSES.values()]
            print(f"| {fmt} | {bk} x {w} | {sum(ops.values())} | " + " | ".join(map(str, counts)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
