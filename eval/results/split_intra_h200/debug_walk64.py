import subprocess, sys, json
cases = [(K, V, dt, st, w) for K, V in ((48, 40), (128, 128)) for dt in ("bf16",) for st in (1, 2) for w in (4, 2)] + \
        [(48, 40, "fp32", 2, 4), (48, 40, "bf16", 2, 8)]
code = r'''
import sys, torch, torch.nn.functional as F
K, V, dt, st, w = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
from laquant.kernels.delta.chunk import chunk_delta_triton, chunk_delta_reference
gen = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=gen)
B, T, Hk, Hv = 2, 150, 1, 2
q, k, v = r(B, T, Hk, K), r(B, T, Hk, K), r(B, T, Hv, V)
g = -F.softplus(r(B, T, Hv)) * 0.5
beta = torch.sigmoid(r(B, T, Hv))
dtype = torch.bfloat16 if dt == "bf16" else torch.float32
q, k, v = (x.cuda().to(dtype) for x in (q, k, v)); g, beta = g.cuda(), beta.cuda()
ref = chunk_delta_reference(q.float(), k.float(), v.float(), g, beta, use_qk_l2norm=True)[0]
for bt in (16, 32, 64):
    out = chunk_delta_triton(q, k, v, g, beta, use_qk_l2norm=True, split_intra=False, block_t=bt, num_stages=st,
                             num_warps=w)
    print(bt, "rel", round(((out[0].float() - ref).norm() / ref.norm()).item(), 5))
'''
for c in cases:
    p = subprocess.run([sys.executable, "-c", code, *map(str, c)], capture_output=True, text=True)
    print(json.dumps({"case": c, "rc": p.returncode, "out": p.stdout.strip().replace(chr(10), " | "), "err": p.stderr.strip()[-200:]}), flush=True)
