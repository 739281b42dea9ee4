"""Benchmark of speculative decoding's verify step (issue #19) and of greedy speculative decoding.

Kernels (GLA and the gated delta rule, per state format): a verify step of K = 2, 4, 8, 16 tokens at
B = 1 and 64 against one decode step, K decode steps, and the chunked prefill kernel run on the same K
tokens; its commit (accepting K/2, recomputed) and the variant keeping every state in a side
buffer; and whether verify + commit left the pool bit-identical to the decode steps.
Speculative decoding (B = 1, or --spec-batch rows of each prompt): the shipped gla-small (or --model)
quantized with --recipe as the target, drafted for by its unquantized self (or --draft, a model or
``ngram``: prompt lookup): tokens/s against plain decoding (CUDA graphed and eager), a round's time over
a plain step's, the acceptance, and whether the tokens equal plain greedy decoding's; one prompt per
--prompt-offsets (characters into WikiText-2's test text).

    python tools/bench_verify.py --out bench/verify            # on the GPU
    python tools/bench_verify.py --out /tmp/v --tiny           # CPU smoke test: the references, no timings
    python tools/bench_verify.py --out bench/b64 --no-kernels --draft ngram --spec-batch 64 \
        --timing-target '{"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 16}'   # a round at B = 64

Writes ``verify.json`` and ``verify.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TIMING_TARGET_TYPES = ("gla", "gated_deltanet")  # --timing-target's model_type


def _timer(cuda: bool):
    """``ms(fn)``: the median time of ``fn`` (None without CUDA: the function runs once)."""
    if not cuda:
        return lambda fn: (fn(), None)[1]
    from triton.testing import do_bench

    return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")


def _inputs(family, B, T, H, K, device):
    r = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    if family == "gla":
        return [r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16(),
                (F.logsigmoid(r(B, T, H, K)) / 16).bfloat16()]
    hk = max(1, H // 2)
    return [r(B, T, hk, K).bfloat16(), r(B, T, hk, K).bfloat16(), r(B, T, H, K).bfloat16(),
            -F.softplus(r(B, T, H)) / 4, torch.rand(B, T, H, device=device)]


def kernel_rows(args, cuda: bool) -> list[dict]:
    from laquant.kernels.common.pool_steps import Kept, commit_kept
    from laquant.kernels.common.state import State, StateQuantizer
    from laquant.kernels.delta import decode as delta_decode
    from laquant.kernels.delta import verify as delta_verify
    from laquant.kernels.gla import decode as gla_decode
    from laquant.kernels.gla import verify as gla_verify

    device = "cuda" if cuda else "cpu"
    ms = _timer(cuda)
    H, K = args.heads, args.dim
    rows = []
    for family in args.families:
        kw = {} if family == "gla" else {"use_qk_l2norm": True}
        if family == "gla":
            decode = gla_decode.gla_decode_step if cuda else gla_decode.gla_decode_step_reference
            verify = gla_verify.gla_verify if cuda else gla_verify.gla_verify_reference
            commit = gla_verify.gla_commit if cuda else gla_verify.gla_commit_reference
        else:
            decode = delta_decode.delta_decode_step if cuda else delta_decode.delta_decode_step_reference
            verify = delta_verify.delta_verify if cuda else delta_verify.delta_verify_reference
            commit = delta_verify.delta_commit if cuda else delta_verify.delta_commit_reference
        for fmt in args.formats:
            fmt_name, _, rounding = fmt.partition(":")
            quant = StateQuantizer(fmt_name, renorm_interval=1, rounding=rounding or "nearest")
            for B in args.batch:
                full = torch.randn(B, H, K, K, device=device) * 0.1
                data, scale = quant.store(full, key=None) if not quant.stochastic else StateQuantizer(fmt_name).store(
                    full)
                scale = scale.squeeze(-1).expand(B, H, K).contiguous() if scale is not None else None
                idx = torch.arange(B, dtype=torch.int32, device=device)
                n_stores = torch.zeros(B, dtype=torch.int32, device=device)
                for T in args.tokens:
                    ins = _inputs(family, B, T, H, K, device)
                    step_ins = [x[:, 0] for x in ins]
                    pool = lambda: (data.clone(), None if scale is None else scale.clone())  # noqa: E731
                    d, s = pool()
                    row = dict(family=family, format=fmt, B=B, K_tokens=T, H=H, dim=K)
                    row["decode_1"] = ms(lambda: decode(*step_ins, d, s, idx, quant, n_stores, **kw))
                    row["decode_K"] = ms(lambda: [decode(*[x[:, t] for x in ins], d, s, idx, quant, n_stores, **kw)
                                                  for t in range(T)])
                    row["verify"] = ms(lambda: verify(*ins, d, s, idx, quant, n_stores, **kw))
                    row["verify_prefill"] = ms(lambda: verify(*ins, d, s, idx, quant, n_stores, numerics="prefill",
                                                              **kw))
                    kept = Kept.empty_like_pool(d, s, B, T)
                    row["verify_keep"] = ms(lambda: verify(*ins, d, s, idx, quant, n_stores, kept=kept, **kw))
                    half = torch.full((B,), max(1, T // 2), dtype=torch.int32, device=device)
                    row["commit"] = ms(lambda: commit(*ins, d, s, idx, quant, half, n_stores, **kw))
                    row["commit_kept"] = ms(lambda: commit_kept(d, s, idx, kept, half))
                    if cuda:
                        row["prefill_chunk"] = ms(lambda: _chunk(family, ins, State(d, s, fmt_name), quant, kw))
                    row["bit_identical"] = _rollback_identical(family, ins, pool, idx, quant, n_stores, half, decode,
                                                               verify, commit, kw, cuda)
                    if row["decode_1"]:
                        row["verify_over_decode"] = row["verify"] / row["decode_1"]
                        row["verify_commit_over_decode"] = (row["verify"] + row["commit"]) / row["decode_1"]
                        row["verify_prefill_over_decode"] = row["verify_prefill"] / row["decode_1"]
                        row["verify_prefill_commit_over_decode"] = (row["verify_prefill"] + row["commit"]) / \
                            row["decode_1"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def _chunk(family, ins, initial, quant, kw):
    fmt = initial.format
    if family == "gla":
        from laquant.kernels.gla.chunk import chunk_gla_triton

        return chunk_gla_triton(*ins, initial_state=initial, output_final_state=True, final_format=fmt)
    from laquant.kernels.delta.chunk import chunk_delta_triton

    return chunk_delta_triton(*ins, initial_state=initial, output_final_state=True, final_format=fmt, **kw)


def _rollback_identical(family, ins, pool, idx, quant, n_stores, accepted, decode, verify, commit, kw, cuda) -> bool:
    """verify + commit of ``accepted`` tokens leaves the pool as that many decode steps (the delta
    rule's decode kernel with the verify kernel's summation: block_k = K)."""
    d1, s1 = pool()
    d2, s2 = pool()
    counts = n_stores.clone()
    extra, launch = {}, {}
    if cuda and family != "gla":  # one launch for both kernels: the whole K and V in one tile
        K, V = ins[0].shape[-1], ins[2].shape[-1]
        bk, bv = 1 << (K - 1).bit_length(), 1 << (V - 1).bit_length()
        warps = min(16, max(2, bk * bv // 1024))
        extra, launch = dict(block_k=bk, num_warps=warps), dict(block_v=bv, num_warps=warps)
    for t in range(int(accepted[0])):
        decode(*[x[:, t] for x in ins], d1, s1, idx, quant, counts, **kw, **extra)
        counts += 1
    verify(*ins, d2, s2, idx, quant, n_stores, **kw, **launch)
    commit(*ins, d2, s2, idx, quant, accepted, n_stores, **kw, **launch)
    same = torch.equal(d1.view(torch.uint8), d2.view(torch.uint8))
    return bool(same and (s1 is None or torch.equal(s1, s2)))


def speculative_rows(args, cuda: bool) -> list[dict]:
    """Speculative decoding of each target (the trained ``--model`` quantized with ``--recipe``; with
    ``--timing-target``, also a random-weight model of that config, quantized alike, whose acceptance
    says nothing: its round time gives the projection at other acceptances). ``--spec-batch B``: each
    prompt repeated in B rows (the rows accept alike), for a round's cost at that batch."""
    import laquant
    from laquant.api import load
    from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, GLAConfig, GLAForCausalLM
    from laquant.paths import DEFAULT_MODEL_NAME, resolve_model_dir

    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    model_dir = resolve_model_dir(None if args.model == DEFAULT_MODEL_NAME else args.model)
    target, tok = load(model_dir, device=device, dtype=dtype)
    draft = "ngram" if args.draft == "ngram" else \
        load(resolve_model_dir(None if args.draft in (None, DEFAULT_MODEL_NAME) else args.draft), device=device,
             dtype=dtype)[0]
    text = (Path(laquant.__file__).parent / "assets/data/calibration/wiki.utf8").read_text()[:200_000]
    calib = tok(text, return_tensors="pt").input_ids[0].to(device)
    wiki = (Path(laquant.__file__).parent / "assets/data/wikitext-2-raw/wiki.test.raw").read_text()
    prompts = [(off, tok(wiki[off:off + 2000], return_tensors="pt").input_ids[:, :args.prompt_tokens].to(device)
                .expand(args.spec_batch, -1).contiguous()) for off in args.prompt_offsets]
    targets = [(str(model_dir.name), target)]
    if args.timing_target:
        fields = {**json.loads(args.timing_target), "vocab_size": target.config.vocab_size}
        kind = fields.pop("model_type", "gla")  # one of TIMING_TARGET_TYPES (main checks)
        config_class, model_class = {"gla": (GLAConfig, GLAForCausalLM),
                                     "gated_deltanet": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM)}[kind]
        cfg = config_class(**fields)
        torch.manual_seed(0)
        targets.append((f"random {kind} {cfg.hidden_size}x{cfg.num_hidden_layers}",
                        model_class(cfg).to(device, dtype).eval()))
    rows = []
    for name, model in targets:
        if args.recipe:
            laquant.calibrate(model, args.recipe, calib, samples=16, seq_len=512, progress=False)
        for off, ids in prompts if model is target else prompts[:1]:  # a random target: its round time only
            rows += _speculative_rows_of(args, cuda, f"{name} @{off}" if len(prompts) > 1 else name, model, draft, ids)
        del model
    return rows


