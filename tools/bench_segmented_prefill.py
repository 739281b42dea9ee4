"""The sequence-parallel walk of the delta-rule and KDA prefills (``segments``): one walk per (sequence, head) against
the pieces walked in parallel, and fla's ``chunk_gated_delta_rule`` / ``chunk_kda`` (when installed) in the same
process; bf16 inputs, H = 32 heads of K = V = 128, CUDA-event medians; one JSON line per rule and shape.

    python tools/bench_segmented_prefill.py [--rules delta,kda] [--shapes 1x4096,1x16384,1x65536,4x16384,64x1024]
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_kda_prefill import inputs, median_ms

from laquant.kernels.delta.chunk import chunk_delta_triton, default_segments
from laquant.kernels.kda.chunk import chunk_kda_triton


def fla_peer(rule):
    try:
        if rule == "kda":
            from fla.ops.kda import chunk_kda

            return lambda q, k, v, g, beta: chunk_kda(q, k, v, g, beta, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return lambda q, k, v, g, beta: chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True,
                                                               use_qk_l2norm_in_kernel=True)
    except Exception:  # noqa: BLE001
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", default="delta,kda")
    ap.add_argument("--shapes", default="1x4096,1x16384,1x65536,4x16384,64x1024")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    H, K, V = args.heads, 128, 128
    for rule in args.rules.split(","):
        kernel = chunk_kda_triton if rule == "kda" else chunk_delta_triton
        peer = None if args.no_fla else fla_peer(rule)
        for shape in args.shapes.split(","):
            B, T = (int(x) for x in shape.split("x"))
            q, k, v, g, beta = inputs(B, T, H, K, V)
            if rule == "delta":
                g = g[..., 0].contiguous()  # one log-decay per head and token
            auto = default_segments(q, B * H, T)
            row = {"rule": rule, "device": torch.cuda.get_device_name(), "B": B, "T": T, "H": H, "K": K, "V": V,
                   "segments_default": auto}
            with torch.no_grad():
                ref, s_ref = kernel(q.float(), k.float(), v.float(), g, beta, output_final_state=True,
                                    use_qk_l2norm=True, segments=1)
                for name, segments in (("one_walk", 1), ("segmented", auto)):
                    run = lambda: kernel(q, k, v, g, beta, output_final_state=True, use_qk_l2norm=True,  # noqa: E731
                                         segments=segments)  # noqa: B023
                    row[f"{name}_ms"] = median_ms(run)
                    o, s = run()
                    row[f"{name}_rel_err_vs_fp32"] = ((o.float() - ref).norm() / ref.norm()).item()
                    row[f"{name}_state_rel_err_vs_fp32"] = ((s.load() - s_ref.load()).norm() / s_ref.load().norm()).item()
                row["segmented_speedup"] = row["one_walk_ms"] / row["segmented_ms"]
                if peer is not None:
                    row["fla_ms"] = median_ms(lambda: peer(q, k, v, g, beta))
                    o_fla = peer(q, k, v, g, beta)[0]
                    row["fla_rel_err_vs_fp32"] = ((o_fla.float() - ref).norm() / ref.norm()).item()
                    row["segmented_vs_fla"] = row["fla_ms"] / row["segmented_ms"]
                    row["one_walk_vs_fla"] = row["fla_ms"] / row["one_walk_ms"]
            print(json.dumps(row), flush=True)
            del q, k, v, g, beta, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
