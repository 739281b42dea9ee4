"""The kernels of a Mamba-2 model's prefill by GPU time (a random 1.37B of tools/family_configs.py, bf16, one
1,024-token prompt), with its wall clock and the host ops that take the most CPU time.

    python3 tools/profile_mamba2_prefill.py OUT.json
"""
import json
import subprocess
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from laquant.eval.speed import _model_maker


def top(events, device_type, time_of, n):
    by_name = {}
    for e in events:
        if e.device_type == device_type:
            calls, total = by_name.get(e.name[:90], (0, 0.0))
            by_name[e.name[:90]] = (calls + 1, total + time_of(e))
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:n]
    return [(name, calls, round(total / 1e3, 3)) for name, (calls, total) in rows], by_name


@torch.no_grad()
def main(out_path: str, T: int = 1024) -> None:
    fields = json.loads(subprocess.check_output([sys.executable, "tools/family_configs.py", "mamba2"]).decode())
    label, make = _model_maker("mamba2:" + json.dumps(fields))
    model = make()
    ids = torch.randint(0, 1000, (1, T), device="cuda")
    prefill = lambda: model(ids, logits_to_keep=1)  # noqa: E731
    for _ in range(2):
        prefill()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prefill()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        prefill()
        torch.cuda.synchronize()
    events = prof.events()
    kernels, by_kernel = top(events, torch.autograd.DeviceType.CUDA, lambda e: e.device_time, 15)
    host, _ = top(events, torch.autograd.DeviceType.CPU, lambda e: e.self_cpu_time_total, 12)
    result = {"model": label, "T": T, "wall_ms": wall, "gpu_ms": sum(t for _, t in by_kernel.values()) / 1e3,
              "top": kernels, "cpu": host}
    print(json.dumps(result, indent=0), flush=True)
    with open(out_path, "w") as f:
        json.dump({str(T): result}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
