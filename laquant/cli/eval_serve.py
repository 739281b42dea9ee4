"""``laquant eval serve``: a multi-turn chat workload with and without the prefix state cache
(laquant.serving), and with greedy speculative decoding (``--draft``): time to first token,
tokens/s, hit rate, acceptance, snapshot memory per state format, and the next-token loss change of
resuming from a snapshot against recomputing the prefix."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from laquant.cli.common import pick_device, versions, write_atomic
from laquant.errors import LaquantError
from laquant.families import FAMILIES
from laquant.kernels.common.format_names import STATE_FORMATS, VERIFY_NUMERICS

CHUNK = 64  # laquant.kernels.common.state_io.CHUNK, named here so the parser needs no torch
MAX_DRAFT_TOKENS = 15  # laquant.serving.speculative.MAX_DRAFT_TOKENS, likewise
COVERED = tuple(FAMILIES)  # those laquant.serving.check_model accepts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a model folder or laquant checkpoint (GLA, Gated DeltaNet, DeltaNet, or a transformers "
                        "hybrid), an HF id (default: the embedded gla-small), or 'config:{json}' for a "
                        "random laquant GLA of that GLAConfig (speed only: no accuracy)")
    p.add_argument("--recipe", default=None,
                   help="also evaluate the model quantized here with this recipe (e.g. gla_int8), calibrated on "
                        "the shipped calibration text (random tokens for a config: model)")
    p.add_argument("--draft", default=None,
                   help="also replay with greedy speculative decoding, this model drafting (a folder, an HF id or "
                        "gla-small; laquant's own GLA / Gated DeltaNet models, the target's tokenizer), or 'ngram' "
                        "(prompt lookup in the request's tokens, no draft model)")
    p.add_argument("--draft-tokens", type=int, default=4,
                   help=f"tokens the draft proposes a round, 1..{MAX_DRAFT_TOKENS} (default: 4)")
    p.add_argument("--verify-numerics", choices=VERIFY_NUMERICS, default="decode",
                   help="with --draft: the model's verify steps' numerics, 'decode' (the output is plain greedy "
                        "decoding's) or 'prefill' (the state in float32 between the verified tokens: faster with "
                        "8-bit states, the output equal up to near-ties); default: decode")
    p.add_argument("--system", type=int, default=4096, help="shared system-prompt tokens (default: 4096)")
    p.add_argument("--conversations", type=int, default=4, help="conversations replayed (default: 4)")
    p.add_argument("--turns", type=int, default=3, help="turns per conversation (default: 3)")
    p.add_argument("--user", type=int, default=64, help="user tokens per turn (default: 64)")
    p.add_argument("--reply", type=int, default=32, help="generated tokens per turn (default: 32)")
    p.add_argument("--block-size", type=int, default=256,
                   help=f"tokens between snapshots, a multiple of {CHUNK} (default: 256)")
    p.add_argument("--budget-mb", type=float, default=1024.0, help="the snapshot pool's budget in MiB (default: 1024)")
    p.add_argument("--formats", nargs="+", default=["fp32", "bf16", "fp8_row", "int8_row"], metavar="FORMAT",
                   help="snapshot state formats for the memory table and the accuracy measurement "
                        f"({', '.join(STATE_FORMATS)}; the accuracy uses the non-fp32 ones)")
    p.add_argument("--reps", type=int, default=5, help="timed follow-up requests for the TTFT comparison (default: 5)")
    p.add_argument("--text", default="wikitext2",
                   help="accuracy text: 'wikitext2' (shipped), 'calibration', a text file, or a datasets id")
    p.add_argument("--accuracy-prefix", type=int, default=1024,
                   help=f"tokens before the snapshot the accuracy resumes from, a multiple of {CHUNK} (default: 1024)")
    p.add_argument("--accuracy-len", type=int, default=2048, help="accuracy window length in tokens (default: 2048)")
    p.add_argument("--accuracy-windows", type=int, default=8, help="accuracy windows (default: 8)")
    p.add_argument("--no-accuracy", action="store_true", help="skip the accuracy measurement")
    p.add_argument("--no-replay", action="store_true", help="skip the workload replay and TTFT (accuracy only)")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (default: auto)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="compute dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--seed", type=int, default=0, help="workload tokens and the state caches' seed (default: 0)")
    p.add_argument("--out", default="serve-results", help="output folder: serve.json, serve.md, serve.png")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def check_args(args: argparse.Namespace) -> None:
    """Everything checkable before torch loads."""
    for name in ("system", "conversations", "turns", "user", "reply", "reps", "accuracy_windows"):
        if getattr(args, name) < 1:
            raise LaquantError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("block_size", "accuracy_prefix"):
        value = getattr(args, name)
        if value < CHUNK or value % CHUNK:
            raise LaquantError(f"--{name.replace('_', '-')} must be a positive multiple of {CHUNK} tokens "
                               f"(the chunk kernels' checkpoint grid), got {value}")
    if args.accuracy_len <= args.accuracy_prefix + 1:
        raise LaquantError(f"--accuracy-len ({args.accuracy_len}) must exceed --accuracy-prefix + 1 "
                           f"({args.accuracy_prefix + 1}): the loss is measured after the prefix")
    if args.budget_mb < 0:
        raise LaquantError(f"--budget-mb must be >= 0, got {args.budget_mb}")
    bad = [f for f in args.formats if f not in STATE_FORMATS]
    if bad:
        raise LaquantError(f"unknown state format(s) {', '.join(bad)}; allowed: {', '.join(STATE_FORMATS)}")
    if not 1 <= args.draft_tokens <= MAX_DRAFT_TOKENS:
        raise LaquantError(f"--draft-tokens must be in 1..{MAX_DRAFT_TOKENS}, got {args.draft_tokens}")
    if args.draft is not None and args.draft.startswith("config:"):
        raise LaquantError("--draft takes a trained model (a folder, an HF id or gla-small), not a random config:")
    if args.draft is not None and args.no_replay:
        raise LaquantError("--draft times the replay with speculation: it cannot go with --no-replay")
    if args.no_replay and args.no_accuracy:
        raise LaquantError("--no-replay and --no-accuracy together leave nothing to measure")


def _parse_model(spec: str | None, speculative: bool = False):
    """``("config", fields)`` for ``config:{json}``, else ``("load", folder)`` (checked here)."""
    from laquant.paths import check_model_dir, read_config

    if spec is not None and spec.startswith("config:"):
        try:
            fields = json.loads(spec[len("config:"):] or "{}")
        except json.JSONDecodeError as exc:
            raise LaquantError(f"model {spec!r}: the part after 'config:' is not JSON ({exc})") from None
        if not isinstance(fields, dict):
            raise LaquantError(f"model {spec!r}: expected a JSON object of GLAConfig fields after 'config:'")
        return "config", fields
    model_dir = check_model_dir(spec)
    model_type = read_config(model_dir).get("model_type")
    if model_type not in COVERED:  # laquant.serving.check_model says the same of a loaded model
        raise LaquantError(f"{model_dir} is a {model_type!r} model; the prefix state cache covers "
                           f"{', '.join(COVERED)}")
    if speculative and not FAMILIES[model_type].native:
        raise LaquantError(f"--draft: speculative decoding runs on laquant's own models "
                           f"({', '.join(t for t, f in FAMILIES.items() if f.native)}), not on {model_type!r}")
    return "load", model_dir


def _variants(kind, what, recipe, device, dtype, progress):
    """``[(label, make)]``: the model, and its form quantized here by ``recipe``."""
    import torch

    def make():
        if kind == "config":
            from laquant.models import GLAConfig, GLAForCausalLM

            torch.manual_seed(0)
            try:
                with torch.device(device):  # a 1.3B model initialised on the GPU, not by the CPU
                    model = GLAForCausalLM(GLAConfig(**what))
            except (TypeError, ValueError) as exc:
                raise LaquantError(f"config:{json.dumps(what)} is not a GLA config laquant builds: {exc}") from None
            return model.to(dtype).eval(), None
        from laquant.api import load

        return load(what, device=device, dtype=dtype)

    def quantized():
        from laquant.api import calibrate
        from laquant.data import load_text, tokenize

        model, tok = make()
        if tok is None:
            calib = torch.randint(0, model.config.vocab_size, (4, 512))
        else:
            calib = tokenize(load_text("calibration"), tok)[: 16 * 512].view(16, 512)
        return calibrate(model, recipe, data=calib.to(device), progress=progress).model, tok

    label = "random GLA" if kind == "config" else Path(what).name
    out = [(label, make)]
    if recipe is not None:
        out.append((f"{label} + {recipe}", quantized))
    return out


def run(args: argparse.Namespace) -> int:
    check_args(args)
    kind, what = _parse_model(args.model, args.draft is not None)
    draft_dir = _parse_model(args.draft, True)[1] if args.draft not in (None, "ngram") else None
    if args.recipe is not None:
        from laquant.recipe import load_recipe

        load_recipe(args.recipe)  # an unknown recipe is named before any model loads
    import torch

    from laquant.data import load_text, tokenize
    from laquant.serving.accuracy import resume_loss, text_windows
    from laquant.eval.serve import markdown, plot
    from laquant.serving.replay import SpeculativeDecode, Workload, serve_eval

    device = pick_device(args.device)
    dtype = getattr(torch, args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda")
                                                                     else "float32"))
    workload = Workload(args.system, args.conversations, args.turns, args.user, args.reply, args.seed)
    budget = int(args.budget_mb * 2**20)
    accuracy = not args.no_accuracy and kind != "config"
    text = load_text(args.text) if accuracy else None
    speculative = None
    if args.draft == "ngram":
        speculative = SpeculativeDecode("ngram", args.draft_tokens, verify_numerics=args.verify_numerics)
    elif draft_dir is not None:
        from laquant.api import load

        speculative = SpeculativeDecode(load(draft_dir, device=device, dtype=dtype)[0], args.draft_tokens,
                                        args.block_size, args.verify_numerics)
    results = []
    for label, make in _variants(kind, what, args.recipe, device, dtype, not args.quiet):
        model, tok = make()
        from laquant.serving import check_model

        mixers = check_model(model).mixers.values()
        entry = {"model": label, "state_format": sorted({m.state_quantizer.format.name for m in mixers})}
        if not args.no_replay:
            if speculative is not None:
                from laquant.serving.speculative import check_draft

                check_draft(model, speculative.draft, args.draft_tokens)
            entry.update(serve_eval(model, workload, args.block_size, budget, args.formats, args.reps,
                                    progress=not args.quiet, speculative=speculative))
        if accuracy:
            windows = text_windows(tokenize(text, tok), args.accuracy_windows, args.accuracy_len)
            entry["accuracy"] = [resume_loss(model, windows, args.accuracy_prefix, fmt, seed=args.seed,
                                             progress=not args.quiet)
                                 for fmt in [None, *(f for f in args.formats if f != "fp32")]]
        results.append(entry)
        del model
    result = dict(device=device, dtype=str(dtype).replace("torch.", ""), versions=versions(), text=args.text,
                  results=results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "serve.json", json.dumps(result, indent=1))
    md = markdown(result)
    write_atomic(out / "serve.md", md)
    made = plot(result, out / "serve.png")
    print(md)
    print(f"\nwrote {out}/serve.json, serve.md" + (", serve.png" if made else ""))
    return 0
