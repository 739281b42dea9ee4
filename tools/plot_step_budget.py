"""The graphed B = 64 GLA step of bf16 and gla_int8_all, kernel class by kernel class, against the byte floors and the
2x target (eval/results/b64_step_budget.md): stacked timeline bars from tools/graph_timeline.py's JSON.

    python3 tools/plot_step_budget.py eval/results/output_norm_h200/run1/timeline_fused.json \
        eval/results/b64_step_budget.png

Every B = 64 variant of the JSON gets a bar (a recipe with ``+`` overrides, as graph_timeline names it, takes its
recipe's floor).
"""
import json
import sys

CLASSES = [("GEMMs (lm_head too)", ("_splitk_gemm_kernel", "nvjet", "cublasLt::splitKreduce")),
           ("state decode step", ("_gla_decode_kernel",)),
           ("norms, SwiGLU, gate", ("_rms_norm_kernel", "_rms_norm_group_kernel", "_swiglu_kernel",
                                    "_glu_group_kernel", "_low_rank_gate_kernel", "_gate_log_decay_kernel"))]
# byte floors at 4,249 GB/s (b64_step_budget.md): weights and lm_head, the state read and written
FLOORS = {"bf16": (612, 379), "gla_int8_all": (321, 98)}


def recipe_and_overrides(variant: str) -> list:
    """``gla_int8_all+projections.act_granularity=per_group_B64`` -> ``[gla_int8_all,
    projections.act_granularity=per_group]`` (graph_timeline's names)."""
    return variant.removesuffix("_B64").split("+")


def label(variant: str) -> str:
    """``gla_int8_all+projections.act_granularity=per_group_B64`` -> ``gla_int8_all\nact_granularity=per_group``."""
    name, *overrides = recipe_and_overrides(variant)
    return "\n".join([name] + [o.split(".", 1)[-1] for o in overrides])


def classify(rows: list) -> dict:
    out = {name: 0.0 for name, _ in CLASSES}
    out["other"] = 0.0
    for r in rows:
        name = next((n for n, prefixes in CLASSES if r["kernel"].startswith(prefixes)), None)
        if name is None and r["kernel"].startswith("void cublasLt"):
            name = "GEMMs (lm_head too)"
        out[name or "other"] += r["timeline_us"]
    return out


def main(src: str, dst: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(open(src).read())
    variants = [v for v in data if v.endswith("_B64")]
    fig, ax = plt.subplots(figsize=(3 + 2.5 * len(variants), 4.5))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#8c8c8c"]
    for x, variant in enumerate(variants):
        parts = classify(data[variant]["rows"])
        bottom = 0.0
        for (name, value), color in zip(parts.items(), colors):
            ax.bar(x, value, 0.5, bottom=bottom, color=color, label=name if x == 0 else None)
            bottom += value
        weights, state = FLOORS[recipe_and_overrides(variant)[0]]
        ax.bar(x + 0.4, weights + state, 0.2, color="white", edgecolor="black", hatch="//",
               label="byte floor" if x == 0 else None)
        ax.text(x, bottom + 20, f"{data[variant]['replay_us_per_step_noprof']:.0f} us replayed", ha="center")
    target = data["bf16_B64"]["replay_us_per_step_noprof"] / 2
    ax.axhline(target, color="red", linestyle="--", label=f"2x bf16 ({target:.0f} us)")
    ax.set_xticks([x + 0.1 for x in range(len(variants))], [label(v) for v in variants], fontsize=8)
    ax.set_ylabel("us of a graphed B = 64 decode step (timeline)")
    ax.set_title("1.37B GLA, H200: where the step goes")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
