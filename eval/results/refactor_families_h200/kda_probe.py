import sys, torch
sys.path.insert(0, "tests")
from test_kda_kernels import _inputs
from conftest import rel_err
from laquant.kernels.kda.chunk import chunk_kda_reference, chunk_kda_triton
for T in (64, 65, 90, 128, 200):
    for bt, bv in ((16, 16), (64, None), (64, 16), (64, 32), (32, None)):
        args = _inputs(1, T, 1, 1, 16, 32, seed=7)
        kw = dict(output_final_state=True, use_qk_l2norm=True)
        try:
            o, f = chunk_kda_triton(*args, **kw, block_t=bt, block_v=bv)
            r, fr = chunk_kda_reference(*args, **kw)
            print(T, bt, bv, f"{rel_err(o.float(), r.float()):.2e}", f"{rel_err(f.load(), fr.load()):.2e}", flush=True)
        except Exception as e:
            print(T, bt, bv, "ERR", str(e)[:100])
