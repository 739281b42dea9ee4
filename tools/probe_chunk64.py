"""Chunks of 64 tokens in the delta-rule and KDA chunked prefills, on the GPU, against their PyTorch references at
each forced warp count: does the Triton 3.6 fault that ``kernels/delta/intra.py::chunk_warps`` works around at 2 warps
(bf16 / fp16 inputs only) also hit float32 inputs? KDA at chunks of 64 was found wrong in float32 at 4 warps
(eval/results/refactor_families_h200/kda_probe.txt) and is refused since.

    python3 tools/probe_chunk64.py            # one line per case: kernel, dtype, K, V, T, warps, rel err (o), (state)
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
    def pick(block_t, K, low_precision, default, wy_in_walk=False):
        if warps is not None and block_t == 64:
            return warps
        return ORIGINAL(block_t, K, low_precision, default, wy_in_walk)
    return pick


ORIGINAL = delta_intra.chunk_warps


def main():
    kda_chunk.BLOCK_TS = (16, 32, 64)  # the probe lifts the refusal for its own calls
    print("kernel dtype K V T warps rel_err_o rel_err_state", flush=True)
    for kernel in ("kda", "delta"):
        run, ref = ((kda_chunk.chunk_kda_triton, kda_chunk.chunk_kda_reference) if kernel == "kda"
                    else (delta_chunk.chunk_delta_triton, delta_chunk.chunk_delta_reference))
        for dtype in (torch.float32, torch.bfloat16):
            for K, V in ((16, 32), (32, 32), (64, 64), (128, 128)):
                for T in (64, 90, 200):
                    for warps in ((None, 2) if dtype == torch.float32 else (None,)):  # bf16 at 4 warps: the known fault
                        for mod in (delta_intra, delta_chunk, kda_chunk):
                            mod.chunk_warps = forced(warps)
                        args = inputs(T, K, V, dtype, kernel == "kda")
                        kw = dict(output_final_state=True, use_qk_l2norm=True)
                        try:
                            o, f = run(*args, **kw, block_t=64)
                            r, fr = ref(*[a.float() for a in args], **kw)
                            line = f"{rel_err(o.float(), r.float()):.2e} {rel_err(f.load(), fr.load()):.2e}"
                        except Exception as e:  # a fault is a result here
                            line = "ERR " + str(e).splitlines()[0][:120]
                        print(kernel, str(dtype)[6:], K, V, T, warps or "shipped", line, flush=True)
    for mod in (delta_intra, delta_chunk, kda_chunk):
        mod.chunk_warps = ORIGINAL


if __name__ == "__main__":
    main()
