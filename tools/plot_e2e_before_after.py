"""Graphed decode tokens/s before and after a change, per family, from e2e runs that timed the checkout before
(``e2e_FAMILY_base``) and after (``e2e_FAMILY``) in one job (laquant eval speed's speed.json): bf16 and the quantized
variant, at B = 1 and B = 64, each bar labelled with its tokens/s and the quantized one with its ratio to bf16.

    python3 tools/plot_e2e_before_after.py OUT.png RUN_DIR:FAMILY[:TITLE] ...
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rates(path: Path) -> dict:
    rows = json.loads((path / "speed.json").read_text())["e2e"]
    return {r["variant"]: {B: r[f"decode_B{B}_graphed_tok_per_s"] for B in (1, 64)} for r in rows}


def main(out: str, specs: list[str]) -> None:
    fig, axes = plt.subplots(2, len(specs), figsize=(5 * len(specs), 8), squeeze=False)
    for col, spec in enumerate(specs):
        run, family, *title = spec.split(":")
        before, after = rates(Path(run) / f"e2e_{family}_base"), rates(Path(run) / f"e2e_{family}")
        quantized = next(v for v in after if v != "bf16")
        for row, B in enumerate((64, 1)):
            ax = axes[row][col]
            bars = [(f"{v}\n{tag}", r[v][B], r["bf16"][B], color)
                    for v in ("bf16", quantized)
                    for tag, r, color in (("before", before, "#bbbbbb"),
                                          ("after", after, "#1f77b4" if v == "bf16" else "#d62728"))]
            ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[3] for b in bars])
            for i, (label, value, bf16, _) in enumerate(bars):
                note = f"{value:,.0f}" + ("" if label.startswith("bf16") else f"\n{value / bf16:.2f}x bf16")
                ax.text(i, value, note, ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
            ax.set_title(f"{title[0] if title else family}, B = {B}", fontsize=10)
            ax.set_ylabel("graphed decode tokens/s")
            ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
