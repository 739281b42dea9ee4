"""KDA chunked prefill: laquant's two-launch kernel at each chunk size against fla's ``chunk_kda`` (when installed),
bf16 inputs, Kimi Linear's heads (K = V = 128), CUDA-event medians; prints one JSON line per shape.

    python tools/bench_kda_prefill.py [--heads 32] [--shapes 1x1024,64x1024,4x16384,1x65536] [--block-t 16,32]
"""

from __future__ import annotations

import argparse
import json

import torch

from laquant.kernels.kda.chunk import chunk_kda_triton, kda_intra_chunk


def inputs(B, T, H, K, V, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q, k, v = (r(B, T, H, d).bfloat16() for d in (K, K, V))
    g = -torch.nn.functional.softplus(r(B, T, H, K)) * 0.5  # log-decays in (-inf, 0)
    beta = torch.sigmoid(r(B, T, H))
    return q, k, v, g, beta


def median_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--shapes", default="1x1024,64x1024,4x16384,1x65536")
    ap.add_argument("--block-t", default="16,32", help="chunk sizes to time (KDA takes 16 or 32)")
    ap.add_argument("--no-fla", action="store_true", help="leave fla out (its first calls autotune for minutes)")
    args = ap.parse_args()
    try:
        from fla.ops.kda import chunk_kda as fla_chunk
    except Exception:  # noqa: BLE001
        fla_chunk = None
    if args.no_fla:
        fla_chunk = None
    H, K, V = args.heads, 128, 128
    sizes = [int(x) for x in args.block_t.split(",")]
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        q, k, v, g, beta = inputs(B, T, H, K, V)
        row = {"device": torch.cuda.get_device_name(), "B": B, "T": T, "H": H, "K": K, "V": V}
        with torch.no_grad():
            ref, _ = chunk_kda_triton(q.float(), k.float(), v.float(), g, beta, use_qk_l2norm=True)
            for bt in sizes:
                run = lambda: chunk_kda_triton(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True,  # noqa: E731
                                               block_t=bt)
                row[f"laquant_bt{bt}_ms"] = median_ms(run)
                row[f"intra_bt{bt}_ms"] = median_ms(lambda: kda_intra_chunk(q, k, v, g, beta, None, None, True, bt))
                o, _ = run()
                row[f"rel_err_bt{bt}_vs_fp32"] = ((o.float() - ref).norm() / ref.norm()).item()
            if fla_chunk is not None:
                fla = lambda: fla_chunk(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)  # noqa: E731
                row["fla_ms"] = median_ms(fla)
                o_fla = fla()[0]
                row["fla_rel_err_vs_fp32"] = ((o_fla.float() - ref).norm() / ref.norm()).item()
                best = min(row[f"laquant_bt{bt}_ms"] for bt in sizes)
                row["best_speedup_vs_fla"] = row["fla_ms"] / best
        print(json.dumps(row), flush=True)
        del q, k, v, g, beta, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