def _speculative_rows_of(args, cuda, name, target, draft, ids) -> list[dict]:
    from laquant.generate import generate, release_graphs
    from laquant.serving.speculative import SpeculativeStats, parting_gaps, speculative_generate

    n = args.new_tokens

    def rate(fn):
        fn()  # warm up (graph capture, autotuning)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        return out, out.shape[0] * (out.shape[1] - ids.shape[1]) / seconds, seconds  # tokens/s over the rows

    rows = []
    with torch.no_grad():
        plain, plain_rate, _ = rate(lambda: generate(target, ids, n))
        _, eager_rate, _ = rate(lambda: generate(target, ids, n, graphed=False))
        draft_rate = None if isinstance(draft, str) else rate(lambda: generate(draft, ids, n))[1]
        for k, numerics in ((k, v) for k in args.draft_tokens for v in args.verify_numerics):
            spec = lambda **kw: speculative_generate(target, draft, ids, n, k, verify_numerics=numerics, **kw)  # noqa
            spec()  # warm up: the round's capture, autotuning
            stats = SpeculativeStats()
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = spec(stats=stats)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            spec_rate, round_ms = out.shape[0] * (out.shape[1] - ids.shape[1]) / seconds, seconds * 1e3 / stats.rounds
            _, spec_eager_rate, _ = rate(lambda: spec(graphed=False))
            step_ms = 1e3 * ids.shape[0] / plain_rate
            projected = {f"{a:.1f}": (1 - a ** (k + 1)) / (1 - a) / round_ms * step_ms
                         for a in (0.6, 0.8, 0.9)}  # tokens/round at i.i.d. acceptance a, over plain tokens a step
            row = dict(model=name, recipe=args.recipe, draft=args.draft or "gla-small", batch=ids.shape[0],
                       draft_tokens=k, verify_numerics=numerics,
                       new_tokens=n, equal_to_greedy=bool(torch.equal(out, plain)),
                       parting_gap=next(parting_gaps(target, out, plain), (None, None, None))[2],
                       round_graphed=stats.round_graphed, draft_graphed=stats.draft_graphed,
                       acceptance=stats.acceptance, tokens_per_round=stats.tokens_per_round,
                       tokens_per_s=spec_rate, all_eager_tokens_per_s=spec_eager_rate,
                       plain_graphed_tokens_per_s=plain_rate, plain_eager_tokens_per_s=eager_rate,
                       draft_alone_tokens_per_s=draft_rate, round_ms=round_ms, plain_step_ms=step_ms,
                       round_over_step=round_ms / step_ms, projected_speedup_at_acceptance=projected,
                       speedup_vs_graphed=spec_rate / plain_rate, speedup_vs_eager=spec_rate / eager_rate)
            rows.append(row)
            print(json.dumps(row), flush=True)
    release_graphs(target)
    if not isinstance(draft, str):
        release_graphs(draft)
    return rows


