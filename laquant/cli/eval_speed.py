"""``laquant eval speed``: kernel and end-to-end benchmarks (laquant.eval.speed) on the CUDA device."""

from __future__ import annotations

import argparse
from pathlib import Path

from laquant.errors import LaquantError
from laquant.paths import resolve_model_dir

# laquant.eval.speed.SUITES, named here so the parser needs no torch (tests/test_cli.py keeps them equal)
SPEED_SUITES = ["decode", "prefill", "delta_decode", "delta_prefill", "kda_decode", "kda_prefill", "gemm", "e2e"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="e2e: a folder written by `laquant calibrate` (timed as saved; default: "
                        "quantize --model with --recipe here)")
    p.add_argument("--baseline", default=None, help="e2e: the unquantized model to compare the checkpoint with")
    p.add_argument("--suite", nargs="+", choices=SPEED_SUITES,
                   help="what to measure (default: all)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64], help="e2e decode batch sizes")
    p.add_argument("--prompt", type=int, default=4096, help="e2e prompt length in tokens")
    p.add_argument("--gen", type=int, default=32, help="e2e decode steps timed")
    p.add_argument("--model", nargs="+", default=["gla-small"],
                   help="models for the e2e suite: directories, HF ids, gla-small, 'config:{json}' for a random "
                        "laquant GLA of that GLAConfig (e.g. 'config:{\"hidden_size\": 2048, \"num_hidden_layers\": 24, "
                        "\"num_heads\": 4, \"vocab_size\": 32000}'), or 'FAMILY:{json}' for a random "
                        "transformers hybrid of a supported family with laquant's mixers: 'qwen3_next:{json}' "
                        "overrides fields of a ~1024x8 MoE config (QWEN3_NEXT_DEFAULTS in laquant/eval/speed.py; "
                        "'qwen3_next:{}' takes it as is), another family's JSON those of transformers' default "
                        "config (e.g. 'qwen3_5_text:{...}', 'kimi_linear:{...}', 'nemotron_h:{...}'). "
                        "Random models measure speed only")
    p.add_argument("--recipe", default="gla_int8", help="recipe for the quantized e2e GLA model (default: gla_int8)")
    p.add_argument("--hybrid-recipe", default="hybrid_int8",
                   help="recipe for the quantized e2e FAMILY:{json} hybrids (default: hybrid_int8)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="e2e: override a field of --recipe and --hybrid-recipe, e.g. "
                        "--set projections.outlier_fallback=weight_only, or --set keep=embeddings,norms (lm_head "
                        "quantized too) (repeatable; named in the variant)")
    p.add_argument("--peers", action="store_true",
                   help="e2e: also time, in the same process, fla's own GLAForCausalLM for each config:{json} "
                        "model (variant fla_bf16) and transformers' own model for each FAMILY:{json} hybrid "
                        "(variant transformers_bf16): same config, random weights, bf16, "
                        "their own kernels and caches, eager decode")
    p.add_argument("--profile", type=int, nargs=2, default=[64, 512], metavar=("BATCH", "PROMPT"),
                   help="e2e: torch.profiler over one eager decode step of BATCH sequences after a PROMPT-token "
                        "prompt per variant: kernels per step and per layer, GPU ms, top kernels (default: 64 512)")
    p.add_argument("--no-profile", action="store_true", help="e2e: skip the decode-step profile")
    p.add_argument("--out", default="speed-results", help="output folder (replaced atomically)")
    p.add_argument("--quick", action="store_true", help="a few shapes only (smoke test)")


def check_args(args: argparse.Namespace) -> None:
    """What can be checked before any GPU work: the e2e model specs, batch sizes, profile shape."""
    from laquant.eval.speed import _parse_spec, hybrid_config

    for model_id in args.model:
        kind, fields = _parse_spec(model_id)  # a config:/FAMILY: spec that is not a JSON object is an error here
        if kind not in ("gla", "load"):
            hybrid_config(kind, fields)  # and a FAMILY: spec whose fields its config refuses
    if any(b < 1 for b in args.batch) or args.prompt < 1 or args.gen < 1:
        raise LaquantError("--batch, --prompt and --gen must be positive")
    if any(n < 1 for n in args.profile):
        raise LaquantError(f"--profile BATCH PROMPT must be positive, got {args.profile}")
    if args.overrides:
        if args.checkpoint is not None:
            raise LaquantError("--set overrides the recipe the e2e suite quantizes with; a checkpoint is timed as saved")
        from laquant.recipe import load_recipe

        for name in (args.recipe, args.hybrid_recipe):
            load_recipe(name, args.overrides)  # a bad field is named before any GPU work
    if args.peers and args.checkpoint is not None:
        raise LaquantError("--peers pairs config:/FAMILY: models with fla's and transformers' own models; "
                           "it does not apply to a checkpoint")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    from laquant.eval.speed import SUITES, markdown, run_speed

    suites = args.suite or list(SUITES)
    if args.checkpoint is not None:
        resolve_model_dir(args.checkpoint)  # a missing folder is named before any GPU work
    result = run_speed(Path(args.out), suites, models=args.model, recipe=args.recipe, quick=args.quick,
                       checkpoint=args.checkpoint, baseline=args.baseline, batches=args.batch,
                       prompt_len=args.prompt, steps=args.gen, peers=args.peers, hybrid_recipe=args.hybrid_recipe,
                       profile=None if args.no_profile else tuple(args.profile), overrides=args.overrides)
    print(markdown(result))
    print(f"\nwrote {args.out}/speed.json, speed.md" + (", speed.png" if set(suites) - {"gemm", "e2e"} else "")
          + (", speed_e2e.png" if "e2e" in suites else ""))
    return 0
