"""How long any kernel takes to read a decode GEMM's int8 weights, beside laquant's GEMM on them (issue #14: the
target asks the GEMM at M = 64 for 70% of copy bandwidth; on the 1.37B GLA's shapes it reaches 24-52%, because a
call's fixed latency, not its bytes, sets the time of a 4-12 MB read).

For each shape (N x K): the fastest of a few launches of a kernel that does nothing but read the weight (each program
sums its contiguous chunks of 16-byte words and stores one int32: no tensor cores, no epilogue, writes negligible),
swept over the programs a launch has; a device-to-device copy of the same bytes (``Tensor.copy_``: reads and writes
them); and laquant's W8A8 GEMM on codes made beforehand at M = 1, 16, 64 (the committed tiles, as the model runs it).
CUDA-graph medians, every call on the next of several weight copies (> 2 x L2: streamed from device memory). The
ratio ``read floor / GEMM`` says how close the GEMM is to the fastest read of its bytes at that size, which a copy
bandwidth measured on gigabytes does not.

    python tools/read_floor_probe.py --out DIR [--shapes gla|7b|NxK,...]
    TRITON_INTERPRET=1 python tools/read_floor_probe.py --smoke     # the read kernel's sums checked on the CPU
"""
import argparse
import json
import math
import os

import torch
import triton
import triton.language as tl

SHAPES = {"gla": [(2048, 2048), (6144, 2048), (11264, 2048), (2048, 5632)],
          "7b": [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008)]}
PROGRAMS = (132, 264, 528, 1056, 2112, 4224)
WORDS = 1024  # int32 words (4 KB) a program reads a step


@triton.jit
def _read_kernel(w_ptr, out_ptr, n_words, per_program, WORDS: tl.constexpr):
    """Program ``p`` sums the int32 words ``[p * per_program, (p + 1) * per_program)`` of ``w`` (as int32 sums of
    their bytes' words) and stores the sum: the weight's bytes read once, nothing else."""
    p = tl.program_id(0)
    start = p.to(tl.int64) * per_program
    acc = tl.zeros([WORDS], dtype=tl.int32)
    for i in range(0, per_program, WORDS):
        offs = start + i + tl.arange(0, WORDS)
        acc += tl.load(w_ptr + offs, mask=offs < n_words, other=0)  # per_program: a multiple of WORDS
    tl.store(out_ptr + p, tl.sum(acc, 0))


def read_all(words: torch.Tensor, programs: int, out: torch.Tensor) -> torch.Tensor:
    """``out[p]``: the wrapped int32 sum of program ``p``'s chunk of ``words`` (an int32 view of the weight)."""
    n = words.numel()
    per = math.ceil(n / programs / WORDS) * WORDS
    _read_kernel[(programs,)](words, out, n, per, WORDS=WORDS, num_warps=8)
    return out


def read_reference(words: torch.Tensor, programs: int) -> torch.Tensor:
    n = words.numel()
    per = math.ceil(n / programs / WORDS) * WORDS
    padded = torch.nn.functional.pad(words.long(), (0, per * programs - n))
    sums = padded.view(programs, per).sum(1)
    return ((sums + 2**31) % 2**32 - 2**31).to(torch.int32)  # int32 wraparound, as the kernel's sums


def smoke() -> None:
    gen = torch.Generator().manual_seed(0)
    for N, K, programs in ((64, 96, 3), (40, 1024, 7)):
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=gen)
        words = w.view(torch.int32).reshape(-1)
        got = read_all(words, programs, torch.empty(programs, dtype=torch.int32))
        assert torch.equal(got, read_reference(words, programs)), (N, K, programs)
    print("read kernel: sums equal the reference")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="gla")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    from sweep_gemm import STREAM_BYTES, bench, parse_shapes, rotating  # the sweep's timing: the tables compare

    from laquant.kernels.gemm.configs import choose_config
    from laquant.kernels.common.gpus import device_name
    from laquant.kernels.gemm.int8 import PackedOutlierWeight, int8_gemm, quantize_rows

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    name = device_name(dev)
    rows = []
    for N, K in SHAPES.get(args.shapes) or parse_shapes(args.shapes):
        copies = max(2, math.ceil(STREAM_BYTES / (N * K)))
        gen = torch.Generator(device=dev).manual_seed(N + K)
        q8 = [torch.randint(-127, 128, (N, K), device=dev, dtype=torch.int8, generator=gen) for _ in range(copies)]
        words = [q.view(torch.int32).reshape(-1) for q in q8]
        rec = dict(N=N, K=K, int8_weight_MB=N * K / 1e6)
        reads = {}
        for programs in PROGRAMS:
            out = torch.empty(programs, dtype=torch.int32, device=dev)
            assert torch.equal(read_all(words[0], programs, out), read_reference(words[0].cpu(), programs).to(dev))
            reads[programs] = bench(rotating(lambda w, o=out, p=programs: read_all(w, p, o), words))
        best = min(reads, key=reads.get)
        rec.update(read_us_by_programs=reads, read_floor_us=reads[best], read_floor_programs=best)
        dst = torch.empty_like(q8[0])
        rec["copy_us"] = bench(rotating(lambda w: dst.copy_(w), q8))
        scale = torch.rand(N, device=dev, generator=gen) * 1e-3 + 1e-4
        keep = torch.arange(K, device=dev)
        packs = [PackedOutlierWeight.pack(q, scale, keep, keep[:0], torch.zeros(N, 0, device=dev,
                                          dtype=torch.bfloat16), None, K) for q in q8]
        for M in (1, 16, 64):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            xq, xs, xo = quantize_rows(x, packs[0])
            cfg = choose_config("w8a8", M, N, K, name)
            y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            rec[f"laquant_M{M}_us"] = bench(rotating(lambda p: int8_gemm(xq, xs, xo, p, y, cfg), packs))
            rec[f"read_floor_over_laquant_M{M}"] = round(rec["read_floor_us"] / rec[f"laquant_M{M}_us"], 3)
        rec["read_floor_GBps"] = N * K / rec["read_floor_us"] / 1e3
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    with open(os.path.join(args.out, "read_floor.json"), "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, triton=triton.__version__, rows=rows), f, indent=1)
    lines = ["| N x K | MB | read floor us (programs) | GB/s | D2D copy us | laquant M = 1 / 16 / 64 us "
             "| read floor / laquant at M = 64 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['N']}x{r['K']} | {r['int8_weight_MB']:.1f} | {r['read_floor_us']:.2f} "
                     f"({r['read_floor_programs']}) | {r['read_floor_GBps']:.0f} | {r['copy_us']:.2f} | "
                     f"{r['laquant_M1_us']:.2f} / {r['laquant_M16_us']:.2f} / {r['laquant_M64_us']:.2f} | "
                     f"{r['read_floor_over_laquant_M64']:.2f} |")
    with open(os.path.join(args.out, "read_floor.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
