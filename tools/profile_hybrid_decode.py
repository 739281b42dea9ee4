"""Where an eager decode step of a transformers hybrid goes (issue #16's 64K hybrid runs decoded at
10-16 tokens/s on an H200; issue #14's hybrid target): for a random qwen3_next of the shipped
small hybrid's config (``eval/results/long_context_qwen3next-small_cpu/qwen3next-small_config.json``)
or of a given JSON config, bf16 and ``hybrid_int8``, on CUDA:

- ms per eager step at B = 1 after a 512-token prompt: the plain loop, and the loop of
  ``laquant eval ppl --mode decode`` (saturation hooks and counters, the loss copied to the host);
  and ms per step of laquant.generate's CUDA-graphed loop (laquant.models.static_hybrid);
- kernels and GPU ms per step (torch.profiler) against the step's wall time, for an eager step and
  for one replay of the captured step (its top kernels by GPU time, ``laquant.eval.speed.summarize_kernels``);
- the Python functions that take the host time (cProfile, by own time);
- one prefill of the prompt at B = 1 as ``eval speed`` times it: wall ms, kernels and GPU ms.

    python tools/profile_hybrid_decode.py OUT.json [CONFIG_JSON]     # DEVICE=cpu: a smoke run
    BATCH=64 PROMPT=1024 python tools/profile_hybrid_decode.py OUT.json FIELDS_JSON  # other shapes; the fields
                                                       # over eval speed's defaults, as `--model qwen3_next:{...}`
    FAMILY=nemotron_h python tools/profile_hybrid_decode.py OUT.json   # another family, tools/family_configs.py's
    TOP=60 ...                                                         # more kernels in each top list

The replayed step's kernels are also listed in launch order (``graphed_sequence``): one layer's chain read off it.
"""
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from laquant.adapters import cache_kwargs, install, new_cache
from laquant.api import calibrate
from laquant.generate import DecodeSession
from laquant.eval.saturation import SaturationCounter
from laquant.eval.speed import short_kernel_name, summarize_kernels

DEVICE = os.environ.get("DEVICE", "cuda")
FAMILY = os.environ.get("FAMILY", "qwen3_next")
BATCH, PROMPT = int(os.environ.get("BATCH", 1)), int(os.environ.get("PROMPT", 512))
TOP = int(os.environ.get("TOP", 20))
SMALL = "eval/results/long_context_qwen3next-small_cpu/qwen3next-small_config.json"
DROP = ("architectures", "transformers_version", "dtype", "rope_parameters")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def steps(model, cache, ids, counter=None) -> None:
    for t in range(ids.shape[1]):
        logits = model(input_ids=ids[:, t:t + 1], **cache_kwargs(model, cache), use_cache=True).logits[:, 0]
        if counter is not None:
            counter.after_step(cache)
            torch.nn.functional.cross_entropy(logits.float(), ids[:, t]).cpu()


def ms_per_step(model, prompt, ids, counter=None) -> float:
    cache = new_cache(model)
    model(input_ids=prompt, **cache_kwargs(model, cache), use_cache=True)
    if counter is not None:
        counter.start_sequence()
    steps(model, cache, ids[:, :5], counter)  # warm-up
    sync()
    t0 = time.perf_counter()
    steps(model, cache, ids[:, 5:], counter)
    sync()
    return (time.perf_counter() - t0) / (ids.shape[1] - 5) * 1e3


