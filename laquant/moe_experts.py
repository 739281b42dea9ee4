"""Which of transformers' MoE experts implementations a decode step runs.

transformers runs a MoE layer's experts as ``grouped_mm`` (the tokens sorted by expert, one grouped GEMM reading
each chosen expert once) or ``batched_mm`` (the chosen experts' weights gathered per token and expert, then batched
GEMMs); its ``generate`` switches ``grouped_mm`` to ``batched_mm`` for decode steps on a GPU. Which is faster depends
on how many bytes the gather copies: on an H200, laquant's graphed loop on a 1.43B MiniMax-style model (top-2 of
experts of 16.5 MB) decodes with ``batched_mm`` 22% faster at B = 1 (33 MB gathered a layer; the grouped kernel, the
sort and the offsets cost more) and 9% faster at B = 2 (66 MB), 11% slower at B = 4 (132 MB), and 5.3x slower at
B = 64 (2.1 GB a layer) (``eval/results/experts_rule_h200/``; transformers' generate's graph steps alike,
``eval/results/hf_generate_moe_h200/``). So a decode step of laquant's
(:mod:`laquant.generate`'s loop, and the graph steps of transformers' ``generate``,
:mod:`laquant.models.graphed_step`) runs ``batched_mm`` where a step would gather at most
:data:`BATCHED_MM_MAX_BYTES` of one layer's expert weights, ``grouped_mm`` where more; prefills keep the model's
setting.
"""

from __future__ import annotations

from contextlib import contextmanager

BATCHED_MM_MAX_BYTES = 96 << 20  # between the 66 MB measured faster batched and the 132 MB slower
_RULED = ("grouped_mm", "batched_mm")  # other implementations (eager, a user's kernel) are left as they are


def gathered_bytes(model, batch: int) -> int:
    """The most bytes of expert weights that ``batched_mm`` gathers in one MoE layer for ``batch`` tokens
    (each token's ``num_experts_per_tok`` experts); 0 without transformers' experts modules."""
    most = 0
    for m in model.modules():
        top_k = getattr(getattr(m, "config", None), "num_experts_per_tok", None)
        if not hasattr(m, "has_gate") or not isinstance(top_k, int):  # transformers' experts modules only
            continue
        weights = [getattr(m, n, None) for n in ("gate_up_proj", "up_proj", "down_proj")]
        per_expert = sum(w[0].numel() * w.element_size() for w in weights if hasattr(w, "element_size"))
        most = max(most, batch * top_k * per_expert)
    return most


def decode_experts_implementation(model, batch: int) -> dict | None:
    """The experts implementation (per sub-config, as ``model.set_experts_implementation`` takes it) of a decode
    step of ``batch`` tokens: ``batched_mm`` where it gathers at most :data:`BATCHED_MM_MAX_BYTES` of a layer's
    expert weights, else ``grouped_mm``, for the sub-configs set to either. None: the model's setting stands (no
    MoE experts, another implementation, or the rule's choice already)."""
    get = getattr(model, "get_experts_implementation", None)
    current = get() if get is not None else {}
    if not any(v in _RULED for v in current.values()):
        return None
    gathered = gathered_bytes(model, batch)
    if not gathered:
        return None
    choice = "batched_mm" if gathered <= BATCHED_MM_MAX_BYTES else "grouped_mm"
    wanted = {k: choice if v in _RULED else v for k, v in current.items()}
    return None if wanted == current else wanted


@contextmanager
def experts_implementation(model, implementation: dict | None):
    """``model`` runs the MoE experts ``implementation`` inside (None: as it is set)."""
    if implementation is None:
        yield
        return
    before = model.get_experts_implementation()
    model.set_experts_implementation(implementation)
    try:
        yield
    finally:
        model.set_experts_implementation(before)
