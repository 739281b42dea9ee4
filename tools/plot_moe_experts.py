"""One MoE experts call by token count: laquant's int8 grouped kernels (run 1: the ~20-launch alignment and fixed
tiles; run 2: one-launch alignment) against transformers' bf16 ``grouped_mm`` and ``batched_mm`` and the int8 byte
floor, one panel per layer shape, from tools/bench_moe_experts.py's JSON (eval/results/moe_experts_h200/).

    python3 tools/plot_moe_experts.py eval/results/moe_experts_h200/moe_experts.json \
        eval/results/moe_experts_h200/run2/moe_experts.json eval/results/moe_experts_h200/moe_experts.png
"""
import json
import sys


def main(before: str, after: str, out: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {label: json.load(open(path))["rows"] for label, path in (("run 1", before), ("run 2", after))}
    shapes = list(dict.fromkeys(r["shape"] for r in runs["run 2"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = {label: [r for r in rs if r["shape"] == shape] for label, rs in runs.items()}
        T = [r["T"] for r in rows["run 2"]]
        series = [("int8, run 1 (~20-launch alignment)", rows["run 1"], "int8_grouped", "C0", ":"),
                  ("int8, run 2 (one-launch alignment)", rows["run 2"], "int8_grouped", "C0", "-"),
                  ("bf16 grouped_mm", rows["run 2"], "bf16_grouped_mm", "C1", "-"),
                  ("bf16 batched_mm", rows["run 2"], "bf16_batched_mm", "C2", "-")]
        for name, rs, key, color, style in series:
            points = [(r["T"], r["ms"][key] * 1e3) for r in rs if r["ms"].get(key)]
            ax.plot(*zip(*points), style, marker="o", color=color, label=name)
        ax.plot(T, [r["floor_ms_int8"] * 1e3 for r in rows["run 2"]], "--", color="gray", label="int8 byte floor")
        E, H, I, k = (rows["run 2"][0][n] for n in ("E", "H", "I", "k"))
        ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="us a call (CUDA graph)",
               title=f"{shape}\n{E} experts, {H} -> {I}, top-{k}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("MoE experts: one call, H200 (tools/bench_moe_experts.py)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
