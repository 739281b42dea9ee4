"""The decode GEMMs' tiles and the decode kernel's launch chosen inside the graphed decode step (issue #14).

``tools/sweep_gemm.py`` and ``tools/sweep_kernels.py state_decode`` time each kernel alone; in a graphed decode step a
kernel starts on its PDL wait behind the one before and its cost is that chain (``eval/results/l2_weights_h200/``:
weights held in L2 saved nothing in the step), so the fastest launch alone need not be the fastest there. This tool
builds a random model (speed only): the GLA of ``--layers`` x 2048 calibrated with ``--recipe``, or a transformers
hybrid (``--model FAMILY:{json}``, as ``laquant eval speed`` builds it, with ``--hybrid-recipe``); it captures
laquant.generate's decode step at ``--batch`` and, one GEMM shape at a time in the step's order (coordinate descent),
replays the step with each candidate tile of that shape's M bucket (the table's, split-K x2 / x4 / half, BN / 2 and
x 2, BK / 2 and x 2, more stages, 8 warps, SWAP_AB toggled), the shapes before at their best. The two fastest are timed
again, alternated with the table's, and kept if the step is ``--min-gain`` faster. Then the decode kernel's
(block_k, num_warps) for the bucket the step launches. Writes OUT.json (every timing, what was kept, the step before
and after, alternated); ``--write`` adds the kept entries to ``configs.STEP_TABLES`` and
``state_io.STEP_DECODE_LAUNCH``.

    python3 tools/sweep_step_tiles.py OUT.json [--batch 64] [--layers 24] [--recipe gla_int8_all] [--write]
        [--decode-only]
    python3 tools/sweep_step_tiles.py OUT.json --model 'qwen3_next:{...}' [--hybrid-recipe hybrid_int8] [--write]
"""
import argparse
import ast
import json
import pathlib
import statistics
import time

import torch

from laquant.generate import DecodeSession, release_graphs
from laquant.kernels.common import state_io
from laquant.kernels.gemm import configs

GEMMS: list = []  # (table, bucket, N, K) in the order the step first asks for them
DECODES: list = []  # (kernel, format, programs) of the step's decode launches
_table_entry, _decode_launch = configs._entry, state_io.decode_launch


def _entry(table, bucket, N, K):
    if (table, bucket, N, K) not in GEMMS:
        GEMMS.append((table, bucket, N, K))
    return _table_entry(table, bucket, N, K)


def _launch(kernel, fmt, programs, gpu=None):
    if (kernel, fmt, programs) not in DECODES:
        DECODES.append((kernel, fmt, programs))
    return _decode_launch(kernel, fmt, programs, gpu)


