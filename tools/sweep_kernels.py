"""Launch-parameter sweep for the decode and prefill kernels (GLA and the gated delta rule) (H100 numbers set the defaults).

    python tools/sweep_kernels.py state_decode [--write] [--out FILE]   (the decode kernels, every state format,
        batches of 1-64; --write: the fastest launch per launch size into kernels/common/state_io.py's table)
    python tools/sweep_kernels.py state_decode --write --from FILE[,FILE] [--device NAME]   (the sweep's GPU's table
        from its JSON lines; --device names the GPU of rows that do not)
    python tools/sweep_kernels.py verify [--write] [--jobs N] [--out FILE] [--steps verify commit]
        (both verify kernels' verify step and commit, every state format, 4 tokens, over blocks, warps and
        prefetch, compiled by N processes first; --write: the fastest into kernels/common/state_io.py)
    python tools/sweep_kernels.py verify --write --from FILE[,FILE]   (the tables from sweeps' JSON lines)
    python tools/sweep_kernels.py prefill T BLOCK_T BLOCK_V WARPS   (one config per process:
        a config that faults must not take the others down with it)
    python tools/sweep_kernels.py delta_prefill T BLOCK_T BLOCK_V WARPS
"""
import functools
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

from laquant.kernels.delta.chunk import chunk_delta_reference, chunk_delta_triton
from laquant.kernels.delta.decode import delta_decode_step
from laquant.kernels.delta.verify import delta_verify
from laquant.kernels.gla.chunk import chunk_gla_reference, chunk_gla_triton
from laquant.kernels.gla.decode import gla_decode_step
from laquant.kernels.gla.verify import gla_verify
from laquant.kernels.common.state import StateQuantizer


STATE_FORMATS = ("fp32", "bf16", "fp8_row:stochastic", "int8_row:stochastic")  # the recipes' roundings
# (Hk, Hv, K, V) of the e2e models: the 1.37B GLA (issue #14's), the 1.14B qwen3_next's Gated DeltaNet, and the
# Mamba2 families' SSD heads (64 heads of 128 state rows by 64, one group)
STATE_SHAPES = {"gla": (16, 16, 64, 128), "delta": (16, 32, 128, 128), "ssd": (1, 64, 128, 64)}
STATE_BATCHES = (1, 4, 16, 64)
STATE_CONFIGS = [(bk, w) for bk in (8, 16, 32, 64, 128) for w in (1, 2, 4, 8)]
NEAR_FASTEST = 1.03  # a bucket keeps the next bucket's launch when that is this close to its fastest


def _flag_values(flags, name, default, cast=str):
    """The values after ``--name`` in ``flags`` (up to the next flag), cast; ``default`` (a list) without the flag."""
    if name not in flags:
        return list(default)
    return [cast(x) for x in itertools.takewhile(lambda x: not x.startswith("--"), flags[flags.index(name) + 1:])]


