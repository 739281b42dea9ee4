"""``laquant eval serve``'s report (the measurements are laquant.serving's): a markdown summary and a
PNG (TTFT per request with and without the prefix cache, snapshots per budget by state format)."""

from __future__ import annotations

from pathlib import Path


def _partings(first: list[dict] | None) -> str:
    """Where each conversation first parted and the logit gap there (later replies follow other histories)."""
    if first is None:
        return "the gap is not measured"
    return "first partings (request, reply token, the two tokens' logits apart over the largest): " + ", ".join(
        f"{p['request']} at {p['position']}: {p['gap']:.2%}" for p in first)


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def markdown(result: dict) -> str:
    lines = [f"# laquant eval serve ({result['device']}, {result['dtype']})", ""]
    for r in result["results"]:
        lines += [f"## {r['model']} (state format {', '.join(r['state_format'])})", ""]
        if "workload" in r:
            w, pool = r["workload"], r["pool"]
            lines += [f"Workload: system prompt {w['system']} tokens, {w['conversations']} conversations x "
                      f"{w['turns']} turns, {w['user']} user and {w['reply']} reply tokens per turn; snapshots every "
                      f"{r['block_size']} tokens, budget {r['budget_bytes'] / 2**20:.0f} MiB.", "",
                      "| | TTFT mean ms | TTFT median ms | decode tok/s | tok/s (TTFT + decode) |",
                      "|---|---|---|---|---|"]
            for key, name in (("no_cache", "no cache"), ("prefix_cache", "prefix cache"),
                              ("prefix_cache_graphed", "prefix cache, short hits' prefill as a CUDA graph"),
                              ("speculative", "prefix cache + speculative decoding")):
                if key not in r:
                    continue
                s = r[key]
                dec = "-" if s["decode_tokens_per_s"] is None else f"{s['decode_tokens_per_s']:.1f}"
                lines.append(f"| {name} | {_ms(s['ttft_mean_s'])} | {_ms(s['ttft_median_s'])} | {dec} | "
                             f"{s['tokens_per_s']:.1f} |")
            if "speculation" in r:
                sp = r["speculation"]
                acc = "-" if sp["acceptance"] is None else f"{sp['acceptance']:.0%}"
                per = "-" if sp["tokens_per_round"] is None else f"{sp['tokens_per_round']:.2f}"
                same = "yes" if sp["replies_equal_greedy"] else (
                    f"no: requests {sp['requests_parted']} parted (expected only where two logits nearly tie: the "
                    "GEMMs of a verify and of a decode step round apart); " + _partings(sp.get("first_partings")))
                lines += ["", f"Speculative decoding: {sp['num_draft_tokens']} draft tokens a round, acceptance {acc}, "
                          f"{per} tokens a round, rounds graphed: {sp.get('round_graphed', False)}, draft graphed: "
                          f"{sp['draft_graphed']}; replies equal greedy: {same}."]
            speed = r["ttft_speedup_on_hits"]
            lines += ["", f"Hit rate: {pool['request_hit_rate']:.0%} of requests, {pool['token_hit_rate']:.0%} of prompt "
                      f"tokens restored; {pool['entries']} snapshots held ({pool['used_bytes'] / 2**20:.1f} MiB), "
                      f"{pool['evicted']} evicted. TTFT on hits: "
                      + ("-" if speed is None else f"{speed:.2f}x lower") + " than without the cache.", ""]
            f = r["follow_up"]
            lines += [f"Follow-up request ({f['system']}-token shared prefix + {f['user']} new tokens, median of "
                      f"{f['reps']}): full prefill {_ms(f['full_prefill_ttft_s'])} ms, resumed from {f['cached_tokens']} "
                      f"cached tokens {_ms(f['cached_ttft_s'])} ms: **{f['speedup']:.2f}x** lower TTFT"
                      + ("" if f.get("graphed_cached_ttft_s") is None else
                         f"; its prefill replayed as a CUDA graph {_ms(f['graphed_cached_ttft_s'])} ms: "
                         f"**{f['graphed_speedup']:.2f}x**")
                      + ("" if not f.get("graphed_failure") else
                         f"; its prefill could not be captured as a CUDA graph ({f['graphed_failure']})")
                      + ". A miss "
                      f"through the cache (a new prefix, its snapshots written): {_ms(f['cold_with_snapshots_ttft_s'])} ms.",
                      "",
                      "| snapshot format | bytes per snapshot | snapshots in budget | vs fp32 |", "|---|---|---|---|"]
            for m in r["memory"]:
                vs = "-" if m["vs_fp32"] is None else f"{m['vs_fp32']:.2f}x"
                lines.append(f"| {m['format']} | {m['snapshot_bytes']:,} | {m['snapshots_in_budget']:,} | {vs} |")
            lines.append("")
        if "accuracy" in r:
            a0 = r["accuracy"][0]
            lines += [f"Resuming from a snapshot after {a0['prefix']} tokens vs recomputing the prefix ("
                      f"{a0['windows']} windows, {a0['tokens']} scored tokens of {result['text']}):", "",
                      "| snapshot format | loss recomputed | loss resumed | change | mean per-token abs change "
                      "| max logit diff |", "|---|---|---|---|---|---|"]
            for a in r["accuracy"]:
                lines.append(f"| {a['state_format']} | {a['loss_recomputed']:.5f} | {a['loss_resumed']:.5f} | "
                             f"{100 * a['rel_loss_change']:+.4f}% | {100 * a['rel_token_loss_abs_change']:.4f}% | "
                             f"{a['max_logit_diff']:.3g} |")
            lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    """TTFT by request with and without the cache, and snapshots in the budget per format; False
    when there is no replay to plot."""
    rows = [r for r in result["results"] if "requests" in r]
    if not rows:
        return False
    from laquant.eval.plots import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.2 * len(rows)), squeeze=False)
    for (ax_t, ax_m), r in zip(axes, rows):
        for key, name in (("no_cache", "no cache"), ("prefix_cache", "prefix cache")):
            ax_t.plot([1e3 * q["ttft_s"] for q in r["requests"][key]], marker="o", ms=3, label=name)
        ax_t.set_yscale("log")
        ax_t.set_xlabel("request (turn by turn across conversations)")
        ax_t.set_ylabel("TTFT ms")
        ax_t.set_title(f"{r['model']}: time to first token", fontsize=9)
        ax_t.grid(alpha=0.3)
        ax_t.legend(fontsize=8)
        mem = r["memory"]
        ax_m.bar([m["format"] for m in mem], [m["snapshots_in_budget"] for m in mem], color="tab:green")
        ax_m.set_ylabel("snapshots in budget")
        ax_m.set_title(f"{r['budget_bytes'] / 2**20:.0f} MiB pool, one snapshot every {r['block_size']} tokens",
                       fontsize=9)
        ax_m.grid(alpha=0.3, axis="y")
    save_figure(fig, path)
    return True
