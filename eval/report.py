"""Text reports of a quantized model: the calibrate summary table, report.md, the inspect summary."""

from __future__ import annotations

import torch

from laquant.calibration.stats import Stats
from laquant.kernels.common.formats import get_format


def model_bytes(model, storage_dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the model as stored in a checkpoint (float weights in ``storage_dtype``)."""
    from laquant.checkpoint import storage_tensor

    return sum(s.numel() * s.element_size() for s in (storage_tensor(t, storage_dtype)
                                                       for t in model.state_dict().values()))


def state_bytes_per_sequence(mixers: dict, decisions: dict | None) -> int:
    """Recurrent-state bytes one sequence needs across all mixers, in the decided formats (fp32 if none)."""
    total = 0
    for name, info in mixers.items():
        fmt = (decisions or {}).get("state", {}).get(name, {}).get("format", "fp32")
        total += get_format(fmt).bytes_per_state(info["head_k"], info["head_v"], info["num_heads"])
    return total


def comparison_table(rows: list[tuple[str, dict]]) -> str:
    """Markdown table: one row per model, ``metrics`` with ppl per mode and byte counts."""
    modes = [m for m in ("prefill", "decode") if any(m in r for _, r in rows)]
    head = ["model", *[f"ppl {m}" for m in modes], "model bytes", "state bytes / sequence"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = rows[0][1]
    for name, r in rows:
        cells = [name]
        for m in modes:
            if m not in r:
                cells.append("-")
            elif r is base:
                cells.append(f"{r[m]:.3f}")
            else:
                cells.append(f"{r[m]:.3f} ({100 * (r[m] / base[m] - 1):+.2f}%)")
        cells += [f"{r['model_bytes'] / 2**20:.2f} MiB", f"{r['state_bytes'] / 2**10:.1f} KiB"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _outliers_over_limit(absmax, projections: dict | None) -> str:
    """For a projection in high precision with more outlier input channels than the recipe's limit (the plan
    keeps such layers): how many (a fact about the layer; a role the recipe keeps may be the reason too)."""
    if projections is None or projections.get("format") != "int8":
        return ""
    from laquant.quantize import select_outliers

    n_out = len(select_outliers(absmax, projections["outlier_threshold"], projections["outlier_top_k"]))
    limit = projections.get("outlier_max_fraction")
    if n_out == absmax.numel() or (limit is not None and n_out > limit * absmax.numel()):
        return f", {n_out} of {absmax.numel()} inputs are outliers"
    return ""


def layer_summary(stats: Stats, decisions: dict, projections: dict | None = None) -> str:
    """Markdown: per layer, what was quantized how, outliers, gate ranges and state ranges. ``projections``: the
    recipe's section, to say which layers its outlier limit kept in high precision."""
    out = ["| module | decision | input absmax | outlier channels kept bf16 |", "|---|---|---|---|"]
    for name in stats.modules("projections"):
        d = decisions["projections"].get(name)
        absmax = stats.get(name, "act_absmax")
        if d is None:
            decision = f"kept (bf16){_outliers_over_limit(absmax, projections)}"
        elif d["act_granularity"] == "none":
            decision = f"int8 weight-only w:{d['weight_granularity']}{_outliers_over_limit(absmax, projections)}"
        else:
            decision = f"int8 w:{d['weight_granularity']} a:{d['act_granularity']}"
        outliers = "-" if d is None else str(len(d["outliers"]))
        out.append(f"| {name} | {decision} | {absmax.max():.2f} | {outliers} |")
    out += ["", "| gate | decision | logit range | p0.1 .. p99.9 | min log-decay (slowest decay ... fastest) |",
            "|---|---|---|---|---|"]
    for name in stats.modules("gates"):
        d = decisions["gates"].get(name)
        decision = "kept (bf16)" if d is None else f"int8 scaling:{d['scaling']} clamp:{d['clamp']}"
        lo, hi = stats.get(name, "logit_min"), stats.get(name, "logit_max")
        p_lo, p_hi = stats.get(name, "logit_p001"), stats.get(name, "logit_p999")
        ld_lo, ld_hi = stats.get(name, "log_decay_min"), stats.get(name, "log_decay_max")
        out.append(f"| {name} | {decision} | {lo.min():.2f} .. {hi.max():.2f} | {p_lo.min():.2f} .. {p_hi.max():.2f} "
                   f"| {ld_hi.max():.2e} ... {ld_lo.min():.2e} |")
    out += ["", "| mixer | state format | state absmax (max over heads, rows) | median row absmax | growth (nats / 1K tok, max) |",
            "|---|---|---|---|---|"]
    for name in stats.modules("mixers"):
        d = decisions["state"].get(name, {"format": "fp32", "renorm_interval": "-"})
        absmax, growth = stats.get(name, "state_absmax"), stats.get(name, "state_growth")
        fmt = d["format"] + (f" (renorm {d['renorm_interval']})" if get_format(d["format"]).is_scaled else "")
        out.append(f"| {name} | {fmt} | {absmax.max():.2f} | {absmax.median():.3f} | {growth.max():+.3f} |")
    return "\n".join(out)


def report_markdown(recipe: dict, model_ref: str, calib: dict, table: str, stats: Stats, decisions: dict,
                    eval_note: str) -> str:
    n_out = sum(len(d["outliers"]) for d in decisions["projections"].values())
    n_kept = sum(1 for name in stats.modules("projections") if name not in decisions["projections"]
                 and _outliers_over_limit(stats.get(name, "act_absmax"), recipe["projections"]))
    limit = recipe["projections"].get("outlier_max_fraction")
    kept = (f"; projections in bf16 whose outlier inputs are "
            + (f"more than {limit:.0%} of all (the limit above which the plan keeps a layer whole)"
               if limit is not None else "all")
            + f": {n_kept}" if n_kept else "")
    return "\n".join([
        f"# laquant report: {recipe['name']}",
        "",
        f"- model: `{model_ref}`",
        f"- recipe: `{recipe['name']}` — {recipe['description']}",
        f"- calibration: {calib['samples']} sequences x {calib['seq_len']} tokens from `{calib['data']}`, seed {calib['seed']}",
        f"- projections quantized: {len(decisions['projections'])}, outlier input channels kept in bf16: {n_out}{kept}",
        f"- gates quantized: {len(decisions['gates'])}; state formats: "
        f"{sorted({d['format'] for d in decisions['state'].values()})}",
        *([f"- MoE experts modules with int8 weights (weight-only, per expert and output channel): "
           f"{len(decisions['experts'])}"] if decisions.get("experts") else []),
        "",
        "## Perplexity and size",
        "",
        eval_note,
        "",
        table,
        "",
        "## Per layer",
        "",
        layer_summary(stats, decisions, recipe["projections"]),
        "",
    ])
