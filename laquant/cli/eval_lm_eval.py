"""``laquant eval lm-eval MODEL --tasks ...``: lm-evaluation-harness on a model laquant loads."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from laquant.cli.common import pick_device, versions, write_atomic
from laquant.errors import LaquantError
from laquant.paths import check_model_dir

DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a laquant checkpoint (or any model directory laquant loads; gla-small)")
    p.add_argument("--tasks", nargs="+", default=[], help="lm-eval task names (and/or the --text task)")
    p.add_argument("--text", metavar="FILE", default=None,
                   help="also run a local perplexity task (loglikelihood_rolling) on this UTF-8 text file, "
                        "documents split at blank lines; no download")
    p.add_argument("--include-path", default=None, help="a folder of lm-eval task YAMLs of your own")
    p.add_argument("--baseline", default=None, help="also evaluate this model (the unquantized one), same dtype")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="compute dtype of both models (default auto: the one MODEL's config.json names, "
                        "which laquant sets to the base model's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto (default: cpu)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--max-length", type=int, default=None, help="lm-eval's window length (default: the model's)")
    p.add_argument("--limit", type=float, default=None, help="documents per task (a fraction if < 1)")
    p.add_argument("--num-fewshot", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graphed", action="store_true",
                   help="on a GPU, replay each scoring forward of laquant's GLA / Gated DeltaNet / DeltaNet or of a "
                        "transformers hybrid with laquant's mixers as a CUDA graph captured per batch size and length "
                        "bucket (4-9x faster on a 1.37B GLA and a 1024 x 8 qwen3_next; the tokens padded to the "
                        "bucket, so the scores move by rounding); a hybrid's generation tasks replay their prefills "
                        "too")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking a checkpoint's files against its sha256 digests (laquant.json)")


def run(args: argparse.Namespace) -> int:
    if not args.tasks and not args.text:
        raise LaquantError("name at least one task: --tasks TASK [TASK ...] and/or --text FILE")
    model_dirs = {"model": check_model_dir(args.model)}
    if args.baseline is not None:
        model_dirs = {"baseline": check_model_dir(args.baseline), **model_dirs}
    from laquant.api import load
    from laquant.eval.harness import TEXT_TASK, dtype_for, evaluate, require_lm_eval, task_manager, text_task
    from laquant.loading import read_supported_config

    require_lm_eval()
    device = pick_device(args.device)
    for d in model_dirs.values():
        read_supported_config(d)
    dtype = dtype_for(args.dtype, model_dirs["model"])
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    verify = False if args.no_verify else None
    with tempfile.TemporaryDirectory(prefix="laquant-lm-eval-") as tmp:
        include = [Path(args.include_path)] if args.include_path else []
        tasks = list(args.tasks)
        if args.text:
            include.append(text_task(Path(args.text), Path(tmp) / "tasks"))
            tasks.append(TEXT_TASK)
        manager = task_manager(tasks, include)  # unknown tasks fail here, before any model loads
        rows = {}
        for label, model_dir in model_dirs.items():
            model, tokenizer = load(model_dir, device=device, dtype=dtype, verify=verify)
            rows[label] = evaluate(model, tokenizer, tasks, manager, batch_size=args.batch_size,
                                   limit=limit, num_fewshot=args.num_fewshot, max_length=args.max_length,
                                   seed=args.seed, graphed=args.graphed)
            del model
    _print_table(model_dirs, rows, device, str(dtype).removeprefix("torch."))
    if args.json:
        payload = {"device": device, "dtype": str(dtype).removeprefix("torch."), "tasks": tasks,
                   "limit": limit, "versions": _versions(),
                   "models": {label: {"path": str(model_dirs[label]), **row} for label, row in rows.items()}}
        write_atomic(Path(args.json), json.dumps(payload, indent=2) + "\n")
    return 0


def _versions() -> dict:
    import lm_eval

    return {**versions(), "lm_eval": getattr(lm_eval, "__version__", "unknown")}


def _print_table(model_dirs: dict, rows: dict, device: str, dtype: str) -> None:
    for label, d in model_dirs.items():
        row = rows[label]
        print(f"{label}: {d} ({row['model_num_parameters']:,} parameters, {row['model_dtype']})")
    print(f"device: {device}  dtype: {dtype}")
    header = f"| {'task':<20} | {'metric':<16} | " + " | ".join(f"{label:>12}" for label in rows) + " |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    first = next(iter(rows.values()))
    for task, metrics in first["results"].items():
        for metric in metrics:
            if metric.endswith("_stderr") or metric == "sample_len":
                continue
            values = " | ".join(f"{rows[label]['results'].get(task, {}).get(metric, float('nan')):>12.4f}"
                                for label in rows)
            print(f"| {task:<20} | {metric:<16} | {values} |")