def cuda_kernels(prof) -> list[tuple[str, float, float]]:
    """The profiled CUDA kernels as ``(name, start_us, duration_us)``, in launch order."""
    return sorted(((e.name, e.time_range.start, e.time_range.end - e.time_range.start)
                   for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[1])


def top_kernels(prof) -> dict:
    """The profiled CUDA kernels summarized (``laquant.eval.speed.summarize_kernels``, no layer markers)."""
    return summarize_kernels(cuda_kernels(prof), 0, top=TOP)


def host_tottime(fn, lines: int) -> list[str]:
    """cProfile of ``fn()`` (synced), its ``lines`` functions with the most own time."""
    p = cProfile.Profile()
    p.enable()
    fn()
    sync()
    p.disable()
    text = io.StringIO()
    pstats.Stats(p, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue().splitlines()


def prefill_profile(model, prompt) -> dict:
    """A prefill as ``eval speed`` times it (one prompt, no cache, the last token's logits): wall ms,
    and its kernels and GPU ms (GPU ms well below wall ms: the host sets the pace)."""
    run = lambda: model(prompt, logits_to_keep=1)  # noqa: E731
    for _ in range(3):
        run()
    sync()
    t0 = time.perf_counter()
    for _ in range(5):
        run()
    sync()
    wall = (time.perf_counter() - t0) / 5 * 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync()
    kernels = top_kernels(prof)
    return {"prefill_tokens": prompt.shape[1], "prefill_wall_ms": wall,
            **{f"prefill_{k}": kernels[k] for k in ("kernels_per_step", "gpu_ms_per_step", "top_kernels")},
            "prefill_host_tottime": host_tottime(run, 20)}


@torch.no_grad()
def main(out_path: str, config_path: str | None = None) -> None:
    if FAMILY == "qwen3_next" and config_path is None:
        config_path = SMALL
        cfg = {k: v for k, v in json.load(open(config_path)).items() if k not in DROP}
        build = lambda: Qwen3NextForCausalLM(Qwen3NextConfig(**cfg))  # noqa: E731
    else:
        from laquant.eval.speed import hybrid_model, hybrid_config
        from family_configs import CONFIGS

        fields = json.load(open(config_path)) if config_path else CONFIGS[FAMILY]
        build = lambda: hybrid_model(FAMILY, hybrid_config(FAMILY, fields))  # noqa: E731
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch": torch.__version__,
              "family": FAMILY, "config": config_path or "tools/family_configs.py", "batch": BATCH,
              "prompt": PROMPT}
    for variant in ("bf16", "hybrid_int8"):
        torch.manual_seed(0)
        dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
        model = build().to(DEVICE, dtype).eval()
        install(model)
        vocab = model.config.vocab_size
        if variant != "bf16":
            model = calibrate(model, variant, data=torch.randint(0, vocab, (4, 512), device=DEVICE),
                              progress=False).model
        prompt = torch.randint(0, vocab, (BATCH, PROMPT), device=DEVICE)
        ids = torch.randint(0, vocab, (BATCH, 45), device=DEVICE)
        row = {"plain_ms_per_step": ms_per_step(model, prompt, ids)}
        if DEVICE == "cuda":
            row.update(prefill_profile(model, prompt[:1]))
        if DEVICE == "cuda":
            session = DecodeSession(model, prompt, 45, graphed=True)
            for _ in range(4):
                session.step()
            sync()
            t0 = time.perf_counter()
            for _ in range(40):
                session.step()
            sync()
            row["graphed_ms_per_step"] = (time.perf_counter() - t0) / 40 * 1e3
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                session.graph.graph.replay()
                sync()
            replay = top_kernels(prof)
            row.update({f"graphed_{k}": replay[k] for k in ("kernels_per_step", "gpu_ms_per_step", "top_kernels")})
            row["graphed_sequence"] = [[short_kernel_name(n), round(d, 2)] for n, _, d in cuda_kernels(prof)]
        counter = SaturationCounter(model, 64)
        row["eval_loop_ms_per_step"] = ms_per_step(model, prompt, ids, counter)
        counter.close()
        cache = new_cache(model)
        model(input_ids=prompt, **cache_kwargs(model, cache), use_cache=True)
        steps(model, cache, ids[:, :3])
        with profile(activities=[ProfilerActivity.CUDA if DEVICE == "cuda" else ProfilerActivity.CPU]) as prof:
            steps(model, cache, ids[:, 3:13])
            sync()
        cuda = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        row["kernels_per_step"] = len(cuda) / 10
        row["gpu_ms_per_step"] = sum(e.device_time for e in cuda) / 1e3 / 10
        row["host_tottime_20_steps"] = host_tottime(lambda m=model: steps(m, cache, ids[:, 13:33]), 25)
        result[variant] = row
        print(variant, {k: v for k, v in row.items()
                        if not k.startswith(("host", "graphed_top", "graphed_seq", "prefill_top", "prefill_host"))},
              flush=True)
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
