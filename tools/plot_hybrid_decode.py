"""The hybrids' graphed decode before and after the static steps' attention kernel (eval/results/hybrid_decode_h200/):
tokens/s at B = 64 for bf16 and hybrid_int8, the checkout before (``e2e_FAMILY_base``) and after (``e2e_FAMILY``) in
one job, read from the e2e runs' speed.json; and the attention kernel (the shipped loop) against the eager formula it
replaced (bench_decode_attention.json).

    python3 tools/plot_hybrid_decode.py RESULTS_DIR OUT.png
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAMILIES = ("zamba2", "qwen3_next")
RUN = "run3_decode_attention"  # the checkout before the kernel and after it, in one job


def rates(path: Path) -> dict:
    rows = json.loads((path / "speed.json").read_text())["e2e"]
    return {r["variant"]: (r["decode_B1_graphed_tok_per_s"], r["decode_B64_graphed_tok_per_s"]) for r in rows}


def main(results: str, out: str) -> None:
    root = Path(results)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, family in zip(axes, FAMILIES):
        before, after = rates(root / RUN / f"e2e_{family}_base"), rates(root / RUN / f"e2e_{family}")
        labels, values, colors = [], [], []
        for variant in ("bf16", "hybrid_int8"):
            for tag, r, color in (("before", before, "#bbbbbb"), ("kernel", after, "#1f77b4" if variant == "bf16"
                                                                   else "#d62728")):
                labels.append(f"{variant}\n{tag}")
                values.append(r[variant][1])
                colors.append(color)
        ax.bar(range(len(values)), values, color=colors)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(values)), labels, fontsize=8)
        ax.set(title=f"{family}: graphed decode, B = 64, 1K prompt", ylabel="tokens/s")
    bench = json.loads((root / "run4_pipelined" / "bench_decode_attention.json").read_text())["rows"]
    ax = axes[2]
    names = [f"{r['shape'].split(' ')[0]}\nB={r['B']} cap {r['capacity']}" for r in bench]
    x = range(len(bench))
    ax.bar([i - 0.2 for i in x], [r["eager_us"] for r in bench], 0.4, label="eager formula (before)", color="#bbbbbb")
    ax.bar([i + 0.2 for i in x], [r["kernel_us"] for r in bench], 0.4, label="decode attention kernel", color="#2ca02c")
    ax.set_xticks(list(x), names, fontsize=6, rotation=60)
    ax.set(yscale="log", ylabel="us per layer", title="one layer's attention, bf16, 1,031 positions written")
    ax.legend(fontsize=8)
    fig.suptitle("The hybrids' static decode attention as one Triton kernel (H200, 2026-11-29)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
