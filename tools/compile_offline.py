"""Compile for sm_90, without a GPU, the kernels a CPU run only interprets: the launches their wrappers make on CPU
tensors, specialized as Triton's JIT specializes them (``tools/sass_mix.py``'s ``compile_like_jit``).

Triton's interpreter runs a kernel's Python as written, so it does not check what the compiler rejects: a name that a
runtime ``if`` gives another type than it had before (the prompt short conv's kept inputs, 2026-12-05, caught by a
review before its first GPU run), a shape the layouts cannot take, an op without a lowering. This runs every case in
:data:`CASES` through the whole compile (TTIR to cubin, Triton's bundled ptxas), as a GPU's first launch would.

    python tools/compile_offline.py [CASE ...]      (TRITON_INTERPRET must be unset: the kernels must be JIT functions)
    python tools/compile_offline.py --recorded launches.jsonl [--jobs N]

``--recorded`` compiles instead every launch a CPU test run recorded (``tools/launch_record.py``: the whole suite's
launches, not only these cases'). Prints one line a launch and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sass_mix import captured, compile_like_jit, cubin_sass, model_launch  # noqa: E402


def short_conv():
    """The prompt conv in every combination of kept inputs, mask, earlier inputs, gather and activation, and the
    decode token's conv."""
    from laquant.kernels.conv import short_conv as sc

    B, T, C, W = 2, 37, 96, 4
    x = torch.randn(B, T, C + 8, dtype=torch.bfloat16)
    weight, bias = torch.randn(C, W, dtype=torch.bfloat16), torch.randn(C, dtype=torch.bfloat16)
    cols = torch.arange(4, C + 4, dtype=torch.int32)
    with captured(sc) as launches:
        for keep, masked, prev, gather, silu in itertools.product((True, False), repeat=5):
            sc.short_conv_triton(x if gather else x[..., :C], torch.randn(B, W - 1, C, dtype=torch.bfloat16)
                                 if prev else None, weight, bias, "silu" if silu else None, cols if gather else None,
                                 keep=keep, mask=torch.ones(B, T, dtype=torch.bool) if masked else None)
        sc.short_conv_step_triton(x[:, 0], torch.randn(B, W - 1, C, dtype=torch.bfloat16), weight, bias, "silu", cols)
    return launches


def short_conv_runs():
    """The prompt conv over qwen3_next-like gathered columns: blocks that are aligned runs of a head's columns (the
    launch whose loads must vectorize, :func:`wide_loads`)."""
    from laquant.kernels.conv import short_conv as sc

    B, T, W, head = 1, 64, 4, 128
    cols = torch.cat([torch.arange(s, s + head) for s in (0, 3 * head, head, 4 * head)]).to(torch.int32)
    x = torch.randn(B, T, 6 * head, dtype=torch.bfloat16)
    with captured(sc) as launches:
        sc.short_conv_triton(x, None, torch.randn(cols.numel(), W, dtype=torch.bfloat16), None, "silu", cols)
    return launches


def wide_loads(fn, args: tuple, kwargs: dict) -> int:
    """How many 128-bit global loads the launch's sm_90 code has."""
    sass, _ = cubin_sass(compile_like_jit(fn, args, kwargs).asm["cubin"])
    return sass.count("LDG.E.128")


def qk_norm_rope():
    """The gated attention's q / k norms and rotary embedding: a prompt and a decode token, with the gate and
    without."""
    from laquant.kernels.attention import qk_norm_rope as qk

    B, T, Hq, Hkv, D, R, S = 2, 5, 4, 2, 64, 16, 11
    qg = torch.randn(B, T, Hq, 2 * D, dtype=torch.bfloat16)
    kv = torch.randn(B, T, 2 * Hkv * D, dtype=torch.bfloat16)
    k = kv[..., :Hkv * D].view(B, T, Hkv, D)
    wq, wk = torch.ones(D), torch.ones(D)
    cos, sin = torch.ones(1, T, R, dtype=torch.bfloat16), torch.zeros(1, T, R, dtype=torch.bfloat16)
    keys, values = (torch.zeros(B, Hkv, S, D, dtype=torch.bfloat16) for _ in range(2))
    v = kv[:, 0, Hkv * D:].view(B, Hkv, D)
    with captured(qk) as launches:
        for gated in (True, False):
            gate = qg[..., D:] if gated else None
            qk.qk_norm_rope_triton(qg[..., :D], gate, k, wq, wk, 1e-6, cos, sin)
            qk.qk_norm_rope_step_triton(qg[:, 0, :, :D], None if gate is None else gate[:, 0], k[:, 0], v, wq, wk,
                                        1e-6, cos[:, 0], sin[:, 0], keys, values, torch.tensor([3]))
    return launches


def experts():
    """The int8 experts: one token (a block a pair, no alignment) and several; Qwen3-Next's gated shared sum after
    them."""
    from laquant.kernels.moe import grouped

    E, H, I, k = 8, 256, 128, 2
    in_codes = torch.zeros(E, 2 * I, H, dtype=torch.int8)
    out_codes = torch.zeros(E, H, I, dtype=torch.int8)
    with captured(grouped) as launches:
        for T in (1, 9):
            x = torch.randn(T, H, dtype=torch.bfloat16)
            index = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
            grouped.int8_experts_triton(x, index, torch.rand(T, k, dtype=torch.bfloat16), in_codes,
                                        torch.ones(E, 2 * I), out_codes, torch.ones(E, H), "silu", True)
    return launches + gated_shared_sum(H, k)


