"""The verify step's cost over one decode step by state format, with numerics "decode" and "prefill" (issue #19's
target: <= 1.5 at K = 4-8, B = 64), from a tools/bench_verify.py run's verify.json:

    python tools/plot_verify_numerics.py \
        eval/results/verify_numerics_h200/run2_prefill_sweep/verify_bench/verify.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, out: str) -> None:
    rows = json.load(open(src))["kernels"]
    families = sorted({r["family"] for r in rows}, key=["gla", "delta"].index)
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    for ax, family in zip(axes[0], families):
        mine = [r for r in rows if r["family"] == family and r.get("verify_prefill_over_decode")]
        labels = [f"{r['format'].partition(':')[0]}\nK={r['K_tokens']}" for r in mine]
        x = range(len(mine))
        ax.bar([i - 0.2 for i in x], [r["verify_over_decode"] for r in mine], 0.4, label='numerics "decode"')
        ax.bar([i + 0.2 for i in x], [r["verify_prefill_over_decode"] for r in mine], 0.4, label='numerics "prefill"')
        ax.axhline(1.5, color="k", ls="--", lw=1, label="target 1.5")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("verify step / one decode step")
        ax.set_title(f"{family}, B = {mine[0]['B']}, {mine[0]['H']} heads of {mine[0]['dim']}x{mine[0]['dim']}")
        ax.legend(fontsize=8)
    fig.suptitle("Speculative verify step over one decode step (H200)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
