"""Which of transformers' ``generate`` decode steps replay a captured graph, and how fast, for a random hybrid of
tools/family_configs.py (bf16 and ``hybrid_int8``) at B = 1 and 64: issue #14's e2e suite timed a 1.43B MiniMax's
``generate`` at 1.9K tok/s at B = 64 against 9.6-11K for laquant's graphed loop, while a tiny MiniMax took graph
steps (eval/results/minimax_graphs_h200/). Counts the steps ``hybrid_graph_step`` replayed and those it left to
the eager forward, and times the loop from the first new token to the last. With PROFILE=1 also: the time each
replay call takes (synchronized before and after) against the whole step's, and torch.profiler's busiest host ops and
GPU kernels of the timed B = 64 call (OUT.json's folder, hf_generate_profile_*.txt).

    FAMILY=minimax PROMPT=1024 [PROFILE=1] python3 tools/diag_hf_generate_steps.py OUT.json     (GPU)
"""
import json
import os
import sys
import time

import torch
from family_configs import CONFIGS

import laquant.models.graphed_step as graphed_step
from laquant.eval.speed import recipe_variants


def main():
    family, prompt_len = os.environ.get("FAMILY", "minimax"), int(os.environ.get("PROMPT", "1024"))
    steps = int(os.environ.get("STEPS", "32"))
    profile = os.environ.get("PROFILE") == "1"
    counts = {"replayed": 0, "eager": 0}
    replay_s = []
    original = graphed_step.hybrid_graph_step

    def counted(model, args, kwargs):
        if profile:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = original(model, args, kwargs)
        if profile:
            torch.cuda.synchronize()
            replay_s.append(time.perf_counter() - t0)
        counts["replayed" if out is not None else "eager"] += 1
        return out

    graphed_step.hybrid_graph_step = counted  # the adapter imports it at call time
    rows = []
    for label, variant, make in recipe_variants([f"{family}:{json.dumps(CONFIGS[family])}"], "gla_int8_all"):
        model = make()
        for B in (1, 64):
            ids = torch.randint(0, model.config.vocab_size, (B, prompt_len), device="cuda")
            kw = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
                      attention_mask=torch.ones_like(ids))
            with torch.no_grad():
                model.generate(ids, **kw)  # captures
                counts.update(replayed=0, eager=0)
                replay_s.clear()
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(ids, **kw)
                torch.cuda.synchronize()
                seconds = time.perf_counter() - t
                if profile and B == 64:
                    _profiled(model, ids, kw, os.path.dirname(os.path.abspath(sys.argv[1])), f"{family}_{variant}")
            graphs = model.__dict__.get("_laquant_step_graphs", {})
            row = dict(model=label, variant=variant, B=B, prompt=prompt_len, steps=steps, **counts,
                       tok_per_s_incl_prefill=B * steps / seconds,
                       replay_call_ms_median=1e3 * sorted(replay_s)[len(replay_s) // 2] if replay_s else None,
                       replay_calls_ms_total=1e3 * sum(replay_s),
                       graphs=[type(g).__name__ if g else repr(g) for g in graphs.values()])
            print(json.dumps(row), flush=True)
            rows.append(row)
        del model
        torch.cuda.empty_cache()
    json.dump(rows, open(sys.argv[1], "w"), indent=1)


def _profiled(model, ids, kw, folder, tag):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.generate(ids, **kw)
        torch.cuda.synchronize()
    table = prof.key_averages()
    with open(os.path.join(folder, f"hf_generate_profile_{tag}.txt"), "w") as f:
        f.write(table.table(sort_by="self_cpu_time_total", row_limit=40))
        f.write("\n\n")
        f.write(table.table(sort_by="self_device_time_total", row_limit=25))


if __name__ == "__main__":
    main()
