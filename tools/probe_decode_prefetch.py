"""The GLA decode kernel's walk with the next block of state rows loaded ahead (``PREFETCH``), issue #14: alone with
its state hot in L2 (as ``tools/sweep_kernels.py state_decode`` times it) and streamed from device memory (24 pools,
one a layer, as in the model's step), then inside the graphed B = 64 step of the random 1.37B GLA.

    python3 tools/probe_decode_prefetch.py OUT.json [--variant gla_int8_all] [--rounds 3] [--launches 16x1 8x1 8x1p]

A launch ``BKxW`` is BLOCK_K rows a block and W warps a program; a trailing ``p`` prefetches. In the step, each launch
replaces the table's for the int8 state at B = 64 (``STEP_DECODE_LAUNCH`` / ``DECODE_PREFETCH``); launches alternate
in rounds, so drift of the GPU's clock spreads over all of them.
"""
import argparse
import contextlib
import json

import torch

from step_ablation import replay_us

from laquant.kernels.common import state_io

KEY = ("gla", "int8_row", None)  # the int8 state's bucket of the most programs (B = 64: 1,024)


def parse_launch(text: str) -> tuple[int, int, bool]:
    prefetch = text.endswith("p")
    bk, w = text.removesuffix("p").split("x")
    return int(bk), int(w), prefetch


@contextlib.contextmanager
def tabled(launch):
    """The step's GLA int8 decode launch at B = 64 made ``launch`` ``(block_k, num_warps, prefetch)``."""
    saved_step, saved_pf = dict(state_io.STEP_DECODE_LAUNCH), set(state_io.DECODE_PREFETCH)
    bk, w, prefetch = launch
    state_io.STEP_DECODE_LAUNCH[KEY] = (bk, w)
    state_io.DECODE_PREFETCH.discard(KEY)
    if prefetch:
        state_io.DECODE_PREFETCH.add(KEY)
    try:
        yield
    finally:
        state_io.STEP_DECODE_LAUNCH.clear()
        state_io.STEP_DECODE_LAUNCH.update(saved_step)
        state_io.DECODE_PREFETCH.clear()
        state_io.DECODE_PREFETCH.update(saved_pf)


def kernel_alone_us(launch, pools: int, B=64, H=16, K=64, V=128, layers=24, reps=20) -> float:
    """Microseconds a launch of the GLA int8 (stochastic) decode step at B sequences, in a CUDA graph of ``layers``
    launches, each on pool ``i % pools`` (1: the state stays in L2; 24: 200 MB, streamed from device memory)."""
    from laquant.kernels.gla.decode import gla_decode_step
    from laquant.quant import StateQuantizer

    bk, w, prefetch = launch
    quant = StateQuantizer("int8_row", rounding="stochastic")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k = (torch.randn(B, H, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, H, V, device="cuda", generator=gen).bfloat16()
    g = (torch.nn.functional.logsigmoid(torch.randn(B, H, K, device="cuda", generator=gen)) / 4).bfloat16()
    states = []
    for _ in range(pools):
        data, scale = StateQuantizer("int8_row").store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
        states.append((data, scale.squeeze(-1).contiguous()))
    idx = torch.arange(B, dtype=torch.int32, device="cuda")
    n_stores = torch.zeros(B, dtype=torch.int32, device="cuda")
    out = torch.empty(B, H, V, dtype=torch.bfloat16, device="cuda")

    def step():
        for i in range(layers):
            data, scale = states[i % pools]
            gla_decode_step(q, k, v, g, data, scale, idx, quant, n_stores, block_k=bk, num_warps=w, out=out,
                            prefetch=prefetch)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / layers


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--variant", default="gla_int8_all")
    p.add_argument("--launches", nargs="+", default=["16x1", "8x1", "8x1p", "16x1p"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--skip-step", action="store_true")
    args = p.parse_args()
    launches = {name: parse_launch(name) for name in args.launches}
    alone = {name: {} for name in launches}
    for _ in range(args.rounds):
        for name, launch in launches.items():
            for pools in (1, 24):
                alone[name].setdefault(f"pools_{pools}", []).append(round(kernel_alone_us(launch, pools), 3))
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch,
              "kernel_alone_us": alone}
    print(json.dumps(result, indent=1), flush=True)
    if not args.skip_step:
        from profile_prefill import random_gla

        from laquant.models import GLAConfig

        cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
        model = random_gla(cfg, args.variant)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device="cuda")
        step = {name: [] for name in launches}
        for _ in range(args.rounds):
            for name, launch in launches.items():
                with tabled(launch):
                    step[name].append(round(replay_us(model, ids), 1))
        result.update(variant=args.variant, prompt=args.prompt, step_us=step,
                      step_median_us={k: sorted(v)[len(v) // 2] for k, v in step.items()})
    print(json.dumps(result, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
