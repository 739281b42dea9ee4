"""Perplexity eval: window bookkeeping, prefill/decode agreement, known answers."""

import math

import pytest
import torch

from laquant.errors import LaquantError
from laquant.eval.ppl import perplexity, strided_windows
from laquant.loading import load_model


@pytest.mark.parametrize("n,context,stride", [(100, 32, 16), (100, 32, 31), (97, 10, 3), (64, 64, 8), (65, 64, 63), (1000, 7, 1)])
def test_every_token_after_the_first_is_scored_once(n, context, stride):
    scored = torch.zeros(n, dtype=torch.long)
    for w in strided_windows(n, context, stride):
        assert w.end - w.begin <= context and w.begin < w.first_target <= w.end
        scored[w.first_target:w.end] += 1
    assert scored[0] == 0 and (scored[1:] == 1).all()


def test_window_errors():
    with pytest.raises(LaquantError, match="longer than the data"):
        strided_windows(10, 32, 16)
    with pytest.raises(LaquantError, match="--stride"):
        strided_windows(100, 32, 32)


@torch.no_grad()
def test_prefill_and_decode_agree(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (300,))
    pre = perplexity(model, ids, context=64, stride=24, mode="prefill", batch_size=3, progress=False)
    dec = perplexity(model, ids, context=64, stride=24, mode="decode", batch_size=5, progress=False)
    assert pre.tokens_scored == dec.tokens_scored == 299
    assert math.isfinite(pre.ppl)
    assert abs(pre.nll - dec.nll) < 1e-5
    assert len(pre.loss_by_position) == 64


@torch.no_grad()
def test_uniform_model_has_perplexity_equal_to_vocab(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    model.lm_head.weight.zero_()  # every logit 0 -> uniform over 8192 tokens
    res = perplexity(model, torch.randint(0, 8192, (200,)), context=50, mode="prefill", progress=False)
    assert res.ppl == pytest.approx(8192, rel=1e-5)


@torch.no_grad()
def test_embedded_model_is_a_language_model():
    """The shipped model beats a unigram model by far, and its two modes agree on real text."""
    from laquant.data import load_text, tokenize

    model, tokenizer = load_model()
    ids = tokenize(load_text("wikitext2"), tokenizer)
    counts = torch.bincount(ids, minlength=model.config.vocab_size).double()
    probs = counts / counts.sum()
    unigram_ppl = math.exp(-(probs[ids[1:]].log()).mean().item())  # unigram fitted on the test text itself
    sample = ids[:1537]
    pre = perplexity(model, sample, context=512, mode="prefill", progress=False)
    dec = perplexity(model, sample, context=512, mode="decode", progress=False)
    assert abs(pre.nll - dec.nll) < 1e-4
    assert pre.ppl < unigram_ppl / 2, (pre.ppl, unigram_ppl)


def test_the_embedded_model_is_named_gla_small_everywhere(tmp_path, monkeypatch):
    from laquant.loading import default_model_dir, resolve_model_dir

    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("gla-small") == resolve_model_dir(None) == default_model_dir()
    (tmp_path / "gla-small").mkdir()  # a local folder of that name wins
    assert resolve_model_dir("gla-small").resolve() == (tmp_path / "gla-small").resolve()


@torch.no_grad()
def test_loss_by_position_all_averages_every_window(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (200,))
    res = perplexity(model, ids, context=40, stride=20, mode="prefill", batch_size=4, progress=False)
    windows = strided_windows(200, 40, 20)
    inputs = torch.stack([ids[w.begin:w.end] for w in windows])
    nll = torch.nn.functional.cross_entropy(model(input_ids=inputs).logits[:, :-1].flatten(0, 1),
                                            inputs[:, 1:].flatten(), reduction="none").view(len(windows), -1)
    assert res.loss_by_position_all[0] == 0.0 and not res.graphed
    assert torch.allclose(torch.tensor(res.loss_by_position_all[1:], dtype=torch.float64), nll.double().mean(0), atol=1e-5)


@pytest.mark.gpu
@torch.no_grad()
def test_graphed_decode_equals_the_eager_loop(tiny_model_dir):
    from conftest import graphed_and_eager_perplexity

    from laquant.kernels.common.state import StateQuantizer

    model, _ = load_model(tiny_model_dir)
    model = model.cuda()
    for m in model.modules():
        if hasattr(m, "state_quantizer"):
            m.state_quantizer = StateQuantizer("fp8_row", 1, rounding="stochastic")
    ids = torch.randint(0, 8192, (700,))
    graphed, eager = graphed_and_eager_perplexity(model, ids, context=128, stride=64, batch_size=4)
    assert graphed.nll == pytest.approx(eager.nll, abs=1e-6)
    assert graphed.loss_by_position_all == pytest.approx(eager.loss_by_position_all, abs=1e-5)
    # the counters run inside the graph: the same counts as the eager loop's (the last batch of
    # 10 windows is padded to 4 rows in the graph; its copies are not counted)
    assert len(strided_windows(700, 128, 64)) % 4 != 0
    assert graphed.saturation["state_elements"] > 0 and graphed.saturation == eager.saturation


def test_decode_counts_state_and_gate_saturation_by_position(tiny_model_dir):
    """fp32 state: nothing at a limit. int8 per-row state with fresh scales: every row's largest
    element sits on 127 (one per row and step, exactly). Static scales far too small: most of the
    state clips to the limit. Gates clamped to a range narrower than their logits: counted."""
    from laquant.kernels.common.state import StateQuantizer

    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (200,), generator=torch.Generator().manual_seed(0))
    plain = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False).saturation
    assert plain["state_formats"] == ["fp32"] and plain["state_at_limit"] == 0 and plain["state_nonfinite"] == 0
    assert plain["gate_elements"] == 0 and len(plain["state_at_limit_by_position"]) == 48
    assert perplexity(model, ids, context=48, mode="prefill", progress=False).saturation is None

    mixers = [layer.attn for layer in model.model.layers]
    H, K, V = mixers[0].num_heads, mixers[0].head_k_dim, mixers[0].head_v_dim
    for m in mixers:
        m.state_quantizer = StateQuantizer("int8_row")
    res = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False)
    sat = res.saturation
    sequences = sat["state_elements"] // (47 * len(mixers) * H * K * V)  # windows decoded, over all batches
    assert sat["state_at_limit"] >= sequences * 47 * len(mixers) * H * K  # >= one element per row and step
    assert 0 < sat["state_at_limit_fraction"] < 0.2 and sat["state_at_limit_by_position"][-1] == 0  # last: no step

    for m in mixers:
        m.state_quantizer = StateQuantizer("int8_row", renorm_interval=0, static_scale=torch.full((H, K, 1), 1e-6))
    clipped = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False).saturation
    assert clipped["state_at_limit_fraction"] > 0.5

    from laquant import calibrate
    from laquant.calibration.run import calibration_batches

    model, _ = load_model(tiny_model_dir)
    calibrate(model, "gla_gates_int8", data=calibration_batches(ids, 2, 64, 0), progress=False)
    gate = model.model.layers[0].attn.gk_proj
    gate.logit_max.copy_(gate.logit_min + 1e-3)  # a range no logit fits in
    sat = perplexity(model, ids, context=48, stride=24, mode="decode", batch_size=4, progress=False).saturation
    assert sat["gate_elements"] > 0 and sat["gate_clamped"] > 0.9 * sat["gate_elements"] / len(mixers)