def _rate(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _equal(row) -> str:
    gap = row.get("parting_gap")
    return str(row["equal_to_greedy"]) if gap is None else f"False (parts at a logit gap of {gap:.2%})"


def markdown(kernels: list[dict], spec: list[dict], device: str) -> str:
    us = lambda x: "-" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    lines = [f"# Verify step and speculative decoding ({device})", "",
             "Times in us (median, triton do_bench). verify/decode: the verify step over one decode step (target: "
             "<= 1.5 at K = 4-8, B = 64); +commit: with the commit of K/2 tokens recomputed. prefill: the verify "
             "step with numerics=\"prefill\" (the state held in float32 between the tokens).", "",
             "| family | format | B | K | decode | K decodes | verify | verify prefill | verify+kept | commit | "
             "commit kept | prefill chunk | verify/decode | +commit | prefill/decode | +commit | "
             "rollback bit-identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in kernels:
        ratio = lambda key: f"{r[key]:.2f}" if key in r else "-"  # noqa: E731
        lines.append(f"| {r['family']} | {r['format']} | {r['B']} | {r['K_tokens']} | {us(r['decode_1'])} | "
                     f"{us(r['decode_K'])} | {us(r['verify'])} | {us(r['verify_prefill'])} | {us(r['verify_keep'])} | "
                     f"{us(r['commit'])} | {us(r['commit_kept'])} | {us(r.get('prefill_chunk'))} | "
                     f"{ratio('verify_over_decode')} | {ratio('verify_commit_over_decode')} | "
                     f"{ratio('verify_prefill_over_decode')} | {ratio('verify_prefill_commit_over_decode')} | "
                     f"{r['bit_identical']} |")
    if spec:
        lines += ["", "## Speculative decoding (target >= 1.5x plain at B = 1)", "",
                  "tokens/s: each round one CUDA graph where round graphed (else the verify steps eager, the draft's "
                  "steps graphed); all eager: everything eager. Rates include the prompt's prefill (both models'). "
                  "tokens/s are over the batch's rows (B rows of one prompt accept alike). "
                  "round / step: a round's time over a plain graphed step's. Projected: the same round time with "
                  "tokens/round (1 - a^(k+1)) / (1 - a) at i.i.d. acceptance a, over plain graphed tokens/s (a "
                  "random-weight target's own acceptance means nothing).", "",
                  "| target | recipe | draft | B | k | verify numerics | acceptance | tokens/round | tokens/s | all eager | "
                  "round graphed | "
                  "plain graphed | plain eager | draft alone | round ms | round / step | vs graphed | vs eager | "
                  "projected at a = 0.6 / 0.8 / 0.9 | = greedy |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in spec:
            proj = " / ".join(f"{v:.2f}x" for v in r["projected_speedup_at_acceptance"].values())
            lines.append(f"| {r['model']} | {r['recipe']} | {r['draft']} | {r.get('batch', 1)} | {r['draft_tokens']} | "
                         f"{r.get('verify_numerics', 'decode')} | "
                         f"{r['acceptance']:.0%} | "
                         f"{r['tokens_per_round']:.2f} | {r['tokens_per_s']:.1f} | {r['all_eager_tokens_per_s']:.1f} | "
                         f"{r['round_graphed']} | {r['plain_graphed_tokens_per_s']:.1f} | "
                         f"{r['plain_eager_tokens_per_s']:.1f} | {_rate(r['draft_alone_tokens_per_s'])} | "
                         f"{r['round_ms']:.3f} | {r['round_over_step']:.2f} | "
                         f"{r['speedup_vs_graphed']:.2f}x | {r['speedup_vs_eager']:.2f}x | {proj} | "
                         f"{_equal(r)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for verify.json and verify.md")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (a CPU smoke test)")
    p.add_argument("--families", nargs="+", default=["gla", "delta"], choices=["gla", "delta"])
    p.add_argument("--formats", nargs="+", default=["fp8_row", "int8_row:stochastic", "bf16", "fp32"],
                   help="state formats (FORMAT or FORMAT:stochastic)")
    p.add_argument("--batch", nargs="+", type=int, default=[1, 64])
    p.add_argument("--tokens", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128, help="K = V per head")
    p.add_argument("--model", default="gla-small", help="the speculative target (quantized with --recipe)")
    p.add_argument("--recipe", default="gla_int8", help="the target's recipe ('' : unquantized)")
    p.add_argument("--draft", default=None, help="the draft (default: --model, unquantized), or ngram (prompt lookup)")
    p.add_argument("--prompt-offsets", nargs="+", type=int, default=[0],
                   help="one prompt per offset (characters into WikiText-2's test text; default: 0)")
    p.add_argument("--draft-tokens", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--verify-numerics", nargs="+", default=["decode"], choices=["decode", "prefill"],
                   help="the target's verify steps' numerics to time (laquant.models.verify.verify)")
    p.add_argument("--spec-batch", type=int, default=1,
                   help="speculative decoding at this batch (each prompt repeated; the rows accept alike)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--no-speculative", action="store_true", help="kernels only")
    p.add_argument("--timing-target", default=None, metavar="JSON",
                   help="also a random-weight target of this config (JSON of GLAConfig fields, or of "
                        "GatedDeltaNetConfig's with \"model_type\": \"gated_deltanet\"; the draft's vocabulary), for "
                        "the round time of a target whose step is weight-bound")
    p.add_argument("--no-kernels", action="store_true", help="speculative decoding only")
    args = p.parse_args(argv)
    if args.timing_target:
        try:
            kind = json.loads(args.timing_target).get("model_type", "gla")
        except (json.JSONDecodeError, AttributeError):
            p.error(f"--timing-target: a JSON object of config fields; got {args.timing_target!r}")
        if kind not in TIMING_TARGET_TYPES:
            p.error(f"--timing-target: model_type must be one of {', '.join(TIMING_TARGET_TYPES)}; got {kind!r}")
    if args.tiny:
        args.heads, args.dim, args.batch, args.tokens = 2, 16, [1, 3], [2, 4]
        args.new_tokens, args.prompt_tokens, args.draft_tokens = 12, 16, [3]
        if args.timing_target:
            kind = json.loads(args.timing_target).get("model_type", "gla")
            args.timing_target = json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2,
                                             "model_type": kind})
        args.formats = [f for f in args.formats if not f.startswith("bf16")]
    args.draft = args.draft or args.model
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else "cpu (references, no timings)"
    kernels = [] if args.no_kernels else kernel_rows(args, cuda)
    spec = [] if args.no_speculative else speculative_rows(args, cuda)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verify.json").write_text(json.dumps({"device": device, "kernels": kernels, "speculative": spec}, indent=1))
    (out / "verify.md").write_text(markdown(kernels, spec, device))
    print((out / "verify.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
