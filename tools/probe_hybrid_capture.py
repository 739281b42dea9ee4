"""Why a captured cacheless forward of a transformers hybrid differed from its eager forward on an H200
(``eval/results/graphed_forward_h200/``: a random qwen3_next, 0.30-0.47 of the largest logit at a bucket's own length).

The suspect: transformers' mask builder asks ``find_packed_sequence_indices`` whether the positions pack several
sequences; that check reads the device, so it runs only outside a capture (``is_tracing`` is true while a stream
captures) and a capture takes the packed answer: an explicit mask where the eager call lets SDPA run ``is_causal``.
Per family (tiny random configs of the tests, bf16, CUDA), the largest difference from the eager forward, relative to
its largest logit, of: the eager forward with the packed answer forced (does the mask alone move the logits?), a capture
as it is, and a capture with the check answered as eagerly (no packing: a capture's positions are ``arange``).

    python tools/probe_hybrid_capture.py [--families qwen3_next qwen3_next_dense nemotron_h bamba]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


@contextlib.contextmanager
def packed_answer(value):
    """transformers' packing check answered ``value(position_ids)`` inside."""
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = value
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def packed(position_ids):
    return torch.zeros_like(position_ids)  # one sequence a row, as an explicit answer (what a capture computes)


def logits(model, ids):
    return type(model).forward(model, input_ids=ids, use_cache=False).logits


def captured(model, ids, answer):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            logits(model, ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with packed_answer(answer) if answer else contextlib.nullcontext(), torch.cuda.graph(graph):
        out = logits(model, ids)
    graph.replay()
    torch.cuda.synchronize()
    return out.clone()


def main(argv=None) -> int:
    from test_hybrid import FAMILIES

    from laquant.adapters import install

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["qwen3_next", "qwen3_next_dense", "nemotron_h", "bamba"])
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in args.families:
        family, kw = (name, {}) if name != "qwen3_next_dense" else ("qwen3_next", {"num_experts": 0})
        torch.manual_seed(0)
        model = FAMILIES[family](**kw).to("cuda", torch.bfloat16).eval()
        install(model)
        get = getattr(model, "get_experts_implementation", None)
        ids = torch.randint(1, 8000, (2, args.tokens), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        with torch.no_grad():
            ref = logits(model, ids).float()
            top = ref.abs().max().item()
            again = logits(model, ids).float()
            with packed_answer(packed):
                forced = logits(model, ids).float()
            rows = {"eager again": again, "eager, packed answer": forced}
            for label, answer in (("captured as is", None), ("captured, answered eagerly", lambda position_ids: None)):
                try:
                    rows[label] = captured(model, ids, answer).float()
                except Exception as exc:  # noqa: BLE001 (a probe: report and go on)
                    print(f"{name}: {label}: {type(exc).__name__}: {str(exc)[:200]}")
        print(f"{name} (experts {get() if get else '-'}), largest |logit| {top:.3f}:")
        for label, out in rows.items():
            diff = (out - ref).abs().max().item()
            same = torch.equal(out, ref)
            print(f"  {label:28s} max |diff| {diff:.4g} ({diff / top:.3g} of the largest), equal {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
