# Run on the GPU from tools/ (as tools/diag_minimax_hf_generate.py, the repository root the working folder): whether
# transformers' generate takes graph steps on a tiny bf16 MiniMax and qwen3_next at B = 1 and 64 (diag_hf_generate.log).
import sys, time, warnings
sys.path.insert(0, "tests")
import torch
from test_hybrid import FAMILIES
from laquant.adapters import install
torch.manual_seed(0)
for fam in ("minimax", "qwen3_next"):
    model = FAMILIES[fam]().to("cuda", torch.bfloat16).eval()
    install(model)
    for B in (1, 64):
        ids = torch.randint(1, 100, (B, 13), device="cuda")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with torch.no_grad():
                model.generate(ids, max_new_tokens=4, do_sample=False)
                torch.cuda.synchronize(); t = time.perf_counter()
                model.generate(ids, max_new_tokens=32, do_sample=False)
                torch.cuda.synchronize(); dt = time.perf_counter() - t
        graphs = model.__dict__.get("_laquant_step_graphs", {})
        print(fam, B, f"{dt*1e3:.1f} ms", [type(g).__name__ if g else g for g in graphs.values()],
              [str(x.message)[:300] for x in w if "laquant" in str(x.message) or "graph" in str(x.message).lower()][:3], flush=True)
