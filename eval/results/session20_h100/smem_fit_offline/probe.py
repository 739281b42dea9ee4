"""Compile the int8 GEMM launches of the worst committed tiles for sm_80 / sm_89 / sm_90 offline and read the shared
memory the compiled kernel takes, fitted to each GPU's budget or not."""
import os, sys, torch
sys.path.insert(0, "tools")
import sass_mix
from laquant.kernels.gemm import configs, int8 as gemm
from laquant.quant.modules import QuantLinear

MAX = {80: 166912, 89: 101376, 90: 232448}
cases = [("64@12288x4096", "w8a8"), ("64@2048x5632", "w8a16"), ("256@12288x4096", "w8a8"), ("16@2048x2048", "w8a16"),
         ("32@2048x4096", "w8a16")]
table = configs.TABLES["NVIDIA H100 80GB HBM3"]
for key, path in cases:
    M, shape = key.split("@")
    M = int(M); N, K = (int(v) for v in shape.split("x"))
    cfg = table[key][path]
    lin = torch.nn.Linear(K, N, bias=False).to(torch.bfloat16)
    mod = QuantLinear.from_linear(lin, torch.arange(8))
    p = mod.packed()
    x = torch.randn(M, K, dtype=torch.bfloat16)
    for sm in (90, 80, 89):
        for fitted in (False, True):
            budget = gemm.tile_smem_budget(MAX[sm]) if fitted else gemm.HOPPER_TILE_SMEM
            gemm._tile_smem = lambda device, b=budget: b
            with sass_mix.captured(gemm) as launches:
                if sm != 90:  # PDL is off before sm_90 (pdl.pdl_enabled)
                    gemm.pdl_launch = lambda device, rows: {"PDL": 0}
                if path == "w8a8":
                    if "SPLIT_K" in cfg:
                        gemm.int8_outlier_linear_triton(x, p, cfg)
                    else:
                        gemm.int8_gemm(*gemm.quantize_rows(x, p), p, torch.empty(M, N, dtype=torch.bfloat16), cfg)
                else:
                    gemm.int8_weight_only_linear_triton(x, p, cfg)
            fn, args, kwargs = next(l for l in launches if "gemm" in l[0].__name__)
            sass_mix.TARGET = ("cuda", sm, 32)
            try:
                c = sass_mix.compile_like_jit(fn, args, kwargs)
                shared = c.metadata.shared
                print(key, path, f"sm_{sm}", "fitted" if fitted else "as swept", {k: kwargs.get(k) for k in ("BK", "num_stages")},
                      "shared", shared, "limit", MAX[sm], "OK" if shared <= MAX[sm] else "TOO BIG", flush=True)
            except Exception as e:
                print(key, path, f"sm_{sm}", "fitted" if fitted else "as swept", "compile error", type(e).__name__, str(e)[:150], flush=True)
