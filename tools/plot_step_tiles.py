"""The in-step sweeps of tools/sweep_step_tiles.py as one figure: for each sweep (a column) and each GEMM shape or
decode launch it swept (a row of points), every option's graphed step time relative to the table's own (the first
option), the option kept marked.

    python3 tools/plot_step_tiles.py OUT.png SWEEP.json ...
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def groups(result: dict) -> list:
    """[(label, [relative step time of each option], index kept or None)] in the sweep's order."""
    out, seen = [], {}
    for t in result["timings"]:
        if "option" in t:
            seen.setdefault(t["what"], []).append(t)
    for what, rows in seen.items():
        base = rows[0]["step_us"]
        rel = [r["step_us"] / base if r["step_us"] else float("nan") for r in rows]
        confirm = next((t for t in result["timings"] if t["what"] == what and "confirm" in t), None)
        kept = None
        if confirm:
            means = [sum(v) / len(v) for v in confirm["step_us"]]
            best = min(range(len(means)), key=means.__getitem__)
            if best and means[best] <= means[0] * 0.99:
                kept = next(i for i, r in enumerate(rows) if r["option"] == confirm["confirm"][best])
        out.append((what, rel, kept))
    return out


def main(out: str, paths: list[str]) -> None:
    results = [json.load(open(p)) for p in paths]
    rows = max(len(groups(r)) for r in results)
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 0.45 * rows + 2), squeeze=False)
    for ax, result in zip(axes[0], results):
        gs = groups(result)
        for y, (what, rel, kept) in enumerate(gs):
            ax.scatter(rel, [y] * len(rel), s=14, color="tab:gray")
            ax.scatter([rel[0]], [y], s=30, color="tab:blue", label="table's" if y == 0 else None)
            if kept is not None:
                ax.scatter([rel[kept]], [y], s=60, marker="*", color="tab:red", label="kept" if kept else None)
        ax.set_yticks(range(len(gs)), [g[0].split(" (")[0] for g in gs], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="k", lw=0.5)
        ax.set_xlim(0.9, 1.25)
        ax.set_xlabel("graphed decode step / with the table's launch")
        ax.set_title(f"{result['model']} {result['recipe']} B = {result['batch']}", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        if labels:
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Launches swept inside the graphed decode step ({results[0]['device']})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
