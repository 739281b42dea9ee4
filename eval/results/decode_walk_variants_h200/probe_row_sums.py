"""GLA int8 decode at B = 64: readout reduced per block (ROW_SUMS) and q/k/decay loaded after the block (LATE_INPUTS),
alone (1 and 24 pools) and in the graphed 1.37B GLA step; plus a bit check of the state against the shipped walk."""
import contextlib, json, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, "tools")
import probe_decode_prefetch as P
from laquant.kernels.gla import decode as D

VARIANTS = {"base8": (8, {}), "rs8": (8, {"ROW_SUMS": True}), "rs16": (16, {"ROW_SUMS": True}),
            "rs16late": (16, {"ROW_SUMS": True, "LATE_INPUTS": True}), "rs8late": (8, {"ROW_SUMS": True, "LATE_INPUTS": True}),
            "base16": (16, {})}
orig = D.pool_args

@contextlib.contextmanager
def variant(name):
    bk, extra = VARIANTS[name]
    def patched(*a, **kw):
        ptrs, strides, consts, w = orig(*a, **kw)
        if consts.get("PREFETCH"):
            consts.update(extra)
        return ptrs, strides, consts, w
    D.pool_args = patched
    try:
        with P.tabled("gla", (bk, 1, True)):
            yield
    finally:
        D.pool_args = orig

def check():
    from laquant.quant import StateQuantizer
    B, H, K, V = 64, 16, 64, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k = (torch.randn(B, H, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    g = (F.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen)) / 16).bfloat16()
    idx = torch.arange(B, device="cuda", dtype=torch.int32)
    ns = torch.full((B,), 5, device="cuda", dtype=torch.int32)
    data, scale = StateQuantizer("int8_row").store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
    scale = scale.squeeze(-1).contiguous()
    quant = StateQuantizer("int8_row", rounding="stochastic")
    out = {}
    for name in VARIANTS:
        d, s = data.clone(), scale.clone()
        with variant(name):
            o = D.gla_decode_step(q, k, v, g, d, s, idx, quant, ns, seed=7)
        out[name] = (o.float(), d, s)
    ref = out["base8"]
    ro = D.gla_decode_step_reference(q.float(), k.float(), v.float(), g.float(), data.clone(), scale.clone(), idx, quant, ns, seed=7)
    res = {}
    for name, (o, d, s) in out.items():
        res[name] = dict(state_equal=bool(torch.equal(d, ref[1]) and torch.equal(s, ref[2])),
                         o_maxdiff_vs_base=float((o - ref[0]).abs().max()), o_maxdiff_vs_ref=float((o - ro.float()).abs().max()),
                         nan=bool(o.isnan().any()))
    return res

@torch.no_grad()
def main():
    out = sys.argv[1]
    result = {"device": torch.cuda.get_device_name(), "check": check()}
    print(json.dumps(result, indent=1), flush=True)
    alone = {n: {"pools_1": [], "pools_24": []} for n in VARIANTS}
    for _ in range(3):
        for name in VARIANTS:
            with variant(name):
                for pools in (1, 24):
                    alone[name][f"pools_{pools}"].append(round(P.kernel_alone_us("gla", VARIANTS[name][0:1] + (1, True), pools), 3))
    result["alone"] = alone
    print(json.dumps(alone, indent=1), flush=True)
    from profile_prefill import random_gla
    from step_ablation import replay_us
    from laquant.models import GLAConfig
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
    model = random_gla(cfg, "gla_int8_all")
    ids = torch.randint(0, cfg.vocab_size, (64, 512), device="cuda")
    step = {n: [] for n in VARIANTS}
    for _ in range(3):
        for name in VARIANTS:
            with variant(name):
                step[name].append(round(replay_us(model, ids), 1))
    result["step_us"] = step
    result["step_median"] = {k: sorted(v)[1] for k, v in step.items()}
    print(json.dumps(result, indent=1), flush=True)
    json.dump(result, open(out, "w"), indent=1)

main()