def record_lookups() -> None:
    """Route the GEMM and decode launch lookups (module globals, looked up at every launch) through :func:`_entry`
    and :func:`_launch`, which record what the step asks for. Done by :func:`main` only, so that importing this tool
    (its tests) leaves the lookups alone."""
    configs._entry, state_io.decode_launch = _entry, _launch


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
    if split > 1:  # fewer splits: each costs a partial's store and reload in the step
        variant(SPLIT_K=split // 2)
        if cfg["BN"] > 16:
            variant(BN=cfg["BN"] // 2, SPLIT_K=split // 2)
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


def choose(label, options, apply, measure, min_gain, log) -> object:
    """Time every option (the first is the table's), then the two fastest again alternated with the table's, twice;
    returns the option kept (the table's unless >= min_gain faster on the mean) and leaves it applied."""
    timed = []
    for opt in options:
        apply(opt)
        try:
            us = measure()
        except Exception as exc:  # a tile that does not compile or fit: skipped, said so
            us = None
            print(f"  {label} {opt}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        timed.append((us, opt))
        log.append(dict(what=label, option=opt, step_us=us))
        print(f"  {label} {opt}: {us}", flush=True)
    table = options[0]
    finalists = [opt for _, opt in sorted((t for t in timed if t[0] is not None), key=lambda t: t[0])[:2]
                 if opt != table]
    kept = table
    if finalists:
        again = [[] for _ in range(1 + len(finalists))]
        for _ in range(2):
            for i, opt in enumerate([table, *finalists]):
                apply(opt)
                again[i].append(measure())
        means = [statistics.mean(v) for v in again]
        log.append(dict(what=label, confirm=[table, *finalists], step_us=again))
        best = min(range(len(means)), key=means.__getitem__)
        if means[best] <= means[0] * (1 - min_gain):
            kept = [table, *finalists][best]
        print(f"  {label}: table {means[0]:.1f} us, best {means[best]:.1f} us "
              f"({'kept' if kept is not table else 'the table stays'})", flush=True)
    apply(kept)
    return kept


def sweep(model, ids, min_gain: float, log: list, bucket_of_step: int, gemms: bool = True) -> tuple[dict, dict]:
    """Coordinate descent over the step's GEMM shapes (those of M bucket ``bucket_of_step``; not when ``gemms`` is
    False), then its decode launches, from what the tables (overlays included) hold now; returns the entries to write:
    ``{table: {key: {path: tiles}}}`` and ``{GPU: {(kernel, format, bound): launch}}`` (this GPU's key of
    STEP_DECODE_LAUNCH, or its name for its first overlay), None where the sweep's choice is the table's own (an overlay
    entry to drop)."""
    measure = lambda: step_us(model, ids)  # noqa: E731
    tiles = {}
    for table, bucket, N, K in list(GEMMS) if gemms else ():
        key = configs.entry_key(table, bucket, N, K)
        if key is None or bucket != bucket_of_step:  # the prompt's GEMMs (the prefill) are not the step's
            continue
        path = configs.TABLES[table][key]["path"]
        own = dict(configs.TABLES[table][key][path])
        now = configs.STEP_TABLES.get(table, {}).get(key, {}).get(path, own)

        def apply(cfg, table=table, key=key, path=path, own=own):
            if cfg == own:
                configs.STEP_TABLES.get(table, {}).pop(key, None)
            else:
                configs.STEP_TABLES.setdefault(table, {})[key] = {path: cfg}
            _table_entry.cache_clear()

        best = choose(f"{key} ({N}x{K}) {path}", candidates(now), apply, measure, min_gain, log)
        if best != now:
            tiles.setdefault(table, {})[key] = None if best == own else {path: best}
    launches = {}
    gpu = torch.cuda.get_device_name()
    overlay, first = state_io.own_step_overlay(gpu)
    here = state_io.STEP_DECODE_LAUNCH[overlay]
    for kernel, fmt, programs in list(DECODES):
        formats = state_io.decode_table(kernel, gpu)
        fmt = fmt if fmt in formats else "fp32"
        bound, *own = state_io.bucket_of(formats[fmt], programs)
        k, own = (kernel, fmt, bound), tuple(own)
        now = here.get(k, own)
        options = [now, *sorted({own, (8, 1), (16, 1), (32, 1), (16, 2), (32, 2), (64, 2), (64, 4), (128, 4)}
                                - {now})]

        def apply(launch, k=k, own=own):
            if launch == own:
                here.pop(k, None)
            else:
                here[k] = launch

        best = choose(f"decode {kernel} {fmt} ({programs} programs)", options, apply, measure, min_gain, log)
        if best != now:
            launches[k] = None if best == own else best
    if first and launches:  # written whole: the launches it took from another GPU's overlay and kept stay its own
        launches = dict(here)
    return tiles, {overlay: launches} if launches else {}


def write(tiles: dict, launches: dict) -> None:
    """Merge the kept entries (``{GPU: {key: entry}}``) into the committed overlays (the generated blocks of
    configs.py / state_io.py); an entry None drops the overlay's."""
    root = pathlib.Path(configs.__file__).resolve().parents[1]
    begin = "# --- generated by tools/sweep_step_tiles.py: begin ---\n"
    end = "# --- generated by tools/sweep_step_tiles.py: end"
    for path, name in ((root / "gemm" / "configs.py", "STEP_TABLES"), (root / "common" / "state_io.py",
                                                                     "STEP_DECODE_LAUNCH")):
        src = path.read_text()
        a, b = src.index(begin) + len(begin), src.index(end)
        committed = ast.literal_eval(src[a:b].split("=", 1)[1].strip())
        kept = tiles if name == "STEP_TABLES" else launches
        merged = {t: {**committed.get(t, {}), **kept.get(t, {})} for t in {*committed, *kept}}
        merged = {t: {k: v for k, v in e.items() if v is not None} for t, e in merged.items()}
        body = "".join(f"    {t!r}: {{\n" + "".join(f"        {k!r}: {v!r},\n" for k, v in sorted(e.items(), key=repr))
                       + "    },\n" for t, e in sorted(merged.items()) if e)
        path.write_text(src[:a] + f"{name}: dict = {{\n{body}}}\n" + src[b:])
        print(f"wrote {name} into {path}")


def build(args):
    if args.model:
        from laquant.eval.speed import recipe_variants

        (_, _, make), = [v for v in recipe_variants([args.model], "gla_int8", args.hybrid_recipe)
                         if v[1] == args.hybrid_recipe]
        model = make()
    else:
        from profile_prefill import random_gla

        from laquant.models import GLAConfig

        model = random_gla(GLAConfig(hidden_size=2048, num_hidden_layers=args.layers, num_heads=16,
                                     vocab_size=32000), args.recipe)
    return model


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=24, help="the random GLA's layers")
    p.add_argument("--recipe", default="gla_int8_all", help="the random GLA's recipe")
    p.add_argument("--model", help="a transformers hybrid instead, as eval speed's --model FAMILY:{json}")
    p.add_argument("--hybrid-recipe", default="hybrid_int8")
    p.add_argument("--min-gain", type=float, default=0.01, help="keep an option this much faster (fraction)")
    p.add_argument("--write", action="store_true", help="merge what was kept into the committed overlays")
    p.add_argument("--decode-only", action="store_true", help="the decode kernel's launch alone, the GEMMs' tiles as "
                                                                "the tables hold them")
    args = p.parse_args()
    t0 = time.time()
    record_lookups()
    model = build(args)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, 16), device="cuda")
    before = step_us(model, ids)
    print(f"step {before:.1f} us; GEMMs {GEMMS}; decode launches {DECODES}", flush=True)
    log: list = []
    tiles, launches = sweep(model, ids, args.min_gain, log, configs.m_bucket(args.batch), not args.decode_only)
    kept_tiles = {t: dict(e) for t, e in configs.STEP_TABLES.items()}
    kept_launches = {g: dict(e) for g, e in state_io.STEP_DECODE_LAUNCH.items()}
    after, table = [], []
    for _ in range(3):  # alternated: what was kept, the tables'
        configs.STEP_TABLES.update(kept_tiles)
        state_io.STEP_DECODE_LAUNCH.update(kept_launches)
        _table_entry.cache_clear()
        after.append(step_us(model, ids))
        configs.STEP_TABLES.clear()
        state_io.STEP_DECODE_LAUNCH.clear()
        _table_entry.cache_clear()
        table.append(step_us(model, ids))
    name = args.model.split(":", 1)[0] if args.model else f"gla {args.layers}x2048"
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, model=name,
                  recipe=args.hybrid_recipe if args.model else args.recipe, batch=args.batch,
                  gemms=[list(g) for g in GEMMS], decodes=[list(d) for d in DECODES], step_us_tables=table,
                  step_us_kept=after, changed_tiles=tiles,
                  changed_launches={g: {repr(k): v for k, v in e.items()} for g, e in launches.items()},
                  timings=log, seconds=round(time.time() - t0))
    print(json.dumps({k: v for k, v in result.items() if k != "timings"}, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.write and (tiles or launches):
        write(tiles, launches)


if __name__ == "__main__":
    main()
