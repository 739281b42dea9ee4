import subprocess, sys, json
# each case in its own process (an illegal access poisons the context)
cases = [(64, K, V, "bf16", which) for K, V in ((16, 32), (32, 32), (48, 40)) for which in ("intra", "full", "walk64")]
code = r'''
import sys, torch, torch.nn.functional as F
sys.path.insert(0, "tests")
bt, K, V, dt, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
from laquant.kernels.delta.intra import delta_intra_chunk
from laquant.kernels.delta.chunk import chunk_delta_triton, chunk_delta_reference
gen = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=gen)
B, T, Hk, Hv = 2, 150, 1, 2
q, k, v = r(B, T, Hk, K), r(B, T, Hk, K), r(B, T, Hv, V)
g = -F.softplus(r(B, T, Hv)) * 0.5
beta = torch.sigmoid(r(B, T, Hv))
dtype = torch.bfloat16 if dt == "bf16" else torch.float32
import laquant.kernels.delta.intra as di
if which.startswith("intra_w"):
    di.INTRA_WARPS[64] = int(which[7:]); which = "intra"
q, k, v = (x.cuda().to(dtype) for x in (q, k, v)); g, beta = g.cuda(), beta.cuda()
if which == "intra":
    out = delta_intra_chunk(q, k, v, g, beta, None, None, True, bt)
else:
    out = chunk_delta_triton(q, k, v, g, beta, use_qk_l2norm=True, split_intra=which == "full", block_t=bt,
                             output_final_state=True)
torch.cuda.synchronize()
if which != "intra":
    ref = chunk_delta_reference(q.float(), k.float(), v.float(), g, beta, use_qk_l2norm=True)[0]
    print("rel", ((out[0].float() - ref).norm() / ref.norm()).item())
print("ok")
'''
for c in cases:
    p = subprocess.run([sys.executable, "-c", code, *map(str, c)], capture_output=True, text=True,
                       env={**__import__("os").environ, "CUDA_LAUNCH_BLOCKING": "1"})
    print(json.dumps({"case": c, "rc": p.returncode, "out": p.stdout.strip()[-200:], "err": p.stderr.strip()[-300:]}), flush=True)