def test_long_decode_tool_reports_loss_nonfinite_and_saturation_by_position(tiny_model_dir, tmp_path):
    """tools/long_decode.py (the long GPU decode's script) end to end on the CPU with a tiny N."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "long"
    proc = subprocess.run([sys.executable, str(root / "tools" / "long_decode.py"), str(tiny_model_dir),
                           "--recipe", "gla_int8_all", "--calib-samples", "1", "--calib-seq-len", "64",
                           "--tokens", "40", "--batch", "2", "--bucket", "8", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "long_decode.json").read_text())
    assert res["tokens"] == 40 and res["batch"] == 2 and res["nonfinite_logits"] == 0
    assert len(res["loss_by_position"]) == 5 and all(math.isfinite(v) and v > 0 for v in res["loss_by_position"])
    sat = res["saturation"]
    assert sat["state_formats"] == ["int8_row"] and sat["state_nonfinite"] == 0
    assert len(sat["state_at_limit_by_position"]) == 5 and sat["state_at_limit"] > 0
    assert (out / "long_decode.png").stat().st_size > 1000


def test_long_context_eval_split_across_processes_merges_to_the_one_process_run(tiny_model_dir, tmp_path,
                                                                              monkeypatch):
    """tools/long_context_eval.py: the reference and a variant run as two parts (--no-reference on
    the second) and merged give the numbers of one process running both, and the change against bf16."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "long_context_eval", Path(__file__).resolve().parents[1] / "tools" / "long_context_eval.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    common = ["long_context_eval.py", "--model", str(tiny_model_dir), "--device", "cpu", "--data", "wikitext2",
              "--contexts", "48", "--max-windows", "3"]

    def run(*args):
        monkeypatch.setattr(sys, "argv", [*common, *args])
        tool.main()

    run("--out", str(tmp_path / "one"), "--variants", "gla_int8")
    run("--out", str(tmp_path / "ref"), "--variants")
    run("--out", str(tmp_path / "part"), "--variants", "gla_int8", "--no-reference")
    run("--out", str(tmp_path / "merged"), "--merge", str(tmp_path / "ref"), str(tmp_path / "part"))
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert merged["variants"] == one["variants"] == ["bf16", "gla_int8"]
    a, b = one["runs"]["wikitext2/48"], merged["runs"]["wikitext2/48"]
    for v in ("bf16", "gla_int8"):
        assert a[v]["ppl"] == b[v]["ppl"] and math.isfinite(a[v]["ppl"])
    assert a["gla_int8"]["ppl_change_pct"] == b["gla_int8"]["ppl_change_pct"] != 0
    # the parts keep their loss curves in float32 (loss_by_position.npz): the drift agrees to that
    assert b["gla_int8"]["drift_by_position"]["mean"] == pytest.approx(a["gla_int8"]["drift_by_position"]["mean"],
                                                                       rel=1e-3, abs=1e-6)
    assert b["gla_int8"]["drift_last10pct"] == pytest.approx(a["gla_int8"]["drift_last10pct"], rel=1e-3, abs=1e-6)
    assert "| gla_int8 |" in (tmp_path / "merged" / "summary.md").read_text()
    assert (tmp_path / "merged" / "plots" / "drift_wikitext2_48.png").stat().st_size > 1000
    part = json.loads((tmp_path / "part" / "results.json").read_text())
    assert part["variants"] == ["gla_int8"] and "bf16" not in part["runs"]["wikitext2/48"]
    with pytest.raises(FileNotFoundError):
        run("--out", str(tmp_path / "x"), "--merge", str(tmp_path / "ref"), str(tmp_path / "nothing"))


