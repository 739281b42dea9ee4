"""The eager prefill's host time, as bars: ``tools/diag_prefill_timing.py``'s JSON (each configuration with the
piece bounds kept and made at every call) and, optionally, ``tools/profile_prefill.py``'s JSONs of this tree and the
checkout before (``--pairs NEW.json BASE.json ...``: their synced wall clock and GPU time).

    python tools/plot_prefill_host.py TIMING.json OUT.png [--pairs NEW.json BASE.json ...]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timing")
    ap.add_argument("out")
    ap.add_argument("--pairs", nargs="*", default=[])
    a = ap.parse_args()
    timing = json.load(open(a.timing))
    configs = sorted({k.rsplit(" bounds ", 1)[0] for k in timing if " bounds " in k})
    panels = 2 if a.pairs else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.5), squeeze=False)
    ax = axes[0][0]
    x = range(len(configs))
    for i, (bounds, color) in enumerate((("every call", "#bbbbbb"), ("kept", "#3b7dd8"))):
        ax.bar([j + (i - 0.5) * 0.4 for j in x], [timing[f"{c} bounds {bounds}"]["host_ms"] for c in configs], 0.4,
               label=f"piece bounds {bounds}", color=color)
    ax.set_xticks(list(x), [c.replace(" use_cache=", " cache=").replace(" ", "\n") for c in configs], fontsize=7)
    ax.set_ylabel("host ms per 4K prefill (median of 15)")
    ax.set_title(f"{timing['device']}: host time of one eager prefill, one process")
    ax.legend(fontsize=8)
    if a.pairs:
        ax = axes[0][1]
        rows = []
        for n in range(0, len(a.pairs), 2):
            new, base = json.load(open(a.pairs[n])), json.load(open(a.pairs[n + 1]))
            for variant in ("bf16", "gla_int8_all"):
                rows.append((f"{variant}\nrun {n // 2 + 1}", base[variant]["4096"]["wall_ms"],
                             new[variant]["4096"]["wall_ms"], new[variant]["4096"]["gpu_ms"]))
        x = range(len(rows))
        ax.bar([j - 0.3 for j in x], [r[1] for r in rows], 0.3, label="wall, before", color="#bbbbbb")
        ax.bar(list(x), [r[2] for r in rows], 0.3, label="wall, now", color="#3b7dd8")
        ax.bar([j + 0.3 for j in x], [r[3] for r in rows], 0.3, label="GPU time, now", color="#6bbf6b")
        ax.set_xticks(list(x), [r[0] for r in rows], fontsize=8)
        ax.set_ylabel("ms per 4K prefill (synced, median of 10)")
        ax.set_title("tools/profile_prefill.py: before / now")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
