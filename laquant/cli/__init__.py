"""The ``laquant`` command line: calibrate, export, inspect, generate, eval ppl, eval speed, eval serve,
eval lm-eval.

One module per command, each with ``add_arguments(parser)`` and ``run(args) -> exit code``; this
module names the commands, builds the parser and turns a ``LaquantError`` into one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from laquant.cli import calibrate, eval_lm_eval, eval_ppl, eval_serve, eval_speed, export, generate, inspect
from laquant.cli.eval_speed import SPEED_SUITES
from laquant.errors import LaquantError

__all__ = ["SPEED_SUITES", "build_parser", "main"]


def _command(sub, module, name: str, **kwargs) -> None:
    parser = sub.add_parser(name, **kwargs)
    module.add_arguments(parser)
    parser.set_defaults(func=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laquant", description=(
        "Post-training quantization for linear-attention and hybrid language models."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _command(sub, calibrate, "calibrate", help="calibrate and quantize a model with a recipe, export a checkpoint",
             description="Collect activation, gate and state statistics, quantize by the recipe, "
                         "compare perplexity with the unquantized model, and write OUT/.")
    _command(sub, export, "export", help="rewrite a laquant checkpoint as compressed-tensors W8A8 (vLLM, transformers)",
             description="Write a laquant checkpoint of a transformers hybrid as a compressed-tensors W8A8 int8 "
                         "checkpoint with serving.md (what carried over, the engine's state dtype, perplexity).")
    _command(sub, inspect, "inspect", help="per-layer summary and plots of a laquant checkpoint")
    _command(sub, generate, "generate", help="generate text from a model or checkpoint (CUDA-graphed decode on a GPU)",
             description="Prefill the prompt, then decode token by token (one CUDA graph replay per step on a "
                         "GPU; eager on the CPU); prints the text and the decode rate.")

    p_eval = sub.add_parser("eval", help="evaluate a model: perplexity, speed, serving, lm-eval tasks")
    eval_sub = p_eval.add_subparsers(dest="eval_command", required=True, metavar="WHAT")
    _command(eval_sub, eval_ppl, "ppl", help="perplexity in prefill and/or decode mode", description=(
        "Perplexity with strided windows. prefill: each window through the chunked path; "
        "decode: token by token through the recurrent path, state carried each step."))
    _command(eval_sub, eval_speed, "speed",
             help="kernel and end-to-end speed against fla, SDPA, cuBLAS, bitsandbytes",
             description="Benchmarks on the CUDA device, each against its peer in the same run "
                         "(see laquant/eval/speed.py); writes OUT/speed.json, speed.md, speed.png.")
    _command(eval_sub, eval_serve, "serve",
             help="a multi-turn chat workload with and without the prefix state cache",
             description="Replay a shared system prompt and growing conversations (synthetic tokens) with and "
                         "without the prefix state cache (laquant.serving): time to first token, tokens/s, hit rate, "
                         "snapshot memory per state format, and the loss change of resuming from a snapshot; writes "
                         "OUT/serve.json, serve.md, serve.png.")
    _command(eval_sub, eval_lm_eval, "lm-eval", help="lm-evaluation-harness tasks on a laquant checkpoint",
             description="Load the model with laquant (and --baseline in the same dtype), then run "
                         "lm_eval.simple_evaluate with HFLM(pretrained=<that model>); --text FILE adds a local "
                         "perplexity task (loglikelihood_rolling).")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LaquantError as exc:
        print(f"laquant: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("laquant: interrupted", file=sys.stderr)
        return 130
