"""A transformers Mamba2 family's decode, bf16 against hybrid_int8 (random ~1B config of tools/family_configs.py,
FAMILY=mamba2 by default): memory by phase (after calibration before and after a garbage collection, a B = 1 prefill
of 1,024 tokens, eager steps), the live CUDA tensors that are not the model's, the kernels of an eager B = 1 step
and of one replay of the graphed B = 1 and B = 64 steps (names, counts, GPU us), and the graphed steps' ms.

    FAMILY=nemotron_h python3 tools/family_decode_diag.py OUT.json
"""
import collections
import gc
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "tools")
from family_configs import CONFIGS  # noqa: E402

from laquant.eval.speed import cuda_kernels, recipe_variants  # noqa: E402
from laquant.generate import DecodeSession  # noqa: E402

GiB = 2**30


def kernel_counts(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    c = collections.Counter()
    t = collections.Counter()
    for name, _, us in cuda_kernels(p):
        c[name[:90]] += 1
        t[name[:90]] += us
    return [(k, c[k], round(t[k], 1)) for k, _ in c.most_common(40)], sum(c.values()), sum(t.values())


def live_census(model):
    own = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
    own_ptr = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    groups = collections.Counter()
    count = collections.Counter()
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.is_cuda and id(o) not in own and o.data_ptr() not in own_ptr:
                key = (tuple(o.shape), str(o.dtype))
                groups[key] += o.untyped_storage().nbytes()
                count[key] += 1
        except Exception:
            pass
    return [(str(k), count[k], round(v / 2**20, 1)) for k, v in groups.most_common(15)]


def model_bytes(model):
    return (sum(p.numel() * p.element_size() for p in model.parameters())
            + sum(b.numel() * b.element_size() for b in model.buffers()))


@torch.no_grad()
def main(out):
    fam = os.environ.get("FAMILY", "mamba2")
    cfg = json.dumps(CONFIGS[fam])
    result = {}
    for _, variant, make in recipe_variants([f"{fam}:{cfg}"], "gla_int8_all", "hybrid_int8"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = make()
        before_gc = torch.cuda.memory_allocated() / GiB
        gc.collect()
        torch.cuda.empty_cache()
        r = {"before_gc_GiB": before_gc, "after_build_GiB": torch.cuda.memory_allocated() / GiB,
             "build_peak_GiB": torch.cuda.max_memory_allocated() / GiB, "model_bytes_GiB": model_bytes(model) / GiB}
        r["census_after_build"] = live_census(model)
        vocab = model.config.vocab_size
        prompt = torch.randint(0, vocab, (1, 1024), device="cuda")
        torch.cuda.reset_peak_memory_stats()
        s = DecodeSession(model, prompt, 40, graphed=False)
        torch.cuda.synchronize()
        r["prefill_peak_GiB"] = torch.cuda.max_memory_allocated() / GiB
        r["after_prefill_GiB"] = torch.cuda.memory_allocated() / GiB
        for _ in range(3):
            s.step()
        torch.cuda.synchronize()
        r["eager_decode_peak_GiB"] = torch.cuda.max_memory_allocated() / GiB
        r["after_decode_GiB"] = torch.cuda.memory_allocated() / GiB
        r["census_after_decode"] = live_census(model)
        r["eager_step_kernels"], r["eager_step_n"], r["eager_step_us"] = kernel_counts(s.step)
        del s
        gc.collect()
        for B in (1, 64):
            prompt = torch.randint(0, vocab, (B, 512), device="cuda")
            g = DecodeSession(model, prompt, 40, graphed=True)
            for _ in range(3):
                g.step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                g.step()
            torch.cuda.synchronize()
            r[f"graphed_B{B}_ms"] = (time.perf_counter() - t0) / 20 * 1e3
            r[f"graphed_B{B}_kernels"], r[f"graphed_B{B}_n"], r[f"graphed_B{B}_us"] = kernel_counts(g.step)
            del g
            gc.collect()
        print(variant, {k: v for k, v in r.items() if not isinstance(v, list)}, flush=True)
        result[variant] = r
        del model
        gc.collect()
    json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