def gated_shared_sum(H: int = 256, k: int = 2):
    """Qwen3-Next's gated shared-expert sum, of the routed experts' output and of their pairs before the sum."""
    from laquant.kernels.moe import combine

    T = 9
    x, shared, gate = (torch.randn(rows, H, dtype=torch.bfloat16) for rows in (T, T, 1))
    with captured(combine) as launches:
        combine.gated_shared_sum_triton(x, gate, shared, torch.randn(T, H, dtype=torch.bfloat16))
        combine.gated_shared_sum_triton(x, gate, shared, torch.randn(T * k, H), k)
    return launches


def delta_decode():
    """The gated delta rule's decode step at B = 64 (rows in blocks) and at B = 1 (the whole head a block), int8
    state with stochastic rounding."""
    from laquant.kernels.common.state import StateQuantizer
    from laquant.kernels.delta import decode

    H, Hk, K, V = 4, 2, 128, 128
    quant = StateQuantizer("int8_row", rounding="stochastic")
    with captured(decode) as launches:
        for B in (1, 64):
            proj = torch.randn(B, 2 * Hk * K + H * V, dtype=torch.bfloat16)
            q, k = proj[:, :Hk * K].view(B, Hk, K), proj[:, Hk * K:2 * Hk * K].view(B, Hk, K)
            v = proj[:, 2 * Hk * K:].view(B, H, V)
            state, scale = torch.zeros(B, H, K, V, dtype=torch.int8), torch.ones(B, H, K)
            decode.delta_decode_step(q, k, v, torch.zeros(B, H), torch.zeros(B, H), state, scale,
                                     torch.arange(B, dtype=torch.int32), quant, torch.zeros(B, dtype=torch.int32),
                                     use_qk_l2norm=True, block_k=16 if B > 1 else None, num_warps=1 if B > 1 else 8,
                                     early_state=True)
    return launches


def state_kernels():
    """The GLA and delta-rule decode and verify kernels as a model's B = 64 launch makes them (``tools/sass_mix.py``'s
    :func:`model_launch`: int8 state, stochastic rounding; GLA's decode with its output norm writing o_proj's codes),
    and the commits."""
    launches = [model_launch(kernel, "int8_row:stochastic", 16, 1) for kernel in ("gla", "delta")]
    for kernel in ("gla_verify", "delta_verify"):
        for commit in (False, True):
            launches.append(model_launch(kernel, "int8_row:stochastic", 32, 1, block_v=32, commit=commit))
    return launches


def rotary():
    """The rotary embedding's cos and sin, in the model's dtype and in float32 (OLMo hybrid's)."""
    from laquant.kernels.attention import rotary as kernels

    with captured(kernels) as launches:
        for dtype in (torch.bfloat16, torch.float32):
            kernels.rotary_cos_sin_triton(torch.arange(64).view(64, 1), torch.rand(32), 1.0, dtype)
    return launches


CASES = {"short_conv": short_conv, "short_conv_runs": short_conv_runs, "qk_norm_rope": qk_norm_rope,
         "experts": experts, "delta_decode": delta_decode, "state_kernels": state_kernels, "rotary": rotary}


def describe(fn, kwargs) -> str:
    flags = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k.isupper())
    return f"{getattr(fn, '__name__', fn)}({flags})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", choices=[[], *CASES], default=[], help="default: all")
    p.add_argument("--recorded", metavar="PATH", help="the launches tools/launch_record.py recorded, instead of CASES")
    p.add_argument("--jobs", type=int, default=1, help="--recorded: compiles run side by side")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: under the interpreter the kernels are not JIT functions")
    if args.recorded:
        if args.cases:
            p.error("--recorded compiles the recorded launches: name no CASE")
        return compile_recorded(args.recorded, args.jobs)
    failed = sum(_report((f"{name}: {describe(fn, kw)}", error) for fn, kw, error in compile_launches(CASES[name]()))
                 for name in args.cases or CASES)
    return 1 if failed else 0


def _compile_record(record: dict) -> tuple[str, str | None]:
    from launch_record import decode_launch

    try:
        fn, a, kw = decode_launch(record)
    except Exception as e:  # noqa: BLE001 - a launch that cannot be rebuilt is a finding too
        return record["kernel"], f"not rebuilt: {type(e).__name__}: {e}"
    [(fn, kw, error)] = compile_launches([(fn, a, kw)])
    return describe(fn, kw), error


def _report(results) -> int:
    """Print each ``(launch, error or None)`` as it comes; returns how many failed."""
    failed = 0
    for what, error in results:
        failed += error is not None
        print(f"ok      {what}" if error is None else f"FAILED  {what}: {error}", flush=True)
    return failed


def compile_recorded(path: str, jobs: int = 1) -> int:
    """Compile every launch recorded in ``path`` (:mod:`launch_record`), ``jobs`` at a time; 1 if any fails."""
    from launch_record import read_records

    try:
        records = read_records(path)
    except (OSError, ValueError) as e:  # missing, or not launch_record's JSON lines
        raise SystemExit(f"compile_offline: cannot read recorded launches from {path}: {e} (record them with "
                         "PYTHONPATH=tools python -m pytest -p launch_record --record-launches PATH)") from e
    if jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            failed = _report(pool.imap(_compile_record, records, chunksize=4))
    else:
        failed = _report(map(_compile_record, records))
    print(f"{len(records) - failed} of {len(records)} recorded launches compile for sm_90")
    return 1 if failed else 0


def compile_launches(launches) -> list[tuple]:
    """``(kernel, kwargs, None or the compiler's error)`` for each captured launch, compiled for sm_90."""
    out = []
    for fn, a, kw in launches:
        try:
            compile_like_jit(fn, a, kw)
            out.append((fn, kw, None))
        except Exception as e:  # noqa: BLE001 - every compiler error is a finding
            out.append((fn, kw, f"{type(e).__name__}: {str(e).strip()[-800:]}"))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
