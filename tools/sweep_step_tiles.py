"""The decode GEMMs' tiles chosen inside the graphed decode step (issue #14), not alone.

``tools/sweep_gemm.py`` times each GEMM alone with its weights streamed; in a graphed decode step a GEMM starts on
its PDL wait behind the kernel before and its cost is that chain (``eval/results/l2_weights_h200/``: weights held in
L2 saved nothing in the step), so the fastest tiles alone need not be the fastest there. This tool builds a random
GLA (bf16 weights, calibrated with RECIPE on random tokens: speed only), captures laquant.generate's decode step at
batch B and, one GEMM shape at a time (coordinate descent in the step's order), replays the step with each candidate
tile of that shape's M bucket (the table's, split-K x2 / x4, BN / 2 and x 2, BK / 2 and x 2, more stages, 8 warps,
SWAP_AB toggled), the other shapes at their best so far. The fastest few are timed again, alternated with the
table's, before a candidate is kept (>= ``--min-gain`` faster). Also the GLA decode kernel's launch (block_k, warps)
at the batch's programs. Writes OUT.json: every timing, the kept entries, and the step before and after.

    python3 tools/sweep_step_tiles.py OUT.json [--batch 64] [--layers 24] [--recipe gla_int8_all]
"""
import argparse
import json
import statistics
import time

import torch

from profile_prefill import random_gla

from laquant.generate import DecodeSession, release_graphs
from laquant.kernels.common import state_io
from laquant.kernels.gemm import configs
from laquant.models import GLAConfig

SEEN: list = []  # (bucket, N, K) in the order the step first asks for them
OVERRIDE: dict = {}  # (bucket, N, K) -> table entry
_table_entry = configs._entry


def _entry(table, bucket, N, K):
    key = (bucket, N, K)
    if key not in SEEN:
        SEEN.append(key)
    return OVERRIDE.get(key) or _table_entry(table, bucket, N, K)


configs._entry = _entry  # choose_config / choose_gemm look it up as a module global at every call


def step_us(model, ids, reps: int = 60, blocks: int = 5) -> float:
    """Median over ``blocks`` of the mean replay time of the freshly captured step, us."""
    release_graphs(model)
    session = DecodeSession(model, ids, 20 + reps * blocks, graphed=True)
    graph = session.graph.graph
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(blocks):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    del session
    return statistics.median(times)


