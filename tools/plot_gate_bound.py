"""Bars of eval/results/fused_gate_h200/: graphed decode tokens/s of gla_int8_all by gate configuration (the means
of the alternated repetitions), B = 64 and B = 1, from the bound run (run0) and the fused run (run1).

    python3 tools/plot_gate_bound.py eval/results/fused_gate_h200
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {"shipped": "gate kernel, side stream", "unfused": "gate kernel, side stream", "in_order": "gate kernel, in order",
         "no_gate": "no gate kernel (bound)", "fused": "fused (norm + decode kernel)"}


def means(path: str) -> dict:
    out: dict = {}
    for r in json.load(open(path))["rows"]:
        if r["variant"] == "gla_int8_all":
            out.setdefault((r["batch"], NAMES[r["config"]]), []).append(r["tok_per_s"])
    return {k: sum(v) / len(v) for k, v in out.items()}


def main(folder: str) -> None:
    runs = {"run0 (before)": means(os.path.join(folder, "run0_bound/gate_bound.json")),
            "run1 (fused build)": means(os.path.join(folder, "run1_fused/gate_fused.json"))}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, B in zip(axes, (64, 1)):
        labels, values, colors = [], [], []
        for i, (run, m) in enumerate(runs.items()):
            for (b, name), v in sorted(m.items()):
                if b == B:
                    labels.append(f"{name}\n{run}")
                    values.append(v)
                    colors.append(f"C{i}")
        ax.barh(range(len(values)), values, color=colors)
        ax.set(yticks=range(len(values)), yticklabels=labels, xlabel="tokens/s (graphed decode)",
               title=f"gla_int8_all, 1.37B GLA, B = {B}")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(values) * 1.18)
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "gate_configs.png"), dpi=120)


if __name__ == "__main__":
    main(sys.argv[1])
