"""The steps of ``laquant calibrate`` after the first checks (:mod:`laquant.cli.calibrate`): check
the inputs that need the model's tokenizer, load, evaluate, calibrate, evaluate again, report, save
and plot."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from laquant.adapters import get_adapter
from laquant.api import Calibrated, calibrate, save
from laquant.api import load as laquant_load
from laquant.calibration.run import calibration_batches, collect_stats
from laquant.calibration.stats import Stats
from laquant.checkpoint import StagingDir, weight_files
from laquant.cli.common import add_to_folder, pick_device
from laquant.cli.export import write_serving
from laquant.compressed_tensors_export import write_compressed_tensors
from laquant.data import load_text, tokenize
from laquant.decisions import Decisions
from laquant.errors import LaquantError
from laquant.eval.plots import write_stat_plots
from laquant.eval.ppl import default_stride, perplexity, probe, strided_windows, work_units
from laquant.eval.report import comparison_table, model_bytes, report_markdown, state_bytes_per_sequence
from laquant.loading import load_model, load_tokenizer, read_supported_config
from laquant.progress import JobProgress, Phase
from laquant.recipe import recipe_to_yaml
from laquant.streaming import calibrate_streamed, streams


@dataclass
class Job:
    """What one run reads and where it runs, all checked before any expensive work."""

    args: argparse.Namespace
    device: str
    recipe: dict
    out: Path
    model_dir: Path
    tokenizer: object
    stats: Stats | None  # reused with --stats
    batches: torch.Tensor | None  # calibration windows; None with --stats
    eval_ids: torch.Tensor | None  # None with --no-eval
    progress: JobProgress | None = None  # the job-level line (set by run)

    @property
    def home(self) -> str:
        """Where the model waits between steps: CPU memory with --offload."""
        return "cpu" if self.args.offload else self.device


def run(args: argparse.Namespace, recipe: dict, out: Path, model_dir: Path) -> int:
    job = check_inputs(args, recipe, out, model_dir)
    phases = job_phases(job)
    job.progress = JobProgress(phases, PROXIES, enabled=not args.quiet and bool(phases))
    try:
        if args.offload and streams(read_supported_config(model_dir)["model_type"]):
            note, table = run_streamed(job)
        else:
            note, table = run_in_memory(job)
    finally:
        took = job.progress.close()
    print_summary(job, note, table)
    if not args.quiet:
        print(f"(job: {took})")
    return 0


# until a kind of work is measured, the kind whose rate stands in for it (laquant.progress)
PROXIES = {"calibrate": "prefill", "prefill_q": "prefill", "decode_q": "decode"}


def job_phases(job: Job) -> list[Phase]:
    """The job's phases and their work: tokens through the model, or decode steps."""
    args, phases = job.args, []

    def evaluations(label: str, suffix: str) -> None:
        for mode in args.eval_mode if job.eval_ids is not None else ():
            phases.append(Phase(f"{label} {mode}", mode + suffix,
                                work_units(len(job.eval_ids), args.eval_context, mode, args.batch_size)))

    evaluations("bf16", "")
    if job.batches is not None:
        phases.append(Phase("calibration", "calibrate", job.batches.numel()))
    evaluations(job.recipe["name"], "_q")
    return phases


def run_in_memory(job: Job) -> tuple[str, str]:
    args = job.args
    model, mixers = load(job)
    probe_job(job, model)
    base = measure(job, model, "bf16", mixers, None)
    with calibration_phase(job):
        result = calibrate(model, job.recipe, data=job.batches, stats=job.stats, seed=args.seed,
                           progress=not args.quiet, layerwise_device=job.device if args.offload else None,
                           on_units=job.progress.advance)
    quant = measure(job, model, job.recipe["name"], mixers, result.decisions)
    rows = [("bf16", base), (job.recipe["name"], quant)]
    table = comparison_table(rows)
    note = eval_note(job)
    save_and_plot(job, result, rows, report(job, result, table, note))
    return note, table


# up to this size, a throw-away copy of the model is quantized before the job, to time the quantized
# model's evaluation from the start
PROBE_COPY_BYTES = 2**30


def probe_job(job: Job, model, tokens: int = 256) -> None:
    """Times calibration (observers attached) on one ``tokens``-token window, and the evaluation of
    a copy of the model quantized with those statistics (wrong numbers, the same work), for the
    job's estimate; all of it thrown away. Not with --offload (the model is not on the device)."""
    args = job.args
    if job.batches is None or args.quiet or args.offload:
        return
    sample = job.batches[:1, :tokens]
    t0 = time.perf_counter()
    stats = collect_stats(model, get_adapter(model), sample, segment=tokens, progress=False)
    job.progress.probe("calibrate", time.perf_counter() - t0, sample.numel())
    if job.eval_ids is None or sum(p.nbytes for p in model.parameters()) > PROBE_COPY_BYTES:
        return
    stand_in = calibrate(copy.deepcopy(model), job.recipe, stats=stats, progress=False).model
    for mode in args.eval_mode:
        job.progress.probe(mode + "_q", *probe(stand_in, job.eval_ids, args.eval_context, mode, args.batch_size))


