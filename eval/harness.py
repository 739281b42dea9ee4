"""lm-evaluation-harness on laquant models: ``lm_eval.simple_evaluate`` with ``HFLM(pretrained=<the
model laquant loaded>)``, so lm-eval never has to load a laquant checkpoint itself.

A baseline (the unquantized model) runs through the same path in the same compute dtype. A local
text file becomes a ``loglikelihood_rolling`` task (word / byte perplexity, bits per byte) with no
download: :func:`text_task`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from laquant.errors import LaquantError

TEXT_TASK = "laquant_text"
PERPLEXITY_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def require_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError:
        raise LaquantError("lm-evaluation-harness (with its Hugging Face backend) is not installed: "
                           "`pip install \"laquant[lm-eval]\"` (lm_eval 0.4 and accelerate) and retry") from None


def text_task(text_file: Path, folder: Path, name: str = TEXT_TASK) -> Path:
    """A task folder for ``TaskManager(include_path=...)``: ``text_file`` split at blank lines into
    documents, each scored with ``loglikelihood_rolling`` (lm-eval's perplexity task type)."""
    text_file = Path(text_file)
    if not text_file.is_file():
        raise LaquantError(f"text file not found: {text_file}")
    try:
        text = text_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LaquantError(f"{text_file} is not UTF-8 text") from None
    docs = [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]
    if not docs:
        raise LaquantError(f"{text_file} has no text")
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    metrics = "".join(f"  - metric: {m}\n" for m in PERPLEXITY_METRICS)
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data.absolute()))}\n"
        "test_split: test\n"
        "output_type: loglikelihood_rolling\n"
        "doc_to_text: \"\"\n"
        "doc_to_target: \"{{text}}\"\n"
        f"metric_list:\n{metrics}"
        "metadata:\n  version: 1.0\n")
    return folder


def task_manager(tasks: list[str], include_paths: list[Path] = ()):
    """lm-eval's task index with ``include_paths``; its own tasks are indexed only if asked for
    (indexing them all takes seconds). Every task must be known."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    include = [str(p) for p in include_paths] or None
    manager = TaskManager(include_path=include, include_defaults=False) if include else None
    if manager is None or not all(manager.match_tasks([t]) for t in tasks):
        manager = TaskManager(include_path=include)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise LaquantError(f"lm-eval has no task {', '.join(map(repr, unknown))}; "
                           "name an lm-eval task, or pass --text FILE for a local perplexity task")
    return manager


def evaluate(model, tokenizer, tasks: list[str], manager, *, batch_size: int = 1, limit: int | float | None = None,
             num_fewshot: int | None = None, max_length: int | None = None, seed: int = 0,
             graphed: bool = False) -> dict:
    """lm-eval's results for an already loaded ``model`` (``manager`` from :func:`task_manager`):
    ``{"results": {task: {metric: value}}, "n_samples": ..., "model_num_parameters": ...,
    "model_dtype": ...}``. ``graphed``: lm-eval's scoring forwards replay CUDA graphs where the model allows it
    (``model.laquant_graph_forward`` on for the call: :mod:`laquant.serving.graphed_forward`; padded to length
    buckets, so the scores move by rounding), and so do a transformers hybrid's prefills in its generation tasks
    (``model.laquant_graph_prefill``: :mod:`laquant.serving.graphed_hybrid_prefill`; their decode steps replay graphs
    anyway)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size,
              max_length=max_length)
    switches = ("laquant_graph_forward", "laquant_graph_prefill")
    before = {name: model.__dict__.get(name) for name in switches}
    if graphed:
        for name in switches:
            setattr(model, name, True)
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                                      num_fewshot=num_fewshot, log_samples=False, random_seed=seed,
                                      numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
                                      bootstrap_iters=0)
    finally:
        for name, value in before.items():
            if value is None:
                model.__dict__.pop(name, None)
            else:
                setattr(model, name, value)
        from laquant.generate import release_graphs

        release_graphs(model)  # the forwards' logits buffers (B x bucket x vocab each), the prefills' activations
    results = {task: {k.split(",")[0]: v for k, v in r.items() if k != "alias" and isinstance(v, (int, float))}
               for task, r in out["results"].items()}
    info = lm.get_model_info()
    return {"results": results, "n_samples": out.get("n-samples", {}),
            "model_num_parameters": info["model_num_parameters"], "model_dtype": str(info["model_dtype"])}


def dtype_for(spec: str, model_dir: Path) -> torch.dtype:
    """``auto``: the dtype the checkpoint's config.json names (a laquant checkpoint records its base
    model's), so the baseline and the quantized model compute alike; else the named dtype."""
    from laquant.loading import config_dtype, read_config

    if spec == "auto":
        return config_dtype(read_config(model_dir))
    return getattr(torch, spec)
