"""The gated delta rule's prefill with the chunk-local work in its own launch (``split_intra``: the chunk-parallel
intra-chunk kernel, then a walk of 64- or 32-token steps) against the one-launch walk of 16-token steps and fla's
``chunk_gated_delta_rule`` (when installed) in the same process; bf16 inputs, H heads of K = V = 128, the in-kernel
q/k l2norm, the final state stored in fp32, CUDA-event medians; one JSON line per shape.

    python tools/bench_split_intra.py [--shapes 1x4096,1x65536,64x1024] [--heads 32] [--no-fla]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from bench_kda_prefill import inputs, median_ms

from laquant.kernels.delta.chunk import chunk_delta_triton, splits_intra
from laquant.kernels.delta.intra import delta_intra_chunk

SHAPES = "1x4096,1x8192,1x16384,1x65536,2x32768,4x16384,8x8192,16x4096,64x1024"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--splits", default="32,64:16,32,64:1,2",
                    help="split launches timed: block_t values, block_v values and num_stages values, each product")
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    fla = None
    if not args.no_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
        except Exception:  # noqa: BLE001
            pass
    H, K, V = args.heads, 128, 128
    for shape in args.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        q, k, v, g, beta = inputs(B, T, H, K, V)
        g = g[..., 0].contiguous()  # one log-decay per head and token
        row = {"device": torch.cuda.get_device_name(), "B": B, "T": T, "H": H, "K": K, "V": V,
               "split_by_default": splits_intra(q, B * H, B * T)}
        with torch.no_grad():
            ref, _ = chunk_delta_triton(q.float(), k.float(), v.float(), g, beta, use_qk_l2norm=True, split_intra=False)

            def timed(name, **launch):
                run = lambda: chunk_delta_triton(q, k, v, g, beta, output_final_state=True,  # noqa: E731
                                                 use_qk_l2norm=True, **launch)
                try:
                    row[f"{name}_ms"] = median_ms(run, reps=10)
                    o, _ = run()
                    row[f"{name}_rel_err_vs_fp32"] = ((o.float() - ref).norm() / ref.norm()).item()
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"

            timed("walk16", split_intra=False)
            timed("default")
            grid = [[int(x) for x in part.split(",")] for part in args.splits.split(":")]
            for bt, bv, stages in itertools.product(*grid):
                timed(f"split_bt{bt}_bv{bv}_st{stages}", split_intra=True, block_t=bt, block_v=bv, num_stages=stages)
            for bt in (32, 64):
                row[f"intra_bt{bt}_ms"] = median_ms(lambda: delta_intra_chunk(q, k, v, g, beta, None, None, True, bt),
                                                    reps=10)
            splits = {key: val for key, val in row.items() if key.startswith("split_bt") and key.endswith("_ms")}
            if splits:
                best = min(splits, key=splits.get)
                row["best_split"], row["best_split_ms"] = best[:-3], splits[best]
                row["best_split_speedup_vs_walk16"] = row["walk16_ms"] / splits[best]
            if fla is not None:
                peer = lambda: fla(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)  # noqa: E731
                row["fla_ms"] = median_ms(peer, reps=10)
                row["fla_rel_err_vs_fp32"] = ((peer()[0].float() - ref).norm() / ref.norm()).item()
                row["walk16_vs_fla"] = row["fla_ms"] / row["walk16_ms"]
                if splits:
                    row["best_split_vs_fla"] = row["fla_ms"] / row["best_split_ms"]
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
