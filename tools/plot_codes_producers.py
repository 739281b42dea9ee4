"""The codes producers before and after, as bars: ``tools/bench_codes_producers.py``'s JSON of this tree and of the
checkout before (microseconds, CUDA-graph medians), and optionally the GLA e2e's graphed decode of both
(``--e2e NEW_speed.json BASE_speed.json``: tokens/s of bf16 and the quantized variant).

    python tools/plot_codes_producers.py NEW.json BASE.json OUT.png [--e2e NEW_speed.json BASE_speed.json]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _e2e_rows(path):
    d = json.load(open(path))
    rows = d if isinstance(d, list) else d.get("e2e", [])
    return {r["variant"]: r for r in rows if isinstance(r, dict) and "decode_B64_graphed_tok_per_s" in r}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("new")
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--e2e", nargs=2, default=None)
    a = ap.parse_args()
    new, base = json.load(open(a.new)), json.load(open(a.base))
    rows = [(n, b) for n, b in zip(new["rows"], base["rows"]) if n["kernel"] == b["kernel"] and n["M"] == b["M"]]
    panels = 2 if a.e2e else 1
    fig, axes = plt.subplots(1, panels, figsize=(13 if a.e2e else 10, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1] if a.e2e else [1]})
    ax = axes[0][0]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [b["us"] for _, b in rows], 0.4, label="before (div_rn, one token a program)",
           color="#bbbbbb")
    ax.bar([i + 0.2 for i in x], [n["us"] for n, _ in rows], 0.4, label="now (stored_int8_codes; norms 2 tokens)",
           color="#3b7dd8")
    ax.set_yscale("log")
    ax.set_xticks(list(x), [f"{n['kernel']}\nM={n['M']} w={n['width']}\nout={n['n_out']}" for n, _ in rows],
                  fontsize=5.5, rotation=90)
    ax.set_ylabel("us per call (CUDA-graph median)")
    ax.set_title(f"{new.get('device', '')}: kernels writing W8A8 codes, bf16")
    ax.legend(fontsize=8)
    if a.e2e:
        ax = axes[0][1]
        after, before = _e2e_rows(a.e2e[0]), _e2e_rows(a.e2e[1])
        labels, vals, colors = [], [], []
        for tag, rows_ in (("before", before), ("now", after)):
            for variant, color in (("bf16", "#999999"), ("gla_int8_all", "#3b7dd8")):
                labels.append(f"{variant}\n{tag}")
                vals.append(rows_[variant]["decode_B64_graphed_tok_per_s"])
                colors.append(color if tag == "now" else "#cccccc")
        ax.bar(range(len(vals)), vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(vals)), labels, fontsize=7)
        ax.set_ylabel("tok/s, graphed decode, B = 64")
        ax.set_title("1.37B GLA, 4K prompt", fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=130)


if __name__ == "__main__":
    main()