@torch.no_grad()
def test_saturation_counts_only_the_rows_asked_for_at_a_device_position(tiny_model_dir):
    """The counter's position and counted rows are device tensors (so a CUDA graph can replay it):
    a batch padded to 4 rows with 2 real ones counts half the elements, at the right bucket."""
    from laquant.adapters import new_cache
    from laquant.eval.saturation import SaturationCounter

    model, _ = load_model(tiny_model_dir)
    cache = new_cache(model)
    model(input_ids=torch.randint(0, 8192, (4, 1)), past_key_values=cache, use_cache=True)
    counter = SaturationCounter(model, length=6, bucket=2)
    counter.start_sequence()
    counter.after_step(cache)
    full = int(counter.state_elements[0])
    counter.start_sequence(rows=2)
    for _ in range(3):
        counter.after_step(cache)
    assert full > 0 and counter.state_elements.tolist() == [2 * full, full // 2, 0]  # positions 0, 1 | 2
    counter.active = False
    counter.after_step(cache)
    assert int(counter.position) == 3 and int(counter.state_elements.sum()) == 5 * full // 2


def test_a_refused_capture_scores_eagerly_with_the_same_numbers(tiny_model_dir, monkeypatch):
    """Where the GPU refuses to capture the decode step (simulated on the CPU: the scorer's
    constructor raises, after the first window's first step was counted), the batches are scored
    eagerly, with the same losses and saturation counts as the eager loop (the counted first step
    undone), a warning, and ``graphed`` False."""
    import laquant.eval.ppl as ppl
    from laquant.kernels.common.state import StateQuantizer

    model, _ = load_model(tiny_model_dir)
    for m in model.modules():
        if hasattr(m, "state_quantizer"):
            m.state_quantizer = StateQuantizer("int8_row")
    ids = torch.randint(0, 8192, (150,), generator=torch.Generator().manual_seed(2))
    eager = perplexity(model, ids, context=40, stride=20, mode="decode", batch_size=4, progress=False)

    class Refused:
        def __init__(self, *args):
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")

    made = []
    monkeypatch.setattr(ppl._GraphedScorer, "make",
                        classmethod(lambda cls, model, batch, context: made.append(1) or ppl._Lazy(
                            Refused, model, batch, context)))
    with pytest.warns(UserWarning, match="could not be captured"):
        fallback = perplexity(model, ids, context=40, stride=20, mode="decode", batch_size=4, progress=False)
    assert made and not fallback.graphed
    assert fallback.nll == pytest.approx(eager.nll, abs=1e-6)
    assert fallback.saturation == eager.saturation and eager.saturation["state_at_limit"] > 0
