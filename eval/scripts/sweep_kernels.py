"""Launch-parameter sweep for the decode and prefill kernels (H100 numbers set the defaults)."""
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from laquant.kernels.gla_chunk_triton import chunk_gla_triton
from laquant.kernels.gla_decode_triton import gla_decode_step
from laquant.quant.state import StateQuantizer

B, H, K = 64, 64, 128
q, k, v = (torch.randn(B, H, K, device="cuda").bfloat16() for _ in range(3))
g = (F.logsigmoid(torch.randn(B, H, K, device="cuda")) / 16).bfloat16()
idx = torch.arange(B, device="cuda", dtype=torch.int32)
for fmt in ("fp8_row", "bf16", "fp32"):
    quant = StateQuantizer(fmt)
    data, scale = quant.store(torch.randn(B, H, K, K, device="cuda"))
    scale = scale.squeeze(-1).contiguous() if scale is not None else None
    for bk in (8, 16, 32, 64, 128):
        for w in (2, 4, 8):
            try:
                ms = do_bench(lambda: gla_decode_step(q, k, v, g, data, scale, idx, quant, block_k=bk, num_warps=w),
                              return_mode="median")
                print(f"decode {fmt} block_k={bk} warps={w}: {ms * 1e3:.1f} us", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"decode {fmt} block_k={bk} warps={w}: {type(e).__name__}", flush=True)
for T in (4096, 65536):
    Bp = 65536 // T
    q, k, v = (torch.randn(Bp, T, 16, 128, device="cuda").bfloat16() for _ in range(3))
    g = (F.logsigmoid(torch.randn(Bp, T, 16, 128, device="cuda")) / 16).bfloat16()
    for bv in (32, 64, 128):
        for w in (4, 8):
            for st in (1, 2):
                try:
                    ms = do_bench(lambda: chunk_gla_triton(q, k, v, g, block_v=bv, num_warps=w, num_stages=st),
                                  return_mode="median")
                    print(f"prefill T={T} block_v={bv} warps={w} stages={st}: {ms:.3f} ms", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"prefill T={T} block_v={bv} warps={w} stages={st}: {type(e).__name__} {str(e)[:80]}", flush=True)
