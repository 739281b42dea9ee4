"""The verify step's cost over one decode step at the e2e models' state shapes (issue #19's target: <= 1.5 at
K = 4-8, B = 64): numerics "decode", "prefill" token by token (the checkout before) and "prefill" as one chunk, from
tools/exp_verify_chunk.py's JSON of both checkouts:

    python tools/plot_verify_chunk.py BEFORE.json AFTER.json OUT.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(before: str, after: str, out: str) -> None:
    old = {(r["kernel"], r["format"], r["tokens"]): r for r in json.load(open(before))}
    new = json.load(open(after))
    kernels = ["gla", "delta"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, kernel in zip(axes, kernels):
        rows = [r for r in new if r["kernel"] == kernel and (kernel, r["format"], r["tokens"]) in old]
        x = range(len(rows))
        shape = f"B={rows[0]['B']}, {rows[0]['H']} heads of {rows[0]['K']}x{rows[0]['V']}"
        bars = [("numerics \"decode\"", lambda r: r["verify_decode_us"] / r["decode_us"]),
                ("\"prefill\", token by token (before)",
                 lambda r: old[(kernel, r["format"], r["tokens"])]["verify_prefill_us"] /
                 old[(kernel, r["format"], r["tokens"])]["decode_us"]),
                ("\"prefill\", one chunk (now)", lambda r: r["verify_prefill_us"] / r["decode_us"])]
        for i, (label, ratio) in enumerate(bars):
            ax.bar([j + (i - 1) * 0.27 for j in x], [ratio(r) for r in rows], 0.27, label=label)
        ax.axhline(1.5, color="k", ls="--", lw=1, label="target 1.5")
        ax.set_xticks(list(x), [f"{r['format'].partition(':')[0]}\nK={r['tokens']}" for r in rows], fontsize=8)
        ax.set_yscale("log")
        ax.set_yticks([1, 1.5, 2, 3, 4, 6, 8, 12], ["1", "1.5", "2", "3", "4", "6", "8", "12"])
        ax.minorticks_off()
        ax.set_ylabel("verify time / one decode step")
        ax.set_title(f"{kernel} ({shape})", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Verify of K tokens at B = 64, H200 (tools/exp_verify_chunk.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:4])
