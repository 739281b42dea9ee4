"""The decode kernels' walk with the next block of state rows loaded ahead (``PREFETCH``), issue #14: alone with their
state hot in L2 (as ``tools/sweep_kernels.py state_decode`` times them) and streamed from device memory (24 pools,
one a layer, as in a model's step), then (GLA) inside the graphed B = 64 step of the random 1.37B GLA.

    python3 tools/probe_decode_prefetch.py OUT.json [--kernel gla|delta|ssd] [--variant gla_int8_all] [--rounds 3]
        [--launches 16x1 8x1 8x1p] [--skip-step]

A launch ``BKxW`` is BLOCK_K rows a block and W warps a program; a trailing ``p`` prefetches. Each launch replaces the
tables' for the kernel's int8 state at B = 64 on this GPU (``STEP_DECODE_LAUNCH`` / ``DECODE_PREFETCH``); launches
alternate in rounds, so drift of the GPU's clock spreads over all of them. Shapes: ``tools/sweep_kernels.py``'s (GLA
16 heads of 64 x 128, the delta rule 32 value heads of 128 x 128, SSD 64 heads of 128 x 64).
"""
import argparse
import contextlib
import json

import torch

from laquant.kernels.common import state_io


def parse_launch(text: str) -> tuple[int, int, bool]:
    prefetch = text.endswith("p")
    bk, w = text.removesuffix("p").split("x")
    return int(bk), int(w), prefetch


@contextlib.contextmanager
def tabled(kernel: str, launch, gpu: str | None = None):
    """``kernel``'s int8 decode launch at B = 64 (its bucket of the most programs) made ``launch``
    ``(block_k, num_warps, prefetch)`` on the GPU named ``gpu`` (default: this process's)."""
    key = (kernel, "int8_row", None)
    bk, w, prefetch = launch
    if prefetch and kernel not in state_io.PREFETCHING_KERNELS:
        raise SystemExit(f"{kernel}'s decode kernel has no prefetching walk (those that do: "
                         f"{', '.join(state_io.PREFETCHING_KERNELS)}); drop the 'p'")
    saved_step = {g: dict(e) for g, e in state_io.STEP_DECODE_LAUNCH.items()}
    saved_pf = set(state_io.DECODE_PREFETCH)
    gpu = gpu or torch.cuda.get_device_name()
    state_io.STEP_DECODE_LAUNCH[state_io.own_step_overlay(gpu)[0]][key] = (bk, w)
    state_io.DECODE_PREFETCH.discard(key)
    if prefetch:
        state_io.DECODE_PREFETCH.add(key)
    try:
        yield
    finally:
        state_io.STEP_DECODE_LAUNCH.clear()
        state_io.STEP_DECODE_LAUNCH.update(saved_step)
        state_io.DECODE_PREFETCH.clear()
        state_io.DECODE_PREFETCH.update(saved_pf)


def kernel_alone_us(kernel: str, launch, pools: int, B=64, layers=24, reps=20) -> float:
    """Microseconds a launch of ``kernel``'s int8 (stochastic) decode step at B sequences, in a CUDA graph of
    ``layers`` launches, each on pool ``i % pools`` (1: the state stays in L2; 24: streamed from device memory)."""
    from sweep_kernels import STATE_SHAPES, _decode_step

    from laquant.quant import StateQuantizer

    Hk, H, K, V = STATE_SHAPES[kernel]
    step = _decode_step(kernel, B, Hk, H, K, V)
    quant = StateQuantizer("int8_row", rounding="stochastic")
    gen = torch.Generator(device="cuda").manual_seed(0)
    states = []
    for _ in range(pools):
        data, scale = StateQuantizer("int8_row").store(torch.randn(B, H, K, V, device="cuda", generator=gen) * 0.1)
        states.append((data, scale.squeeze(-1).contiguous()))
    bk, w, _ = launch

    def run():
        for i in range(layers):
            step(*states[i % pools], quant, bk, w)

    with tabled(kernel, launch):
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
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
    p.add_argument("--kernel", default="gla", choices=["gla", "delta", "ssd"])
    p.add_argument("--variant", default="gla_int8_all")
    p.add_argument("--launches", nargs="+", default=["16x1", "8x1", "8x1p", "16x1p"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--skip-step", action="store_true", help="the kernel alone only (always so but for GLA)")
    args = p.parse_args()
    launches = {name: parse_launch(name) for name in args.launches}
    alone = {name: {} for name in launches}
    for _ in range(args.rounds):
        for name, launch in launches.items():
            for pools in (1, 24):
                alone[name].setdefault(f"pools_{pools}", []).append(round(kernel_alone_us(args.kernel, launch, pools,
                                                                                          args.batch), 3))
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernel": args.kernel,
              "batch": args.batch, "kernel_alone_us": alone}
    print(json.dumps(result, indent=1), flush=True)
    if args.kernel == "gla" and not args.skip_step:
        from profile_prefill import random_gla
        from step_ablation import replay_us

        from laquant.models import GLAConfig

        cfg = GLAConfig(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000)
        model = random_gla(cfg, args.variant)
        ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device="cuda")
        step = {name: [] for name in launches}
        for _ in range(args.rounds):
            for name, launch in launches.items():
                with tabled("gla", launch):
                    step[name].append(round(replay_us(model, ids), 1))
        result.update(variant=args.variant, prompt=args.prompt, step_us=step,
                      step_median_us={k: sorted(v)[len(v) // 2] for k, v in step.items()})
    print(json.dumps(result, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
