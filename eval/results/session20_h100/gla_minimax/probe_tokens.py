import sys, torch
sys.path.insert(0, "tests")
from test_graphed_hybrid_prefill import _model
from laquant.generate import prefill
from laquant.models.static_hybrid import kv_layers

def tok_err(a, b):
    a, b = a.flatten(0, -2).float(), b.flatten(0, -2).float()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)

model = _model("minimax", "hybrid_int8", device="cuda")
for B, T in ((1, 128), (2, 100), (1, 100)) * 2:
    ids = torch.randint(1, 500, (B, T), device="cuda")
    _, g = prefill(model, ids, graphed=True)
    _, e = prefill(model, ids)
    kg, ke = kv_layers(g), kv_layers(e)
    for i in sorted(kg):
        for n, (x, y) in enumerate(((kg[i][0], ke[i][0]), (kg[i][1], ke[i][1]))):
            err = tok_err(x, y)
            big = (err > 1e-4)
            if big.any():
                print(B, T, "layer", i, "kv"[n], "rows", err.numel(), "over 1e-4:", int(big.sum()),
                      "max %.3g" % err.max().item(), "top", ["%.2g" % v for v in err.sort(descending=True).values[:8].tolist()],
                      "at", big.nonzero().flatten()[:12].tolist())
