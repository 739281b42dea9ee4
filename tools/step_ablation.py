"""What a graphed B = 64 decode step of the random 1.37B GLA would take without one of its parts (issue #14): an
upper bound on what fusing that part away can save. Each ablation patches the model before the step is captured;
the numbers it decodes are wrong by construction, only the time counts. Variants alternate in rounds, so drift of
the GPU's clock spreads over all of them.

    python3 tools/step_ablation.py OUT.json [--variant gla_int8_all] [--ablations none,no_gate,in_order] [--rounds 3]

Ablations: ``none``; ``no_gate``: the low-rank gate's kernel gone (its warm-up output, kept, in its place);
``in_order``: the gate on the main stream after the norm instead of on the side stream (``LAQUANT_SIDE_STREAM=0``);
``skip:KERNEL[+KERNEL...]``: the captured step without any launch of the Triton kernels named so (their outputs left
unwritten): what they add to the step's critical path, the overlap that PDL and the side stream give included.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch

from profile_prefill import random_gla

from laquant.generate import DecodeSession, release_graphs
from laquant.kernels.common import launch
from laquant.models import GLAConfig
from laquant.models.gla import GatedLinearAttention


@contextlib.contextmanager
def ablated(name: str):
    saved_env, saved_decay = os.environ.get("LAQUANT_SIDE_STREAM"), GatedLinearAttention.log_decay
    constants = {}

    def constant_decay(self, x):
        key = (id(self), tuple(x.shape))
        if key not in constants:  # the warm-up before capture makes it, so the graph holds no gate kernel
            constants[key] = saved_decay(self, x).clone()
        return constants[key]

    try:
        if name == "no_gate":
            GatedLinearAttention.log_decay = constant_decay
        elif name.startswith("skip:"):
            skipped = set(name[5:].split("+"))
            _patch_launches(lambda kernel: kernel.__name__ in skipped and torch.cuda.is_current_stream_capturing())
        elif name == "in_order":
            os.environ["LAQUANT_SIDE_STREAM"] = "0"
        elif name != "none":
            raise SystemExit(f"unknown ablation {name!r}: none, no_gate, in_order, skip:KERNEL")
        yield
    finally:
        GatedLinearAttention.log_decay = saved_decay
        _patch_launches(None)
        if saved_env is None:
            os.environ.pop("LAQUANT_SIDE_STREAM", None)
        else:
            os.environ["LAQUANT_SIDE_STREAM"] = saved_env


def _patch_launches(skip) -> None:
    """Every module's ``launch_kernel`` skipping the launches ``skip(kernel)`` names (``None``: the original back)."""
    original = _ORIGINAL_LAUNCH

    def launch_unless_skipped(kernel, grid, *args, **kwargs):
        return None if skip(kernel) else original(kernel, grid, *args, **kwargs)

    launches = {original, _patch_launches.current} - {None}
    for name, module in list(sys.modules.items()):
        if name.startswith("laquant") and getattr(module, "launch_kernel", None) in launches:
            module.launch_kernel = original if skip is None else launch_unless_skipped
    _patch_launches.current = None if skip is None else launch_unless_skipped


_patch_launches.current = None
_ORIGINAL_LAUNCH = launch.launch_kernel


def replay_us(model, ids, steps: int = 40) -> float:
    """Microseconds a replay of ``model``'s graphed decode step on ``ids``, captured afresh (the model keeps its
    captured steps), after 3 untimed steps."""
    release_graphs(model)
    session = DecodeSession(model, ids, 3 + steps + 1, graphed=True)
    for _ in range(3):
        session.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        session.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--variant", default="gla_int8_all")
    p.add_argument("--ablations", default="none,no_gate,in_order")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    cfg = GLAConfig(hidden_size=2048, num_hidden_layers=args.layers, num_heads=16, vocab_size=32000)
    model = random_gla(cfg, args.variant)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device="cuda")
    times = {name: [] for name in args.ablations.split(",")}
    for _ in range(args.rounds):
        for name in times:
            with ablated(name):  # each ablation captures its own step
                times[name].append(replay_us(model, ids))
            torch.cuda.empty_cache()
    result = {"variant": args.variant, "batch": args.batch, "prompt": args.prompt, "layers": args.layers,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "us_per_step": times, "median_us": {k: sorted(v)[len(v) // 2] for k, v in times.items()}}
    print(json.dumps(result, indent=1), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