def candidates(cfg: dict) -> list:
    out = [dict(cfg)]

    def variant(**changes):
        c = {**cfg, **changes}
        if c not in out:
            out.append(c)

    split = cfg.get("SPLIT_K", 1)
    variant(SPLIT_K=split * 2)
    variant(SPLIT_K=split * 4)
    if cfg["BN"] > 16:
        variant(BN=cfg["BN"] // 2)
        variant(BN=cfg["BN"] // 2, SPLIT_K=split * 2)
    if cfg["BN"] < 128:
        variant(BN=cfg["BN"] * 2)
    if cfg["BK"] < 512:
        variant(BK=cfg["BK"] * 2)
    if cfg["BK"] > 64:
        variant(BK=cfg["BK"] // 2)
    variant(num_stages=min(cfg["num_stages"] + 2, 8))
    variant(num_warps=8)
    variant(SWAP_AB=not cfg.get("SWAP_AB", False))
    return out


def sweep_gemms(model, ids, table, min_gain: float, log: list) -> dict:
    kept = {}
    for key in list(SEEN):
        bucket, N, K = key
        entry = _table_entry(table, bucket, N, K)
        if entry is None:
            continue
        path = entry["path"]
        base = dict(entry[path])
        timed = []
        for cand in candidates(base):
            OVERRIDE[key] = {**entry, path: cand}
            try:
                us = step_us(model, ids)
            except Exception as exc:  # a tile that does not compile or fit: skipped, said so
                us = None
                print(f"  {key} {cand}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            timed.append((us, cand))
            log.append(dict(kind="gemm", bucket=bucket, N=N, K=K, path=path, cfg=cand, step_us=us))
            print(f"  {bucket}@{N}x{K} {path} {cand}: {us}", flush=True)
        ok = sorted((t for t in timed if t[0] is not None), key=lambda t: t[0])
        finalists = [c for _, c in ok[:2] if c != base]
        best, best_us = base, None
        if finalists:  # alternated with the table's entry, twice
            again = {json.dumps(c, sort_keys=True): [] for c in [base, *finalists]}
            for _ in range(2):
                for c in [base, *finalists]:
                    OVERRIDE[key] = {**entry, path: c}
                    again[json.dumps(c, sort_keys=True)].append(step_us(model, ids))
            mean = {k: statistics.mean(v) for k, v in again.items()}
            log.append(dict(kind="gemm_confirm", bucket=bucket, N=N, K=K, path=path, step_us=again))
            base_us = mean[json.dumps(base, sort_keys=True)]
            top = min(mean, key=mean.get)
            if mean[top] <= base_us * (1 - min_gain):
                best, best_us = json.loads(top), mean[top]
            print(f"  {bucket}@{N}x{K}: table {base_us:.1f} us, best {mean[top]:.1f} us "
                  f"({'kept' if best is not base else 'table stays'})", flush=True)
        OVERRIDE[key] = {**entry, path: best}
        if best is not base:
            kept[f"{bucket}@{N}x{K}"] = dict(path=path, cfg=best, table=base, step_us=best_us)
    return kept


def sweep_decode(model, ids, programs: int, min_gain: float, log: list) -> dict:
    table = state_io.DECODE_LAUNCH["gla"]
    fmt = next(f for f in ("int8_row", "fp8_row", "bf16", "fp32") if f in table)  # what gla_int8_all stores
    base = tuple(table[fmt])
    launch = state_io.bucket_launch(base, programs)
    timed = []
    for block_k, warps in sorted({launch, (8, 1), (16, 1), (32, 1), (16, 2), (32, 2), (64, 4)}):
        table[fmt] = ((None, block_k, warps),)
        us = step_us(model, ids)
        timed.append((us, (block_k, warps)))
        log.append(dict(kind="decode", fmt=fmt, launch=[block_k, warps], step_us=us))
        print(f"  decode {fmt} {block_k, warps}: {us:.1f}", flush=True)
    table[fmt] = base
    best_us, best = min(timed)
    base_us = next(us for us, lw in timed if lw == launch)
    if best != launch and best_us <= base_us * (1 - min_gain):
        return dict(fmt=fmt, programs=programs, launch=list(best), table=list(launch), step_us=best_us,
                    table_us=base_us)
    return {}


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--recipe", default="gla_int8_all")
    p.add_argument("--min-gain", type=float, default=0.01, help="keep a candidate this much faster (fraction)")
    p.add_argument("--no-decode", action="store_true", help="leave the decode kernel's launch out")
    args = p.parse_args()
    t0 = time.time()
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=args.layers, num_heads=16, vocab_size=32000)
    model = random_gla(cfg, args.recipe)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, 16), device="cuda")
    table = configs.table_key(torch.cuda.get_device_name())
    before = [step_us(model, ids) for _ in range(3)]
    print(f"step before: {before} us; GEMM shapes {SEEN}", flush=True)
    log: list = []
    kept = sweep_gemms(model, ids, table, args.min_gain, log)
    decode = {} if args.no_decode else sweep_decode(model, ids, args.batch * cfg.num_heads, args.min_gain, log)
    gla = state_io.DECODE_LAUNCH["gla"]
    table_launch = dict(gla)
    kept_launch = dict(gla, **({decode["fmt"]: ((None, *decode["launch"]),)} if decode else {}))
    kept_tiles = dict(OVERRIDE)
    after, again = [], []
    for _ in range(3):  # alternated: the kept tiles and launch, the tables'
        gla.update(kept_launch)
        OVERRIDE.update(kept_tiles)
        after.append(step_us(model, ids))
        gla.update(table_launch)
        OVERRIDE.clear()
        again.append(step_us(model, ids))
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, batch=args.batch,
                  layers=args.layers, recipe=args.recipe, table=table, shapes=[list(k) for k in SEEN],
                  step_us_table=again, step_us_kept=after, kept_gemm=kept, kept_decode=decode, timings=log,
                  seconds=round(time.time() - t0))
    print(json.dumps({k: v for k, v in result.items() if k != "timings"}, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
