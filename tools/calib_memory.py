"""Peak memory of calibration. On a GPU: the whole model on the GPU vs one decoder layer at a time.
With ``--cpu``: peak RSS of the calibration pass on the CPU against model size and token count,
each row in a fresh process (the peak resident memory while ``collect_stats`` runs, and the
resident memory before it: the interpreter, torch, the model and the tokenized text).

    python tools/calib_memory.py [MODEL] --samples 32 --seq-len 2048 --json out.json   (needs CUDA)
    python tools/calib_memory.py --cpu gla-small 'config:{"hidden_size": 512}' --samples 16 64 128 \
        --json eval/results/calib_memory_cpu.json --md eval/results/calib_memory_cpu.md
    python tools/calib_memory.py --stream 'config:{"hidden_size": 1024, "num_hidden_layers": 6}' \
        --samples 2 --seq-len 256 --json stream.json

``--stream``: a random GLA of that config saved in bf16, then `laquant calibrate --no-eval` on the
CPU with the whole model in memory and with ``--offload`` (streamed from the files layer by layer),
and ``laquant.load`` of the result, each in a fresh process: the peak RSS over the process's RSS
after its imports, against the model's float32 size, one layer's and the resident parts'.

MODEL: a model directory, or ``config:{json}`` for a randomly initialised GLA of that config (peak
memory depends on the shapes, not on the weights; the shipped tokenizer reads the calibration text).
Both runs collect the same statistics (tests/test_calibrate.py checks they are equal); the
layer-by-layer run keeps the model and the hidden states between layers in CPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from laquant.errors import LaquantError


def measure(model_spec, samples: int, seq_len: int, batch_size: int) -> dict:
    from laquant.adapters import get_adapter
    from laquant.calibration.run import calibration_batches, collect_stats
    from laquant.data import load_text, tokenize
    from laquant.loading import load_model, load_tokenizer
    from laquant.models import GLAConfig, GLAForCausalLM

    if not torch.cuda.is_available():
        raise LaquantError("calib_memory measures GPU memory and needs a CUDA device")

    def make():
        if str(model_spec).startswith("config:"):
            torch.manual_seed(0)
            cfg = GLAConfig(**json.loads(model_spec[len("config:"):]))
            return GLAForCausalLM(cfg).to(torch.bfloat16).eval(), load_tokenizer(None)
        return load_model(model_spec, device="cpu", dtype=torch.bfloat16)

    rows = {}
    for mode in ("whole model on the GPU", "layer by layer"):
        model, tokenizer = make()
        batches = calibration_batches(tokenize(load_text("calibration"), tokenizer), samples, seq_len)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        if mode == "layer by layer":
            collect_stats(model, get_adapter(model), batches, batch_size=batch_size, progress=False,
                          layerwise_device="cuda")
        else:
            model.to("cuda")
            collect_stats(model, get_adapter(model), batches, batch_size=batch_size, progress=False)
        torch.cuda.synchronize()
        rows[mode] = {"peak_GiB": torch.cuda.max_memory_allocated() / 2**30, "seconds": time.time() - t0}
        del model
    params = sum(p.numel() for p in make()[0].parameters())
    return {"model": str(model_spec), "parameters": params, "samples": samples, "seq_len": seq_len,
            "batch_size": batch_size, "device": torch.cuda.get_device_name(), "rows": rows}


def _vm(field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process in MiB (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_cpu_row(model_spec, samples: int, seq_len: int, batch_size: int) -> dict:
    """One row, in this process: peak RSS while the calibration pass runs on the CPU."""
    from laquant.adapters import get_adapter
    from laquant.calibration.run import calibration_batches, collect_stats
    from laquant.data import load_text, tokenize
    from laquant.loading import load_model, load_tokenizer
    from laquant.models import GLAConfig, GLAForCausalLM

    if str(model_spec).startswith("config:"):
        torch.manual_seed(0)
        model = GLAForCausalLM(GLAConfig(**json.loads(model_spec[len("config:"):]))).eval()
        tokenizer = load_tokenizer(None)
    else:
        model, tokenizer = load_model(model_spec, device="cpu")
    batches = calibration_batches(tokenize(load_text("calibration"), tokenizer), samples, seq_len)
    before = _vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    t0 = time.time()
    stats = collect_stats(model, get_adapter(model), batches, batch_size=batch_size, progress=False)
    seconds = time.time() - t0
    return {"model": str(model_spec), "parameters": sum(p.numel() for p in model.parameters()),
            "samples": samples, "seq_len": seq_len, "tokens": samples * seq_len, "batch_size": batch_size,
            "threads": torch.get_num_threads(), "rss_before_MiB": round(before, 1),
            "peak_rss_MiB": round(_vm("VmHWM"), 1), "calibration_peak_over_before_MiB": round(_vm("VmHWM") - before, 1),
            "stats_MiB": round(sum(t.numel() * t.element_size() for t in stats.tensors.values()) / 2**20, 2),
            "seconds": round(seconds, 1)}


def measure_cpu(models: list[str], samples: list[int], seq_len: int, batch_size: int, threads: int) -> dict:
    """Each (model, samples) row in a fresh process, so one row's heap does not carry into the next."""
    import platform
    import subprocess
    import sys

    rows = []
    for model_spec in models:
        for n in samples:
            proc = subprocess.run([sys.executable, __file__, "--cpu-row", model_spec, "--samples", str(n),
                                   "--seq-len", str(seq_len), "--batch-size", str(batch_size),
                                   "--threads", str(threads)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"device": "cpu", "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_end": load, "torch": torch.__version__, "rows": rows}


def markdown_cpu(result: dict) -> str:
    lines = ["# Calibration memory on the CPU (`python tools/calib_memory.py --cpu`)", "",
             f"Peak resident memory while the calibration pass runs (`collect_stats`, each row in a fresh process, "
             f"{result['rows'][0]['threads']} thread(s), batch {result['rows'][0]['batch_size']} x "
             f"{result['rows'][0]['seq_len']} tokens in 256-token segments). *before*: the process before "
             "calibrating (Python, torch, transformers, the model, the tokenized calibration text). "
             f"Load average at the end: {', '.join(result['load_average_at_end'])} on {result['cpus']} CPUs "
             "(a shared machine: the seconds are not a benchmark).", "",
             "| model | parameters | samples x seq_len | tokens | RSS before | peak RSS | peak - before | statistics | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| `{r['model']}` | {r['parameters'] / 1e6:.1f}M | {r['samples']} x {r['seq_len']} | {r['tokens']:,} | "
                     f"{r['rss_before_MiB']:.0f} MiB | {r['peak_rss_MiB']:.0f} MiB | "
                     f"{r['calibration_peak_over_before_MiB']:.0f} MiB | {r['stats_MiB']:.1f} MiB | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def _peak_row(run) -> dict:
    """Peak RSS of ``run()`` in this process over the RSS before it (after torch, transformers and
    laquant's CLI are imported)."""
    import importlib

    for module in ("transformers", "laquant.api", "laquant.cli.calibrate_steps"):
        importlib.import_module(module)
    before = _vm("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
        f.write("5")
    t0 = time.time()
    run()
    return {"rss_before_MiB": round(before, 1), "peak_over_before_MiB": round(_vm("VmHWM") - before, 1),
            "seconds": round(time.time() - t0, 1)}


def make_stream_model(spec: str, folder) -> dict:
    """A random GLA (bf16 files, the shipped tokenizer) and its float32 sizes in MiB."""
    import shutil
    from pathlib import Path

    from laquant.loading import default_model_dir
    from laquant.models import GLAConfig, GLAForCausalLM

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(**json.loads(spec[len("config:"):])))
    model.to(torch.bfloat16).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, Path(folder) / name)
    mib = lambda ps: sum(p.numel() for p in ps) * 4 / 2**20  # noqa: E731  (float32, as laquant computes)
    layer = mib(model.model.layers[0].parameters())
    return {"parameters": sum(p.numel() for p in model.parameters()), "model_fp32_MiB": round(mib(model.parameters()), 1),
            "layer_fp32_MiB": round(layer, 1),
            "resident_fp32_MiB": round(mib(model.parameters()) - layer * len(model.model.layers), 1)}


def measure_stream(spec: str, samples: int, seq_len: int, shard: str, threads: int) -> dict:
    """Whole model vs streamed (``--offload``) calibrate + save, and load, each in a fresh process."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from laquant.data import load_text

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sizes = make_stream_model(spec, tmp / "model")
        (tmp / "calib.txt").write_text(load_text("calibration")[:100_000])  # a small text: the tokenizer stays small
        rows = {}
        for mode in ("whole model", "--offload (streamed)", "laquant.load"):
            if mode == "laquant.load":
                row_args = ["--load-row", str(tmp / "out-whole model")]
            else:
                row_args = ["--cli-row", "calibrate", "--recipe", "gla_int8", "--model", str(tmp / "model"),
                            "--data", str(tmp / "calib.txt"), "--samples", str(samples), "--seq-len", str(seq_len),
                            "--no-eval", "--quiet", "--max-shard-size", shard, "--out", str(tmp / f"out-{mode}"),
                            *(["--offload"] if "offload" in mode else [])]
            proc = subprocess.run([sys.executable, __file__, "--threads", str(threads), *row_args],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            rows[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        same = all((tmp / "out-whole model" / f.name).read_bytes() == f.read_bytes()  # eval.json names --out
                   for f in (tmp / "out---offload (streamed)").iterdir() if f.is_file() and f.name != "eval.json")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"model": spec, **sizes, "samples": samples, "seq_len": seq_len, "max_shard_size": shard,
            "threads": threads, "load_average_at_end": load, "cpus": os.cpu_count(), "same_files": same, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="*", default=None)
    p.add_argument("--samples", type=int, nargs="+", default=[32])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", default=None)
    p.add_argument("--cpu", action="store_true", help="peak RSS on the CPU, models x samples, a process per row")
    p.add_argument("--md", default=None, help="with --cpu: also write the table as markdown")
    p.add_argument("--threads", type=int, default=1, help="with --cpu: torch threads")
    p.add_argument("--stream", action="store_true", help="whole model vs --offload streamed calibrate + save, "
                   "and load, on a config:{...} GLA (see the doc)")
    p.add_argument("--max-shard-size", default="20MB", help="with --stream")
    p.add_argument("--cpu-row", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cli-row", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.add_argument("--load-row", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cli_row or args.load_row:
        torch.set_num_threads(args.threads)
        if args.cli_row:
            from laquant.cli import main as cli

            row = _peak_row(lambda: cli(args.cli_row))
        else:
            import laquant

            row = _peak_row(lambda: laquant.load(args.load_row))
        print(json.dumps(row))
        return
    if args.stream:
        result = measure_stream(args.model[0], args.samples[0], args.seq_len, args.max_shard_size, args.threads)
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        return
    models = args.model or ["gla-small"]
    if args.cpu_row:
        torch.set_num_threads(args.threads)
        print(json.dumps(measure_cpu_row(models[0], args.samples[0], args.seq_len, args.batch_size)))
        return
    if args.cpu:
        result = measure_cpu(models, args.samples, args.seq_len, args.batch_size, args.threads)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        if args.md:
            with open(args.md, "w") as f:
                f.write(markdown_cpu(result))
        return
    result = measure(models[0], args.samples[0], args.seq_len, args.batch_size)
    for mode, row in result["rows"].items():
        print(f"{mode:>24}: peak {row['peak_GiB']:.3f} GiB, {row['seconds']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
