"""Compile every recorded launch of the CPU suite for another arch and report the shared memory each takes against
that GPU's block limit (and compile failures)."""
import sys, os, collections
sys.path.insert(0, "tools")
import sass_mix
from launch_record import read_records, decode_launch

arch, limit = int(sys.argv[1]), int(sys.argv[2])
sass_mix.TARGET = ("cuda", arch, 32)
over, failed, ok = collections.Counter(), collections.Counter(), 0
worst = {}
for rec in read_records(sys.argv[3]):
    try:
        fn, a, kw = decode_launch(rec)
        kw = {k: v for k, v in kw.items() if k not in ("launch_pdl",)}
        if "PDL" in kw:
            kw["PDL"] = 0
        c = sass_mix.compile_like_jit(fn, a, kw)
        shared = c.metadata.shared
        name = fn.__name__
        worst[name] = max(worst.get(name, 0), shared)
        if shared > limit:
            over[name] += 1
        else:
            ok += 1
    except Exception as e:
        failed[(rec.get("kernel"), type(e).__name__, str(e).strip().splitlines()[-1][:120] if str(e).strip() else "")] += 1
print(f"sm_{arch}: {ok} launches fit {limit} B; over: {dict(over)}; failed: {dict(failed)}")
for name, s in sorted(worst.items(), key=lambda kv: -kv[1])[:15]:
    print(f"  {name}: up to {s} B")