def calibration_phase(job: Job):
    return job.progress.phase("calibration") if job.batches is not None else contextlib.nullcontext()


def run_streamed(job: Job) -> tuple[str, str]:
    """``--offload`` on laquant's own families: calibrated and written layer by layer from the model's
    files (:mod:`laquant.streaming`), never whole in memory, except to evaluate: the bf16 model is
    loaded for its perplexity and freed, the checkpoint is written, then loaded for the quantized
    model's; report.md and eval.json are added after."""
    args = job.args
    base = {}
    if job.eval_ids is not None:
        model, _ = load_model(job.model_dir, device="cpu")
        base = perplexities(job, model, "bf16")
        del model
    with calibration_phase(job):
        result = calibrate_streamed(job.model_dir, job.recipe, data=job.batches, stats=job.stats, seed=args.seed,
                                    progress=not args.quiet, device=job.device, on_units=job.progress.advance)
    mixers = {n: vars(i) for n, i in get_adapter(result.model).mixers().items()}
    save(result, job.out, tokenizer=job.tokenizer, overwrite=args.overwrite, max_shard_size=args.max_shard_size,
         progress=not args.quiet)
    try:
        base.update(model_bytes=sum(result.stream.bytes.values()), state_bytes=state_bytes_per_sequence(mixers, None))
        quant = {}
        if job.eval_ids is not None:
            model, _ = laquant_load(job.out, verify=False)
            quant = perplexities(job, model, job.recipe["name"])
            del model
        quant.update(model_bytes=result.stream.quantized_bytes,
                     state_bytes=state_bytes_per_sequence(mixers, result.decisions))
        rows = [("bf16", base), (job.recipe["name"], quant)]
        table, note = comparison_table(rows), eval_note(job)
        _add_eval_and_plots(job, result, rows, {"report.md": report(job, result, table, note)})
    except BaseException:  # a run either completes or leaves nothing
        shutil.rmtree(job.out, ignore_errors=True)
        raise
    return note, table


def print_summary(job: Job, note: str, table: str) -> None:
    args = job.args
    if args.format == "compressed-tensors":
        files = "model.safetensors, config.json, serving.md, recipe.yaml"
    else:
        shards = len(weight_files(job.out))
        weights = "model.safetensors" if shards == 1 else f"{shards} weight shards + model.safetensors.index.json"
        files = f"{weights}, config.json, recipe.yaml, stats.safetensors, laquant.json"
    print(f"\n{note}\n\n{table}\n\nwrote {job.out}/ ({files}, report.md, plots/)")


def check_inputs(args: argparse.Namespace, recipe: dict, out: Path, model_dir: Path) -> Job:
    device = pick_device(args.device)
    read_supported_config(model_dir)
    tokenizer = load_tokenizer(model_dir)
    stats = Stats.load(args.stats) if args.stats else None
    batches = None
    if stats is None:
        calib_ids = tokenize(load_text(args.data), tokenizer)
        if len(calib_ids) == 0:
            raise LaquantError(f"calibration data {args.data!r} has no tokens")
        batches = calibration_batches(calib_ids, args.samples, args.seq_len, args.seed)
    eval_ids = None
    if not args.no_eval:
        eval_ids = tokenize(load_text(args.eval_data), tokenizer)[: args.eval_max_tokens]
        strided_windows(len(eval_ids), args.eval_context, default_stride(args.eval_context))
    return Job(args, device, recipe, out, model_dir, tokenizer, stats, batches, eval_ids)


def load(job: Job) -> tuple[torch.nn.Module, dict]:
    """The model (where it waits between steps) and its mixers' shapes, for the state sizes."""
    model, _ = load_model(job.model_dir, device=job.home)
    return model, {n: vars(i) for n, i in get_adapter(model).mixers().items()}


def measure(job: Job, model, label: str, mixers: dict, decisions: Decisions | None) -> dict:
    """One row of the comparison: perplexity per mode (unless --no-eval), model and state bytes."""
    row = perplexities(job, model, label) if job.eval_ids is not None else {}
    row.update(model_bytes=model_bytes(model), state_bytes=state_bytes_per_sequence(mixers, decisions))
    return row