def _decode_step(kernel, B, Hk, H, K, V):
    """A closure ``step(data, scale, quant, block_k, num_warps)`` running ``kernel``'s decode step on fixed random
    inputs of batch B."""
    from laquant.kernels.gla.decode import ssd_decode_step

    gen = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    n_stores = torch.zeros(B, device="cuda", dtype=torch.int32)
    if kernel == "ssd":
        x = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
        b_, c = (torch.randn(B, Hk, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
        dt = torch.randn(B, H, device="cuda", generator=gen).bfloat16()
        dt_bias, A_log, D = (torch.randn(H, device="cuda", generator=gen) for _ in range(3))
        y = torch.empty(B, H, V, device="cuda", dtype=torch.bfloat16)
        return lambda data, scale, quant, bk, w: ssd_decode_step(  # noqa: E731
            c, b_, x, dt, dt_bias, A_log, D, None, data, scale, idx, quant, n_stores, seed=1, out=y, block_k=bk,
            num_warps=w)
    q, k = (torch.randn(B, Hk, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    if kernel == "gla":
        g = (F.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen)) / 16).bfloat16()
        return lambda data, scale, quant, bk, w: gla_decode_step(  # noqa: E731
            q, k, v, g, data, scale, idx, quant, n_stores, block_k=bk, num_warps=w, seed=1)
    g, beta = -F.softplus(torch.randn(B, H, device="cuda", generator=gen)), torch.rand(B, H, device="cuda")
    return lambda data, scale, quant, bk, w: delta_decode_step(  # noqa: E731
        q, k, v, g, beta, data, scale, idx, quant, n_stores, use_qk_l2norm=True, block_k=bk, num_warps=w, seed=1)


def state_decode(*flags):
    """The decode kernels (GLA's, the delta rule's, GLA's SSD mode) per state format (``:stochastic`` with the
    store counts) and batch over (block_k, num_warps), CUDA-graph medians, as JSON lines (``--out FILE`` too).
    ``--write`` puts the fastest per format and launch size (stochastic rounding's for the 8-bit formats: the
    recipes') into ``kernels/common/state_io.py`` (``--from FILE[,FILE]``: from a sweep's lines);
    ``--kernels gla``, ``--batches 1 64``, ``--blocks 8 16`` narrow the sweep; ``--jobs N`` processes compile
    every launch first (``--compile-only I N``: launch shard I of N, run once untimed). ``--pools N`` (default 24):
    each timing runs the launch once on each of N state pools, so that the state streams from device memory as a
    model's layers' pools do (1: one pool, hot in L2 from one call to the next, as the tables were swept until
    2026-12-04; that hid the decode walks' memory latency, eval/results/decode_prefetch_h200/)."""
    flags = list(flags)
    listed = lambda name, cast, default: _flag_values(flags, name, default, cast)  # noqa: E731
    if "--from" in flags:
        rows = [json.loads(line) for name in listed("--from", str, [])[0].split(",") for line in open(name)
                if line.startswith("{")]
        if "--device" in flags:  # rows of a sweep from before they named their GPU
            rows = [{"device": " ".join(listed("--device", str, [])), **row} for row in rows]
        return _write_state_tables(rows)
    kernels = listed("--kernels", str, STATE_SHAPES)
    batches = listed("--batches", int, STATE_BATCHES)
    blocks = listed("--blocks", int, sorted({bk for bk, _ in STATE_CONFIGS}))
    out = open(listed("--out", str, [])[0], "w") if "--out" in flags else None
    shard, shards = listed("--compile-only", int, [0, 1]) if "--compile-only" in flags else (None, 1)
    jobs = listed("--jobs", int, [1])[0]
    n_pools = listed("--pools", int, [24])[0]
    if jobs > 1:  # each process compiles a share of the launches, so that the timing finds them in Triton's cache
        import subprocess

        narrowed = [f for name in ("--kernels", "--batches", "--blocks") if name in flags
                    for f in [name, *map(str, listed(name, str, []))]]
        procs = [subprocess.Popen([sys.executable, __file__, "state_decode", "--compile-only", str(i), str(jobs),
                                   *narrowed]) for i in range(jobs)]
        print(f"compiled in {jobs} processes (exit codes {[p.wait() for p in procs]})", flush=True)
    rows, n = [], 0
    for kernel in kernels:
        Hk, H, K, V = STATE_SHAPES[kernel]
        for B in batches[:1] if shard is not None else batches:
            step = _decode_step(kernel, B, Hk, H, K, V)
            for name in STATE_FORMATS:
                fmt, _, rounding = name.partition(":")
                quant = StateQuantizer(fmt, rounding=rounding or "nearest")
                pools = []
                for _ in range(1 if shard is not None else n_pools):
                    data, scale = StateQuantizer(fmt).store(torch.randn(B, H, K, V, device="cuda") * 0.1)
                    pools.append((data, scale.squeeze(-1).contiguous() if scale is not None else None))
                moved = 2 * data.numel() * data.element_size() + (2 * scale.numel() * 4 if scale is not None else 0)
                for bk, w in STATE_CONFIGS:
                    if bk not in blocks or bk > K or bk * V // (32 * w) < 4:
                        continue
                    n += 1
                    if shard is not None:
                        if n % shards == shard:
                            step(*pools[0], quant, bk, w)
                        continue
                    us = do_bench_cudagraph(lambda: [step(d, c, quant, bk, w) for d, c in pools], rep=30) * 1e3
                    us /= len(pools)
                    row = dict(device=torch.cuda.get_device_name(), kernel=kernel, shape=[B, Hk, H, K, V], B=B,
                               programs=B * H, pools=len(pools), format=name, block_k=bk, num_warps=w, us=round(us, 2),
                               state_GBps=round(moved / us / 1e3, 1))
                    rows.append(row)
                    print(json.dumps(row), file=out, flush=True)
                    print(json.dumps(row), flush=True)
    if shard is not None:
        torch.cuda.synchronize()
    elif "--write" in flags:
        _write_state_tables(rows)


def _buckets(timed, tails=None, incumbents=None):
    """``{key: ((max_programs, *launch), ..., (None, *launch))}`` from ``{key: {programs: {launch: us}}}``: per swept
    launch size its fastest launch, good up to that many programs (the largest: any more, unless ``tails`` holds
    today's buckets past the sweep for the key, which then follow); the largest keeps ``incumbents[key]`` (today's
    catch-all launch) where that is within :data:`NEAR_FASTEST` of its fastest, a swept bucket whose fastest is
    within it of the next bucket's launch takes that one, and equal neighbours merge."""
    tables = {}
    for key, by_programs in sorted(timed.items(), key=lambda kv: str(kv[0])):
        sizes = sorted(by_programs)
        chosen = [min(by_programs[p], key=by_programs[p].get) for p in sizes]
        tail = (tails or {}).get(key)
        incumbent = (incumbents or {}).get(key)
        if tail:
            sizes, chosen = sizes + [b[0] for b in tail], chosen + [tuple(b[1:]) for b in tail]
        elif incumbent in by_programs[sizes[-1]] and \
                by_programs[sizes[-1]][incumbent] <= NEAR_FASTEST * by_programs[sizes[-1]][chosen[-1]]:
            chosen[-1] = incumbent  # a noisy few percent do not move the catch-all
        for i in range(len(by_programs) - 1, -1, -1):
            if i + 1 < len(sizes):
                here, nxt = by_programs[sizes[i]], chosen[i + 1]
                if nxt in here and here[nxt] <= NEAR_FASTEST * here[chosen[i]]:
                    chosen[i] = nxt
        buckets = []
        for i, (p, c) in enumerate(zip(sizes, chosen)):
            if i + 1 < len(sizes) and chosen[i + 1] == c:
                continue
            buckets.append((p if i + 1 < len(sizes) else None, *c))
        tables[key] = tuple(buckets)
    return tables


def _batch_and_programs(row):
    """A sweep row's batch and programs (rows from before the batches were swept: its shape's, [B, Hk, H, K, V])."""
    B = row.get("B", row["shape"][0])
    return B, row.get("programs", B * row["shape"][2])


def _bucket_tables(rows, key_of, launch_of, current):
    """``{key: buckets}`` (:func:`_buckets`) from a sweep's rows, keyed by ``key_of(row)`` (a tuple of the table's
    levels), each row's launch ``launch_of(row)``; where the rows of a key stop short of :data:`FULL_BATCH`, the
    buckets of ``current(key)`` (today's table) past the largest swept launch size stay (:func:`_tails`)."""
    timed, full = {}, {}
    for row in rows:
        key = key_of(row)
        B, programs = _batch_and_programs(row)
        full[key] = full.get(key, False) or B >= FULL_BATCH
        timed.setdefault(key, {}).setdefault(programs, {})[launch_of(row)] = row["us"]
    return _buckets(timed, _tails(timed, full, current), _incumbents(timed, current))


def _nested_get(table, key):
    """``table[key[0]][key[1]]...``, None where a level is missing."""
    for level in key:
        table = table.get(level) if isinstance(table, dict) else None
    return table


def _nested_set(table, key, value):
    for level in key[:-1]:
        table = table.setdefault(level, {})
    table[key[-1]] = value


def _table_lines(name, table, rows, comment=True):
    """The generated lines of a launch table ``name = {...}`` (nested dicts of bucket tuples, four spaces a level),
    under a comment naming the sweep's devices (``comment``: a table not keyed by GPU)."""
    devices = sorted({row.get("device", "GPU not recorded") for row in rows})

    def body(d, depth):
        pad = "    " * depth
        for k, v in d.items():
            if isinstance(v, dict):
                yield f'{pad}"{k}": {{\n'
                yield from body(v, depth + 1)
                yield f"{pad}}},\n"
            else:
                yield f'{pad}"{k}": {tuple(map(tuple, v))!r},\n'

    return [f"# {' / '.join(devices)}\n"] * comment + [f"{name} = {{\n", *body(table, 1), "}\n"]


def _incumbents(timed, current):
    """Each key's catch-all launch today (``current(key)``'s last bucket), where it has one."""
    return {key: tuple(current(key)[-1][1:]) for key in timed if current(key)}


def _tails(timed, full, current):
    """The buckets to keep where the sweep of a key stopped short of :data:`FULL_BATCH`: ``current(key)``'s past the
    largest swept launch size, the catch-all last; a key without a table gets none (its largest swept size becomes its
    catch-all)."""
    tails = {}
    for key, by_programs in timed.items():
        buckets = current(key)
        if not full[key] and buckets:
            tails[key] = tuple(b for b in buckets if b[0] is None or b[0] > max(by_programs))
    return tails


def _write_state_tables(rows):
    """The sweep's GPU's decode launch tables between the markers (``DECODE_LAUNCH[gpu]``); the other GPUs' stay.
    A kernel the GPU has no table of yet starts from the one it takes today (:func:`state_io.decode_table`: another
    GPU's), so that a format or batch the rows do not cover keeps today's launch."""
    from laquant.kernels.common import state_io

    devices = {row.get("device") for row in rows}
    if len(devices) != 1 or None in devices:
        raise SystemExit(f"a decode table is written from one GPU's sweep; these rows are from "
                         f"{sorted(map(str, devices))} (rows that do not name theirs: --device NAME)")
    gpu = devices.pop()
    tables = {name: {kernel: dict(formats) for kernel, formats in kernels.items()}
              for name, kernels in state_io.DECODE_LAUNCH.items()}
    own = tables.setdefault(gpu, {})
    for kernel in sorted({row["kernel"] for row in rows} - set(own)):
        own[kernel] = dict(state_io.decode_table(kernel, gpu))
    built = _bucket_tables(rows, lambda row: (row["kernel"], row["format"].partition(":")[0]),
                           lambda row: (row["block_k"], row["num_warps"]), lambda key: _nested_get(own, key))
    for key, buckets in built.items():
        _nested_set(own, key, buckets)
    for row in _state_summary(rows, own):
        print(row, flush=True)
    _write_generated("state_decode", _table_lines("DECODE_LAUNCH", tables, rows, comment=False))


def _state_summary(rows, tables):
    """A line per (kernel, format, batch): the table's launch and its time against the fastest."""
    from laquant.kernels.common.state_io import bucket_launch

    timed = {}
    for row in rows:
        timed.setdefault((row["kernel"], row["format"].partition(":")[0], *_batch_and_programs(row)), {})[
            row["block_k"], row["num_warps"]] = row["us"]
    for (kernel, fmt, B, programs), by_cfg in sorted(timed.items()):
        best = min(by_cfg, key=by_cfg.get)
        pick = bucket_launch(tables[kernel][fmt], programs)
        yield (f"{kernel} {fmt} B={B}: table {pick} {by_cfg.get(pick)} us, fastest {best} {by_cfg[best]} us")


def _write_generated(mode, lines):
    """``lines`` in place of what ``mode``'s sweep generated last in ``kernels/common/state_io.py`` (between
    its begin and end markers)."""
    path = os.path.join(os.path.dirname(__file__), "..", "kernels", "common", "state_io.py")
    begin = f"# --- generated by tools/sweep_kernels.py {mode}: begin ---\n"
    end = f"# --- generated by tools/sweep_kernels.py {mode}: end ---\n"
    head, rest = open(path).read().split(begin)
    _, tail = rest.split(end)
    with open(path, "w") as f:
        f.write(head + begin + "".join(lines) + end + tail)


VERIFY_TOKENS = (4, 8)  # the tables take the fastest at 4; 8 is timed for the winner and today's default
VERIFY_BATCHES = (1, 8, 64)
FULL_BATCH = 64  # a sweep up to this batch makes the tables' catch-all; a narrower one keeps theirs


def _verify_configs(kernel, fmt, K, V, programs, step="verify"):
    """(block_k, block_v, num_warps, prefetch) to try: GLA's K rows in blocks, the delta rule's whole K;
    V in blocks for the plain formats (a scaled one's row scale spans the row); 2-32 state elements a
    thread (64 where one program takes the whole state, or where the launch has at most 128 programs).
    The verify step with numerics "prefill" runs the tokens as one chunk: the whole K, V blocks of 32 and more
    (tensor-core products; 1 warp or 16-column blocks measured slower or spilled on an H200), nothing to prefetch."""
    if step == "verify_prefill":
        return [(None, bv, w, 0) for bv in (32, 64, 128) if bv <= max(32, V) for w in (2, 4, 8)
                if K * bv / (32 * w) <= 128]
    scaled = fmt.partition(":")[0] in ("fp8_row", "int8_row")
    bks = tuple(bk for bk in (4, 8, 16, 32, 64) if bk <= K) if kernel == "gla" else (None,)
    bvs = (None,) if scaled else (16, 32, 64, 128) if kernel == "gla" else (8, 16, 32, 64, 128)
    out = []
    for bk in bks:
        for bv in bvs:
            for w in (1, 2, 4, 8, 16):
                per_thread = (bk or K) * (bv or V) / (32 * w)
                most = 64 if bk == bv is None or programs <= 128 else 32
                if 2 <= per_thread <= most and (bv or V) <= V:
                    out += [(bk, bv, w, p) for p in (0, 1)]
    return out


def state_pool(name, B, H, K, V, gen):
    """A pool of B random states ``[B, H, K, V]`` in format ``name`` (``:stochastic`` for the rounding) with its
    row scales, slots, store counts and quantizer: ``(data, scale, idx, quantizer, n_stores)``."""
    fmt, _, rounding = name.partition(":")
    quant = StateQuantizer(fmt, rounding=rounding or "nearest")
    data, scale = StateQuantizer(fmt).store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
    scale = scale.squeeze(-1).contiguous() if scale is not None else None
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    return data, scale, idx, quant, torch.zeros(B, device="cuda", dtype=torch.int32)


def verify_inputs(kernel, B, T, Hk, H, K, V, gen):
    """Random bf16 inputs of ``T`` tokens for ``kernel``'s verify step (GLA's q, k, v, g; the delta rule's q, k, v,
    g, beta) and its keyword arguments: ``(ins, kw)``."""
    q, k = (torch.randn(B, T, Hk, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, T, H, V, device="cuda", generator=gen).bfloat16()
    if kernel == "gla":
        return (q, k, v, (F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)) / 16).bfloat16()), {}
    g = -F.softplus(torch.randn(B, T, H, device="cuda", generator=gen))
    return (q, k, v, g, torch.rand(B, T, H, device="cuda", generator=gen)), {"use_qk_l2norm": True}


def _verify_cases(steps, batches, formats):
    """(kernel, format, shape, T, step, run(config), the table's config) of the sweep: the e2e models'
    shapes at each batch; ``steps`` of verify (T tokens) and commit (of T / 2, recomputed)."""
    from laquant.kernels.common.state_io import verify_launch
    from laquant.kernels.delta.verify import delta_commit
    from laquant.kernels.gla.verify import gla_commit

    for kernel in ("gla", "delta"):
        Hk, H, K, V = STATE_SHAPES[kernel]
        for B in batches:
            gen = torch.Generator(device="cuda").manual_seed(0)
            for name in formats:
                fmt = name.partition(":")[0]
                data, scale, idx, quant, n_stores = state_pool(name, B, H, K, V, gen)
                for T in VERIFY_TOKENS:
                    ins, kw = verify_inputs(kernel, B, T, Hk, H, K, V, gen)
                    half = torch.full((B,), T // 2, dtype=torch.int32, device="cuda")
                    verify_fn, commit_fn = (gla_verify, gla_commit) if kernel == "gla" else (delta_verify, delta_commit)
                    fns = {"verify": verify_fn, "commit": commit_fn,
                           "verify_prefill": functools.partial(verify_fn, numerics="prefill")}
                    pool = (data, scale, idx, quant)
                    for step in steps:
                        counts = (half,) if step == "commit" else ()
                        run = _launcher(fns[step], ins, pool, counts, n_stores, kw, kernel == "gla")
                        default = verify_launch(kernel, step, fmt, B * H)
                        yield kernel, name, [B, Hk, H, K, V], T, step, run, tuple(default)


def _launcher(fn, ins, pool, counts, n_stores, kw, has_block_k):
    """``run(config)``: ``fn`` (a verify or commit) on these inputs with the launch ``config``."""
    return lambda c: fn(*ins, *pool, *counts, n_stores, seed=1, block_v=c[1], num_warps=c[2], prefetch=bool(c[3]),
                        **kw, **({"block_k": c[0]} if has_block_k else {}))


def verify(*flags):
    """Both verify kernels' verify step (4 tokens) and commit (2 of them) per state format and batch over
    :func:`_verify_configs` (CUDA-graph medians, JSON lines), then the fastest and the table's current
    entry at 8 tokens too. ``--steps verify commit`` (and ``verify_prefill``: the verify step with
    ``numerics="prefill"``, V in blocks for every format), ``--batches 1 8``, ``--formats fp32 int8_row:stochastic``
    narrow it. ``--jobs N`` processes compile every config first (``--compile-only I N``: config shard I of N, run
    once untimed), so the timing process finds them in Triton's cache. ``--write`` puts the fastest per format
    (stochastic rounding's for the 8-bit formats) and launch size into ``kernels/common/state_io.py``'s table
    (``--from FILE``: from a sweep's lines); a sweep without B = 64 keeps the table's catch-alls."""
    flags = list(flags)
    opt = lambda name, default=None: flags[flags.index(name) + 1] if name in flags else default  # noqa: E731
    steps = _flag_values(flags, "--steps", ["verify", "commit"])
    batches = _flag_values(flags, "--batches", VERIFY_BATCHES, int)
    formats = _flag_values(flags, "--formats", STATE_FORMATS)
    if "--from" in flags:
        rows = [json.loads(line) for name in opt("--from").split(",") for line in open(name) if line.startswith("{")]
        return _write_verify_tables(rows)
    if "--compile-only" in flags:
        shard, shards = int(opt("--compile-only")), int(flags[flags.index("--compile-only") + 2])
        i, seen = 0, set()
        for kernel, name, shape, T, step, run, _ in _verify_cases(steps, batches, formats):
            if T != VERIFY_TOKENS[0]:
                continue
            for c in _verify_configs(kernel, name, shape[3], shape[4], shape[0] * shape[2], step):
                if (kernel, name, step, c) in seen:  # compiled at another batch
                    continue
                seen.add((kernel, name, step, c))
                if i % shards == shard:
                    run(c)
                i += 1
        torch.cuda.synchronize()
        return
    jobs = int(opt("--jobs", 1))
    if jobs > 1:
        import subprocess

        procs = [subprocess.Popen([sys.executable, __file__, "verify", "--compile-only", str(i), str(jobs),
                                   "--steps", *steps, "--batches", *map(str, batches), "--formats", *formats])
                 for i in range(jobs)]
        codes = [p.wait() for p in procs]
        print(f"compiled in {jobs} processes (exit codes {codes})", flush=True)
    out = open(opt("--out"), "w") if opt("--out") else None
    rows, bests = [], {}
    for kernel, name, shape, T, step, run, default in _verify_cases(steps, batches, formats):
        B, programs = shape[0], shape[0] * shape[2]
        key = (kernel, name, step, B)
        configs = (_verify_configs(kernel, name, shape[3], shape[4], programs, step)
                   if T == VERIFY_TOKENS[0]
                   else list(dict.fromkeys([bests[key], default])))
        timed = []
        for c in configs:
            us = do_bench_cudagraph(lambda: run(c), rep=50) * 1e3
            row = dict(device=torch.cuda.get_device_name(), kernel=kernel, shape=shape, B=B, programs=programs,
                       format=name, tokens=T, step=step, block_k=c[0], block_v=c[1], num_warps=c[2], prefetch=c[3],
                       default=c == default, us=round(us, 2))
            timed.append(row)
            print(json.dumps(row), file=out, flush=True)
        rows += timed
        if T == VERIFY_TOKENS[0]:
            best = min(timed, key=lambda r: r["us"])
            bests[key] = (best["block_k"], best["block_v"], best["num_warps"], best["prefetch"])
            was = next((r["us"] for r in timed if r["default"]), None)
            print(f"fastest {kernel} {step} {name} B={B} T={T}: {bests[key]} {best['us']} us "
                  f"(table's {default}: {was} us)", flush=True)
    if "--write" in flags:
        _write_verify_tables(rows)


def _write_verify_tables(rows):
    """The verify table between its markers in ``kernels/common/state_io.py`` from a sweep's rows (at
    :data:`VERIFY_TOKENS`' first count; rows without a batch are B = 64's); a kernel, step or format the rows
    do not cover keeps its entry, and so does a catch-all when the rows stop short of :data:`FULL_BATCH`."""
    from laquant.kernels.common import state_io

    if not rows:
        raise SystemExit("no sweep rows: the verify table stays as it is")
    table = {kernel: {step: dict(formats) for step, formats in steps.items()}
             for kernel, steps in state_io.VERIFY_LAUNCH.items()}
    built = _bucket_tables([row for row in rows if row["tokens"] == VERIFY_TOKENS[0]],
                           lambda row: (row["kernel"], row.get("step", "verify"), row["format"].partition(":")[0]),
                           lambda row: (row["block_k"], row["block_v"], row["num_warps"], int(row["prefetch"])),
                           lambda key: _nested_get(table, key))
    for key, buckets in built.items():
        _nested_set(table, key, buckets)
    _write_generated("verify", _table_lines("VERIFY_LAUNCH", table, rows))


def prefill(T, bt, bv, w):
    Bp = 65536 // T
    q, k, v = (torch.randn(Bp, T, 16, 128, device="cuda").bfloat16() for _ in range(3))
    g = (F.logsigmoid(torch.randn(Bp, T, 16, 128, device="cuda")) / 16).bfloat16()
    run = lambda: chunk_gla_triton(q, k, v, g, block_t=bt, block_v=bv, num_warps=w)  # noqa: E731
    o = run()[0]
    n = min(Bp, 2)
    ref = chunk_gla_reference(q[:n, :2048], k[:n, :2048], v[:n, :2048], g[:n, :2048])[0]
    err = ((o[:n, :2048].float() - ref.float()).norm() / ref.float().norm()).item()
    ms = do_bench(run, return_mode="median")
    print(f"prefill T={T} block_t={bt} block_v={bv} warps={w}: {ms:.3f} ms (rel err {err:.1e})", flush=True)


def delta_prefill(T, bt, bv, w):
    Bp = 65536 // T
    q, k = (torch.randn(Bp, T, 16, 128, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(Bp, T, 32, 128, device="cuda").bfloat16()
    g, beta = -F.softplus(torch.randn(Bp, T, 32, device="cuda")) * 0.5, torch.rand(Bp, T, 32, device="cuda")
    run = lambda: chunk_delta_triton(q, k, v, g, beta, use_qk_l2norm=True, block_t=bt, block_v=bv,  # noqa: E731
                                     num_warps=w)
    o = run()[0]
    n = min(Bp, 2)
    cut = lambda x: x[:n, :1024]  # noqa: E731
    ref = chunk_delta_reference(cut(q), cut(k), cut(v), cut(g), cut(beta), use_qk_l2norm=True)[0]
    err = ((cut(o).float() - ref.float()).norm() / ref.float().norm()).item()
    ms = do_bench(run, return_mode="median")
    print(f"delta_prefill T={T} block_t={bt} block_v={bv} warps={w}: {ms:.3f} ms (rel err {err:.1e})", flush=True)


if __name__ == "__main__":
    modes = {"state_decode": state_decode, "verify": verify, "prefill": prefill, "delta_prefill": delta_prefill}
    args = sys.argv[2:] if sys.argv[1] in ("state_decode", "verify") else map(int, sys.argv[2:])
    modes[sys.argv[1]](*args)
