"""Chunks of 64 tokens in the delta-rule and KDA chunked prefills, on the GPU, against their PyTorch references at a
forced warp count or ``chunk_warps``' own. The Triton 3.6 fault that ``kernels/delta/intra.py::chunk_warps`` sidesteps
at 2 warps was first seen in bf16; this probe found it in float32 too (KDA at K = 16 and 4 warps, off by up to 3e-2;
eval/results/graphed_forward_h200/run1/probe_chunk64.txt), and chunk_warps takes 2 warps there since.

    python3 tools/probe_chunk64.py [kda:fp32:16:32:2 ...]  # a line per case and T: rel err of o and of the state
"""
import sys

import torch

sys.path.insert(0, "tests")

from conftest import rel_err  # noqa: E402

import laquant.kernels.delta.chunk as delta_chunk  # noqa: E402
import laquant.kernels.delta.intra as delta_intra  # noqa: E402
import laquant.kernels.kda.chunk as kda_chunk  # noqa: E402


def inputs(T, K, V, dtype, kda, seed=7):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, v = r(1, T, 1, K), r(1, T, 1, K), r(1, T, 1, V)
    g = -torch.nn.functional.softplus(r(1, T, 1, K) if kda else r(1, T, 1)) * 0.5
    beta = torch.sigmoid(r(1, T, 1))
    return [x.cuda().to(dtype) for x in (q, k, v)] + [g.cuda(), beta.cuda()]


def forced(warps):
    """chunk_warps with ``warps`` for every 64-token chunk (None: the shipped rule)."""
    def pick(block_t, K, low_precision, default, **rule):
        if warps is not None and block_t == 64:
            return warps
        return ORIGINAL(block_t, K, low_precision, default, **rule)
    return pick


ORIGINAL = delta_intra.chunk_warps


DEFAULT_CASES = [f"{kernel}:{dtype}:{K}:{V}:{warps}" for kernel in ("kda", "delta") for dtype in ("fp32", "bf16")
                 for K, V in ((16, 32), (32, 32), (64, 64), (128, 128))
                 for warps in (("shipped", "2") if dtype == "fp32" else ("shipped",))]  # bf16 at 4: the known fault


def main(argv=None):
    """Cases ``kernel:dtype:K:V:warps`` (kernel kda or delta, dtype fp32 or bf16, warps a count or ``shipped``, the
    rule in chunk_warps), each at T = 64, 90 and 200; by default :data:`DEFAULT_CASES`."""
    cases = (argv if argv is not None else sys.argv[1:]) or DEFAULT_CASES
    print("kernel dtype K V T warps rel_err_o rel_err_state", flush=True)
    for case in cases:
        kernel, dtype_name, K, V, warps = case.split(":")
        K, V, warps = int(K), int(V), None if warps == "shipped" else int(warps)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        run, ref = ((kda_chunk.chunk_kda_triton, kda_chunk.chunk_kda_reference) if kernel == "kda"
                    else (delta_chunk.chunk_delta_triton, delta_chunk.chunk_delta_reference))
        for mod in (delta_intra, delta_chunk, kda_chunk):
            mod.chunk_warps = forced(warps)
        for T in (64, 90, 200):
            args = inputs(T, K, V, dtype, kernel == "kda")
            kw = dict(output_final_state=True, use_qk_l2norm=True)
            try:
                o, f = run(*args, **kw, block_t=64)
                r, fr = ref(*[a.float() for a in args], **kw)
                line = f"{rel_err(o.float(), r.float()):.2e} {rel_err(f.load(), fr.load()):.2e}"
            except Exception as e:  # a fault is a result here
                line = "ERR " + str(e).splitlines()[0][:120]
            print(kernel, dtype_name, K, V, T, warps or "shipped", line, flush=True)
    for mod in (delta_intra, delta_chunk, kda_chunk):
        mod.chunk_warps = ORIGINAL


if __name__ == "__main__":
    main()
