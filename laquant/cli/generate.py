"""``laquant generate MODEL --prompt TEXT``: text from a model or a laquant checkpoint (laquant.generate)."""

from __future__ import annotations

import argparse
import time

from laquant.cli.common import pick_device
from laquant.errors import LaquantError
from laquant.kernels.common.format_names import VERIFY_NUMERICS
from laquant.paths import DEFAULT_MODEL_NAME, check_model_dir

MAX_DRAFT_TOKENS = 15  # laquant.serving.speculative's (test_speculative checks), here without importing torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL_NAME,
                   help=f"a laquant checkpoint folder, a model directory, a Hugging Face id, or {DEFAULT_MODEL_NAME} "
                        "(the embedded model; the default)")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding (the default)")
    mode.add_argument("--temperature", type=float, default=None, help="sample at this temperature")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (with --temperature)")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (default: auto)")
    p.add_argument("--no-graph", action="store_true", help="decode eagerly on CUDA too (no CUDA graph)")
    p.add_argument("--no-eos", action="store_true", help="do not stop at the tokenizer's end-of-sequence token")
    p.add_argument("--draft", default=None,
                   help=f"greedy speculative decoding with this draft model (a folder, a Hugging Face id, or "
                        f"{DEFAULT_MODEL_NAME}; it must share the model's tokenizer), or 'ngram': proposals looked up "
                        "in the prompt and the text so far (prompt lookup, no draft model). The same tokens as "
                        "without")
    p.add_argument("--draft-tokens", type=int, default=None,
                   help=f"tokens the draft proposes per round, 1..{MAX_DRAFT_TOKENS} (default: 4; with --draft)")
    p.add_argument("--verify-numerics", choices=VERIFY_NUMERICS, default=None,
                   help="with --draft: 'decode' (the default) verifies the proposals with the logits the decode steps "
                        "give, so the output is plain greedy decoding's; 'prefill' holds the state in float32 between "
                        "the verified tokens (faster with the 8-bit states; the output may part from plain greedy "
                        "decoding's where two tokens nearly tie)")


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise LaquantError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature is not None and not args.temperature > 0:
        raise LaquantError(f"--temperature must be > 0, got {args.temperature}")
    if args.top_k is not None and (args.top_k < 1 or args.temperature is None):
        raise LaquantError("--top-k needs --temperature and must be >= 1")
    if not args.prompt:
        raise LaquantError("--prompt is empty; give the text to continue")
    for flag, value in (("--draft-tokens", args.draft_tokens), ("--verify-numerics", args.verify_numerics)):
        if value is not None and args.draft is None:
            raise LaquantError(f"{flag} needs --draft (the draft model)")
    draft_tokens = 4 if args.draft_tokens is None else args.draft_tokens
    if args.draft is not None and not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise LaquantError(f"--draft-tokens must be in 1..{MAX_DRAFT_TOKENS}, got {draft_tokens}")
    if args.draft is not None and args.temperature is not None:
        raise LaquantError("--draft (speculative decoding) is greedy only: drop --temperature")
    spec = None if args.model == DEFAULT_MODEL_NAME else args.model
    model_dir = check_model_dir(spec)  # a missing or unsupported model is named before loading
    draft_dir = None if args.draft in (None, "ngram") else \
        check_model_dir(None if args.draft == DEFAULT_MODEL_NAME else args.draft)
    import torch

    from laquant.api import load
    from laquant.generate import DecodeSession
    from laquant.loading import read_supported_config

    device = pick_device(args.device)
    read_supported_config(model_dir)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model, tokenizer = load(model_dir, device=device, dtype=dtype)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to(device)
    if ids.shape[1] == 0:
        raise LaquantError("the prompt tokenizes to no tokens")
    eos = None if args.no_eos else tokenizer.eos_token_id
    torch.manual_seed(args.seed)
    graphed = False if args.no_graph else None
    if args.draft is not None:
        return _speculative(args, model, tokenizer, ids, eos, draft_dir, draft_tokens, device, dtype)
    t0 = time.perf_counter()
    session = DecodeSession(model, ids, args.max_new_tokens, do_sample=args.temperature is not None,
                            temperature=args.temperature or 1.0, top_k=args.top_k, eos_token_id=eos, graphed=graphed)
    t1 = time.perf_counter()
    out = session.run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    new = out.shape[1] - ids.shape[1]
    print(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
    rate = (new - 1) / (t2 - t1) if new > 1 else float("nan")
    how = "CUDA graph, one replay per token" if session.graphed else "eager"
    setup = " (graph capture included: the first call per batch size)" if session.graphed else ""
    print(f"\n[{new} tokens; prefill {ids.shape[1]} tokens in {t1 - t0:.3f} s{setup}; "
          f"decode {rate:.1f} tokens/s ({how}, {device})]")
    return 0


def _speculative(args, model, tokenizer, ids, eos, draft_dir, draft_tokens, device, dtype) -> int:
    import torch

    from laquant.api import load
    from laquant.loading import read_supported_config
    from laquant.serving.speculative import SpeculativeStats, check_draft, speculative_generate

    if draft_dir is None:  # --draft ngram
        draft = "ngram"
    else:
        read_supported_config(draft_dir)
        draft, _ = load(draft_dir, device=device, dtype=dtype)
    check_draft(model, draft, draft_tokens)
    stats = SpeculativeStats()
    t0 = time.perf_counter()
    graphed = False if args.no_graph else None
    out = speculative_generate(model, draft, ids, args.max_new_tokens, draft_tokens, eos, stats, graphed=graphed,
                               verify_numerics=args.verify_numerics or "decode")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    drafter = "n-gram lookup" if draft_dir is None else "draft"
    how = ("each round one CUDA graph" if stats.round_graphed else
           "verify steps eager, draft steps CUDA-graphed" if stats.draft_graphed else "eager")
    new = out.shape[1] - ids.shape[1]
    print(tokenizer.decode(out[0].tolist(), skip_special_tokens=True))
    print(f"\n[{new} tokens in {elapsed:.3f} s, prefill included ({new / elapsed:.1f} tokens/s); speculative, "
          f"{draft_tokens} {drafter} tokens a round: {stats.rounds} rounds, {stats.acceptance:.0%} of the proposals "
          f"accepted ({stats.tokens_per_round:.2f} tokens a round; {how}, {device})]")
    return 0
