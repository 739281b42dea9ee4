import sys, torch
sys.path.insert(0, "tests")
from conftest import rel_err
from test_graphed_hybrid_prefill import _model
from laquant.generate import prefill
from laquant.models.cache import state_store
from laquant.models.static_hybrid import kv_layers

torch.manual_seed(0)
for fam in ("minimax", "qwen3_next"):
    model = _model(fam, "hybrid_int8", device="cuda")
    for trial in range(3):
        ids = torch.randint(1, 500, (2, 100), device="cuda")
        g_logits, g = prefill(model, ids, graphed=True)
        e_logits, e = prefill(model, ids)
        kg, ke = kv_layers(g), kv_layers(e)
        print(fam, trial, "graphed vs eager logits %.2e" % rel_err(g_logits, e_logits),
              "keys", ["%.1e" % rel_err(kg[i][0], ke[i][0]) for i in sorted(kg)],
              "values", ["%.1e" % rel_err(kg[i][1], ke[i][1]) for i in sorted(kg)])
        # natural noise: each row alone, eagerly, against its row of the batch
        for b in range(2):
            s_logits, s = prefill(model, ids[b:b + 1])
            ks = kv_layers(s)
            print("   row", b, "alone vs in batch: logits %.2e" % rel_err(s_logits, e_logits[b:b + 1]),
                  "keys", ["%.1e" % rel_err(ks[i][0], ke[i][0][b:b + 1]) for i in sorted(ks)],
                  "graphed row keys", ["%.1e" % rel_err(kg[i][0][b:b + 1], ke[i][0][b:b + 1]) for i in sorted(ks)])