def perplexities(job: Job, model, label: str) -> dict:
    """Perplexity per --eval-mode. Each model is probed first (a prefill window, a few decode steps),
    so the job's estimate rests on measured rates: the bf16 model's from the start, the quantized
    model's from its evaluation on."""
    args = job.args
    model.to(job.device)
    row = {}
    kind = "" if label == "bf16" else "_q"
    for mode in args.eval_mode if not args.quiet else ():
        job.progress.probe(mode + kind, *probe(model, job.eval_ids, args.eval_context, mode, args.batch_size))
    for mode in args.eval_mode:
        with job.progress.phase(f"{label} {mode}"):
            res = perplexity(model, job.eval_ids, context=args.eval_context, mode=mode, batch_size=args.batch_size,
                             progress=not args.quiet, on_units=job.progress.advance)
        row[mode] = res.ppl
        row[f"{mode}_loss_by_position"] = res.loss_by_position
        if res.saturation is not None:  # decode: the totals (eval.json); by position: `laquant eval ppl --json`
            row[f"{mode}_saturation"] = {k: v for k, v in res.saturation.items() if not k.endswith("by_position")}
        if not args.quiet:
            tqdm.write(f"  {label} {mode}: ppl {res.ppl:.3f}")  # above the progress lines
    model.to(job.home)
    return row


def eval_note(job: Job) -> str:
    args = job.args
    if job.eval_ids is None:
        return "Perplexity not evaluated (--no-eval)."
    return (f"Perplexity on `{args.eval_data}`, first {len(job.eval_ids)} tokens, context {args.eval_context}, "
            f"stride {default_stride(args.eval_context)}; prefill = chunked path, decode = token by token with "
            f"the state carried.")


def report(job: Job, result: Calibrated, table: str, note: str) -> str:
    args = job.args
    calib_info = {"samples": result.stats.meta["samples"], "seq_len": result.stats.meta["seq_len"],
                  "data": args.data if args.stats is None else f"stats from {args.stats}", "seed": args.seed}
    return report_markdown(job.recipe, str(job.model_dir), calib_info, table, result.stats, result.decisions, note)


def save_and_plot(job: Job, result: Calibrated, rows: list[tuple[str, dict]], report_md: str) -> None:
    """The checkpoint, then eval.json and the statistics plots added to it."""
    if job.args.format == "compressed-tensors":
        rows = save_compressed_tensors(job, result, rows, report_md)
    else:
        save(result, job.out, tokenizer=job.tokenizer, report=report_md, overwrite=job.args.overwrite,
             max_shard_size=job.args.max_shard_size)
    try:
        _add_eval_and_plots(job, result, rows)
    except BaseException:  # interrupted or failed after the move: a run either completes or leaves nothing
        shutil.rmtree(job.out, ignore_errors=True)
        raise


def _add_eval_and_plots(job: Job, result: Calibrated, rows: list[tuple[str, dict]], files: dict | None = None) -> None:
    summary = {"recipe": job.recipe["name"], "model": str(job.model_dir), "out": str(job.out),
               "format": job.args.format,
               "rows": [{"name": n, **{k: v for k, v in r.items() if not k.endswith("by_position")}} for n, r in rows]}
    threshold = job.recipe["projections"]["outlier_threshold"]
    add_to_folder(job.out, {**(files or {}), "eval.json": json.dumps(summary, indent=2) + "\n"},
                  lambda tmp: write_stat_plots(result.stats, tmp / "plots", threshold))


def save_compressed_tensors(job: Job, result: Calibrated, rows: list[tuple[str, dict]], report_md: str) -> list:
    """OUT in compressed-tensors form: the weights, config.json, tokenizer, serving.md (with the exported
    form's prefill perplexity beside laquant's, when prefill mode was evaluated), report.md and
    recipe.yaml. No stats.safetensors: engines load every *.safetensors file of a folder as weights.
    Returns the rows with the exported form's."""
    args = job.args
    prefill = job.eval_ids is not None and "prefill" in args.eval_mode
    ppl_rows = [(n, {"prefill": r["prefill"], "model_bytes": r["model_bytes"]}) for n, r in rows] if prefill else []
    with StagingDir(job.out, args.overwrite) as tmp:
        summary = write_compressed_tensors(result.model, result.decisions, tmp, job.tokenizer, args.outliers)
        exported = write_serving(tmp, summary, str(job.model_dir), job.recipe["name"], ppl_rows,
                                 job.eval_ids if prefill else None, args)
        (tmp / "report.md").write_text(report_md)
        (tmp / "recipe.yaml").write_text(recipe_to_yaml(job.recipe))
    return rows + ([("compressed-tensors export", exported)] if exported is not None else [])
