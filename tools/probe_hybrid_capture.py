"""Why a captured cacheless forward of a transformers hybrid differed from its eager forward on an H200
(``eval/results/graphed_forward_h200/``: a random qwen3_next, 0.30-0.47 of the largest logit at a bucket's own length).

The suspect: transformers' mask builder asks ``find_packed_sequence_indices`` whether the positions pack several
sequences; that check reads the device, so it runs only outside a capture (``is_tracing`` is true while a stream
captures) and a capture takes the packed answer: an explicit mask where the eager call lets SDPA run ``is_causal``.
Per family (tiny random configs of the tests, bf16, CUDA), the largest difference from the eager forward, relative to
its largest logit, of: the eager forward with the packed answer forced (does the mask alone move the logits?), a capture
as it is, a capture with the check answered as eagerly (no packing: a capture's positions are ``arange``), and that
capture made on zero token ids and replayed on the real ones (as laquant's captures are: does anything in the forward
depend on the tokens at capture time?).

    python tools/probe_hybrid_capture.py [--families qwen3_next qwen3_next_dense qwen3_next_bench nemotron_h bamba]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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


def captured(model, ids, answer, zeros=False):
    """A capture's logits, the capture run on ``ids`` (or, ``zeros``, on zero token ids then replayed on ``ids``, as
    laquant's captures are); the masks the softmax layers got while capturing are printed."""
    gc.collect()  # a graph freed while another captures invalidates the capture (an earlier run's failure)
    static = torch.zeros_like(ids) if zeros else ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            logits(model, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if answer == "eager":  # laquant's captures: is_tracing and the packing check answered as outside a capture
        from laquant.serving.graphed_forward import _eager_masks

        context = _eager_masks()
    else:
        context = packed_answer(answer) if answer else contextlib.nullcontext()
    with context, recorded_masks() as masks, torch.cuda.graph(graph):
        out = logits(model, static)
    static.copy_(ids)
    graph.replay()
    torch.cuda.synchronize()
    print(f"    masks built in the capture: {sorted({type(m).__name__ for m in masks})}")
    return out.clone()


@contextlib.contextmanager
def recorded_masks():
    """The masks transformers' ``create_causal_mask`` returns inside (wrapped in every module that imported it)."""
    from transformers import masking_utils

    masks, patched = [], []
    original = masking_utils.create_causal_mask

    def wrapper(*args, **kwargs):
        masks.append(original(*args, **kwargs))
        return masks[-1]

    for mod in list(sys.modules.values()):
        if getattr(mod, "create_causal_mask", None) is original:
            patched.append(mod)
            mod.create_causal_mask = wrapper
    try:
        yield masks
    finally:
        for mod in patched:
            mod.create_causal_mask = original


def main(argv=None) -> int:
    from test_hybrid import FAMILIES

    from laquant.adapters import install

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=["qwen3_next", "qwen3_next_dense", "nemotron_h", "bamba"],
                   help="the tests' tiny configs; qwen3_next_bench: laquant eval speed's 1024 x 8 qwen3_next")
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in args.families:
        torch.manual_seed(0)
        if name == "qwen3_next_bench":
            from transformers import Qwen3NextForCausalLM

            from laquant.eval.speed import qwen3_next_config

            model = Qwen3NextForCausalLM(qwen3_next_config({}))
        else:
            family, kw = (name, {}) if name != "qwen3_next_dense" else ("qwen3_next", {"num_experts": 0})
            model = FAMILIES[family](**kw)
        model = model.to("cuda", torch.bfloat16).eval()
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
            for label, answer, zeros in (("captured as is", None, False),
                                         ("captured, packing answered", lambda position_ids: None, False),
                                         ("captured, eager masks", "eager", False),
                                         ("captured on zero ids, eager masks", "eager", True)):
                try:
                    print(f"  {name}: {label}")
                    rows[label] = captured(model, ids, answer, zeros).float()
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
