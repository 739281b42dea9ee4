"""Calibration, layer rewriting, export and reload (tiny random model: plumbing, not accuracy)."""

import json

import pytest
import torch
from safetensors.torch import load_file

import laquant
from conftest import checkpoint_decisions, rel_err, same_tensors
from laquant.adapters import get_adapter
from laquant.calibration.run import calibration_batches, collect_stats
from laquant.cli import main
from laquant.errors import LaquantError
from laquant.quant.modules import QuantGate, QuantLinear
from laquant.kernels.common.state import StateQuantizer
from laquant.recipe import available_recipes, load_recipe


@pytest.fixture(scope="module")
def calib_ids(tiny_model_dir):
    from laquant.data import load_text, tokenize

    _, tok = laquant.load_model(tiny_model_dir)
    return tokenize(load_text("calibration")[:60_000], tok)


@torch.no_grad()
def test_stats_match_what_the_model_computes(tiny_model_dir, calib_ids):
    model, _ = laquant.load_model(tiny_model_dir)
    batches = calibration_batches(calib_ids, samples=3, seq_len=200, seed=1)
    seen = {}
    h = model.model.layers[1].attn.q_proj.register_forward_pre_hook(
        lambda m, a: seen.__setitem__("x", torch.maximum(seen.get("x", torch.zeros(64)), a[0].abs().amax((0, 1)))))
    stats = collect_stats(model, get_adapter(model), batches, segment=64, progress=False)
    h.remove()
    name = "model.layers.1.attn.q_proj"
    assert torch.equal(stats.get(name, "act_absmax"), seen["x"])
    assert (stats.get(name, "act_p999") <= stats.get(name, "act_absmax") + 1e-3).all()
    over = stats.over_threshold(name, 0.5)
    assert ((over >= 0) & (over <= 1)).all() and over.sum() > 0
    assert stats.get("model.layers.0.attn", "checkpoints").tolist() == [64, 128, 192, 200]
    assert stats.get("model.layers.0.attn", "state_trajectory").shape == (4, 2, 16)
    assert (stats.get("model.layers.0.attn.gk_proj", "log_decay_min") <= 0).all()
    assert all(torch.isfinite(t).all() for t in stats.tensors.values())


@torch.no_grad()
def test_layer_by_layer_calibration_equals_whole_model(tiny_model_dir, calib_ids):
    """Onloading one decoder layer at a time gives the same statistics (percentiles included: their
    histograms do not depend on the order of the tokens) and the same quantization decisions."""
    from laquant.quantize import plan
    from laquant.recipe import load_recipe

    model, _ = laquant.load_model(tiny_model_dir)
    adapter = get_adapter(model)
    batches = calibration_batches(calib_ids, samples=5, seq_len=200, seed=2)
    whole = collect_stats(model, adapter, batches, segment=64, batch_size=2, progress=False)
    layerwise = collect_stats(model, adapter, batches, segment=64, batch_size=2, progress=False,
                              layerwise_device="cpu")
    assert whole.tensors.keys() == layerwise.tensors.keys()
    for key, t in whole.tensors.items():
        assert torch.equal(t, layerwise.tensors[key]), key
    recipe = load_recipe("gla_int8_all")
    assert plan(adapter, whole, recipe) == plan(adapter, layerwise, recipe)


def test_histogram_percentiles_are_close_to_the_exact_ones():
    """The observers' percentiles (log2 histograms, 8 bins per octave) against torch.quantile of
    all values: within a bin's width (9%), on heavy-tailed and signed data."""
    from laquant.calibration.observers import LogHistogram

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(30_000, 6, generator=gen) * torch.tensor([0.02, 0.3, 1.0, 4.0, 60.0, 900.0])
    x[:, 2] = torch.distributions.StudentT(2.0).sample((30_000,))  # heavy tails
    mags = LogHistogram(6, signed=False)
    values = LogHistogram(6, signed=True)
    for part in x.split(7_001):  # in pieces, as calls arrive
        mags.add(part.abs())
        values.add(part)
    for hist, data, qs in ((mags, x.abs(), (0.5, 0.999)), (values, x, (0.001, 0.999))):
        for q in qs:
            exact = torch.quantile(data, q, dim=0)
            assert ((hist.quantile(q) - exact).abs() <= 0.09 * exact.abs()).all(), (q, hist.quantile(q), exact)
    assert torch.equal(LogHistogram(1, signed=True).quantile(0.5), torch.zeros(1))  # nothing seen: 0, not NaN


def test_calibration_memory_is_bounded_by_the_model_not_the_tokens(tiny_model_dir, calib_ids, monkeypatch):
    """What the observers keep (every tensor they hold after the pass) is the same for N and 2N
    samples, and a small multiple of the observed channels; the transient memory of one call is
    bounded by one batch segment (a per-call check, not the RSS of this shared process)."""
    from laquant.calibration import observers

    made = []
    for cls in (observers.ProjectionObserver, observers.GateObserver, observers.StateObserver):
        monkeypatch.setattr(cls, "__init__", (lambda init: lambda self, *a, **k: (made.append(self), init(self, *a, **k))[1])(cls.__init__))

    def held(obj, seen=None) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        if isinstance(obj, dict):
            return sum(held(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(held(v) for v in obj)
        if hasattr(obj, "__dict__") and not callable(obj):
            return sum(held(v) for k, v in vars(obj).items())
        return 0

    model, _ = laquant.load_model(tiny_model_dir)
    adapter = get_adapter(model)
    kept = {}
    for samples in (2, 4):
        made.clear()
        collect_stats(model, adapter, calibration_batches(calib_ids, samples=samples, seq_len=128, seed=0),
                      segment=64, batch_size=2, progress=False)
        kept[samples] = sum(held(o) for o in made)
    assert kept[2] == kept[4]
    params = sum(p.numel() for p in model.parameters())
    channels = sum(m.in_features for m in {**adapter.projections(), **adapter.attention_projections()}.values())
    assert kept[4] <= channels * (2 * 2 * 12 * 8 * 4 + 64 * 8) + 4 * params  # histograms + levels, plus weight ranges


def test_a_projection_whose_every_input_channel_is_an_outlier_stays_bf16(tiny_model_dir, calib_ids):
    """The outlier split would leave no int8 column: the layer is kept, the others still quantized."""
    from laquant.quantize import plan
    from laquant.recipe import load_recipe

    model, _ = laquant.load_model(tiny_model_dir)
    adapter = get_adapter(model)
    stats = collect_stats(model, adapter, calibration_batches(calib_ids, samples=2, seq_len=64, seed=0),
                          progress=False)
    name = "model.layers.0.mlp.down_proj"
    absmax = stats.get(name, "act_absmax")
    stats.tensors[f"{name}/act_absmax"] = absmax.clamp_min(10.0)  # every channel above the threshold (6)
    decisions = plan(adapter, stats, load_recipe("gla_w8a8"))
    assert name not in decisions["projections"] and "model.layers.0.mlp.up_proj" in decisions["projections"]
    laquant.quantize.apply(model, adapter, decisions, stats)
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].mlp.up_proj, QuantLinear)


def _down_proj_with_outliers(tiny_model_dir, calib_ids, fraction: float):
    """The tiny model, its adapter and calibration stats in which the first ``fraction`` of layer 0's down_proj
    input channels are outliers (absmax 10, above the threshold of 6; the rest at most 1): ``(model, adapter,
    stats, absmax)``, ``absmax`` the stats' own tensor (changing it changes them)."""
    model, _ = laquant.load_model(tiny_model_dir)
    adapter = get_adapter(model)
    stats = collect_stats(model, adapter, calibration_batches(calib_ids, samples=2, seq_len=64, seed=0),
                          progress=False)
    name = "model.layers.0.mlp.down_proj"
    absmax = stats.get(name, "act_absmax").clamp_max(1.0)
    absmax[: int(absmax.numel() * fraction)] = 10.0
    stats.tensors[f"{name}/act_absmax"] = absmax
    return model, adapter, stats, absmax


def test_a_projection_with_more_outliers_than_the_recipe_allows_stays_bf16(tiny_model_dir, calib_ids):
    """More than ``outlier_max_fraction`` of the inputs above the threshold: the layer is kept in high
    precision; at the fraction, or with the limit null, it is quantized with those outlier columns."""
    from laquant.quantize import plan
    from laquant.recipe import load_recipe

    model, adapter, stats, absmax = _down_proj_with_outliers(tiny_model_dir, calib_ids, 1 / 4)
    name = "model.layers.0.mlp.down_proj"
    n = absmax.numel()
    at_limit = plan(adapter, stats, load_recipe("gla_w8a8"))  # the default limit: 0.25
    assert at_limit["projections"][name]["outliers"] == list(range(n // 4))
    absmax[n // 4] = 10.0  # one more
    assert name not in plan(adapter, stats, load_recipe("gla_w8a8"))["projections"]
    assert name in plan(adapter, stats, load_recipe("gla_w8a8", ["projections.outlier_max_fraction=0.5"]))["projections"]
    unlimited = plan(adapter, stats, load_recipe("gla_w8a8", ["projections.outlier_max_fraction=null"]))
    assert unlimited["projections"][name]["outliers"] == list(range(n // 4 + 1))


def test_the_outlier_fallback_makes_such_a_layer_weight_only(tiny_model_dir, calib_ids):
    """``outlier_fallback: weight_only``: a layer over the limit becomes weight-only int8 (no outlier columns, its
    inputs as they are: the dequantized weight times x) instead of staying bf16."""
    from laquant.quantize import plan

    model, adapter, stats, _ = _down_proj_with_outliers(tiny_model_dir, calib_ids, 1 / 2)
    name = "model.layers.0.mlp.down_proj"
    decisions = plan(adapter, stats, load_recipe("gla_w8a8", ["projections.outlier_fallback=weight_only"]))
    d = decisions["projections"][name]
    assert d["outliers"] == [] and d["act_granularity"] == "none"
    assert decisions["projections"]["model.layers.0.mlp.up_proj"]["act_granularity"] == "per_token"
    laquant.quantize.apply(model, adapter, decisions, stats)
    q = model.model.layers[0].mlp.down_proj
    assert isinstance(q, QuantLinear) and q.act_granularity == "none" and q.n_outliers == 0
    x = torch.randn(3, q.in_features) * 20  # outliers and all: no activation rounding
    with torch.no_grad():
        assert rel_err(q(x), x @ q.dequantized_weight().T) < 1e-6
    with pytest.raises(LaquantError, match="outlier_fallback = 'bf16' is not allowed; allowed: keep, weight_only"):
        load_recipe("gla_w8a8", ["projections.outlier_fallback=bf16"])


def test_weight_only_fallback_layers_save_and_reload_bit_exactly(tiny_model_dir, calib_ids, tmp_path):
    from laquant.loading import load_tokenizer

    model, _ = laquant.load_model(tiny_model_dir)
    recipe = load_recipe("gla_w8a8", ["projections.outlier_threshold=0.001", "projections.outlier_fallback=weight_only"])
    result = laquant.calibrate(model, recipe, calib_ids, samples=2, seq_len=64, progress=False)
    weight_only = [n for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.act_granularity == "none"]
    assert weight_only and all(result.decisions["projections"][n]["outliers"] == [] for n in weight_only)
    ids = calib_ids[:40][None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    laquant.save(result, tmp_path / "q", tokenizer=load_tokenizer())
    reloaded = laquant.load(tmp_path / "q")[0]
    assert all(reloaded.get_submodule(n).act_granularity == "none" for n in weight_only)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits)


def test_nan_during_calibration_names_the_module(tiny_model_dir, calib_ids):
    model, _ = laquant.load_model(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[0].attn.o_proj.weight[0, 0] = float("nan")
    with pytest.raises(LaquantError, match=r"NaN/Inf in the input of model\.layers\.0\.mlp\.(gate|up)_proj"):
        laquant.calibrate(model, "gla_int8", calib_ids, samples=2, seq_len=64, progress=False)


@torch.no_grad()
def test_gla_int8_rewrites_roles_and_stays_close(tiny_model_dir, calib_ids):
    model, _ = laquant.load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (2, 70))
    ref = model(input_ids=ids).logits
    res = laquant.calibrate(model, "gla_int8", calib_ids, samples=4, seq_len=128, progress=False)
    attn = model.model.layers[0].attn
    assert isinstance(attn.q_proj, QuantLinear) and isinstance(model.model.layers[1].mlp.down_proj, QuantLinear)
    assert isinstance(attn.gk_proj, QuantGate) and attn.state_quantizer.format.name == "int8_row"
    assert attn.state_quantizer.rounding == "stochastic"
    assert isinstance(model.lm_head, torch.nn.Linear) and isinstance(model.model.embeddings, torch.nn.Embedding)
    assert set(res.decisions) == {"projections", "gates", "state"}
    assert rel_err(model(input_ids=ids).logits, ref) < 0.05


@torch.no_grad()
@pytest.mark.parametrize("recipe", [r for r in available_recipes() if r != "hybrid_attention_w8a8"])  # GLA has none
def test_save_reload_bit_exact(tmp_path, tiny_model_dir, calib_ids, recipe):
    model, tok = laquant.load_model(tiny_model_dir)
    res = laquant.calibrate(model, recipe, calib_ids, samples=2, seq_len=96, progress=False)
    ids = torch.randint(0, 8192, (2, 50))
    ref = model(input_ids=ids).logits
    laquant.save(res, tmp_path / "out", tokenizer=tok)
    reloaded, _ = laquant.load(tmp_path / "out")
    assert torch.equal(reloaded(input_ids=ids).logits, ref)
    # decode mode too: the state carried in its stored format
    cache_a, cache_b = model.new_cache(), reloaded.new_cache()
    for t in range(5):
        a = model(input_ids=ids[:, t:t + 1], past_key_values=cache_a, use_cache=True).logits
        b = reloaded(input_ids=ids[:, t:t + 1], past_key_values=cache_b, use_cache=True).logits
        assert torch.equal(a, b)


def _saved_gla_int8(tmp_path, tiny_model_dir, calib_ids):
    """The tiny model calibrated with gla_int8, saved to ``tmp_path / "out"`` and read back by
    transformers: ``(calibrated model, tokenizer, from_pretrained model)``."""
    from transformers import AutoModelForCausalLM

    model, tok = laquant.load_model(tiny_model_dir)
    res = laquant.calibrate(model, "gla_int8", calib_ids, samples=2, seq_len=96, progress=False)
    laquant.save(res, tmp_path / "out", tokenizer=tok)
    return model, tok, AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()


@torch.no_grad()
def test_transformers_from_pretrained_is_bit_exact(tmp_path, tiny_model_dir, calib_ids):
    model, tok, hf = _saved_gla_int8(tmp_path, tiny_model_dir, calib_ids)
    ids = torch.randint(0, 8192, (1, 40))
    assert torch.equal(hf(input_ids=ids).logits, model(input_ids=ids).logits)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "laquant"
    st = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert st["model.layers.0.attn.q_proj.qweight"].dtype == torch.int8
    assert st["model.layers.0.attn.q_proj.weight_scale"].dtype == torch.float32
    assert st["model.embeddings.weight"].dtype == torch.bfloat16


@torch.no_grad()
def test_save_pretrained_of_a_loaded_checkpoint_reloads_bit_exact(tmp_path, tiny_model_dir, calib_ids):
    from transformers import AutoModelForCausalLM

    model, tok, hf = _saved_gla_int8(tmp_path, tiny_model_dir, calib_ids)
    hf.save_pretrained(tmp_path / "again")
    tok.save_pretrained(tmp_path / "again")
    ids = torch.randint(0, 8192, (2, 40))
    expected = model(input_ids=ids).logits
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again", dtype=torch.float32).eval()
    assert torch.equal(again(input_ids=ids).logits, expected)
    reloaded, _ = laquant.load(tmp_path / "again")
    assert torch.equal(reloaded(input_ids=ids).logits, expected)
    assert checkpoint_decisions(tmp_path / "again") == checkpoint_decisions(tmp_path / "out")
    # a model from laquant.load, and the calibrated model itself, save the same way
    for i, m in enumerate((reloaded, model)):
        m.save_pretrained(tmp_path / f"m{i}")
        tok.save_pretrained(tmp_path / f"m{i}")
        assert checkpoint_decisions(tmp_path / f"m{i}") == checkpoint_decisions(tmp_path / "out")
        assert torch.equal(laquant.load(tmp_path / f"m{i}")[0](input_ids=ids).logits, expected)


def _prefill_vs_decode(model, ids):
    full = model(input_ids=ids).logits
    cache = model.new_cache()
    steps = torch.cat([model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                       for t in range(ids.shape[1])], 1)
    assert torch.isfinite(steps).all()
    return rel_err(steps, full), cache


@torch.no_grad()
def test_quantized_decode_agrees_with_prefill(tiny_model_dir, calib_ids):
    ids = torch.randint(0, 8192, (2, 90))
    model, _ = laquant.load_model(tiny_model_dir)
    laquant.calibrate(model, "gla_w8a8", calib_ids, samples=2, seq_len=96, progress=False)
    err, cache = _prefill_vs_decode(model, ids)  # per-token int8 is the same in both modes
    assert err < 1e-2 and cache.state_bytes() == 2 * 2 * (2 * 16 * 32 * 4)
    model, _ = laquant.load_model(tiny_model_dir)
    laquant.calibrate(model, "gla_int8", calib_ids, samples=2, seq_len=96, progress=False)
    # fp8 state: decode rounds the state at every token, prefill every 64: the modes drift apart
    err, cache = _prefill_vs_decode(model, ids)
    assert err < 0.15
    # fp8: 2 layers x 2 sequences x 2 heads x (16 x 32 bytes + 16 fp32 row scales)
    assert cache.state_bytes() == 2 * 2 * (2 * 16 * 32 + 2 * 16 * 4)


def test_interrupted_save_leaves_nothing(tmp_path, tiny_model_dir, calib_ids, monkeypatch):
    model, tok = laquant.load_model(tiny_model_dir)
    res = laquant.calibrate(model, "gla_int8", calib_ids, samples=2, seq_len=64, progress=False)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(res.stats), "save", boom)
    with pytest.raises(KeyboardInterrupt):
        laquant.save(res, tmp_path / "out", tokenizer=tok)
    assert list(tmp_path.iterdir()) == []


def test_corrupted_checkpoints_are_refused(tmp_path, tiny_model_dir, calib_ids, capsys):
    model, tok = laquant.load_model(tiny_model_dir)
    res = laquant.calibrate(model, "gla_int8", calib_ids, samples=2, seq_len=64, progress=False)
    out = laquant.save(res, tmp_path / "out", tokenizer=tok)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(LaquantError, match="model.safetensors is truncated or changed"):
        laquant.load(out)
    assert main(["eval", "ppl", str(out), "--max-tokens", "300", "--context", "64"]) == 2
    assert "model.safetensors is truncated or changed" in capsys.readouterr().err
    # without the digest check, reading the file finds it truncated
    with pytest.raises(LaquantError, match="corrupted or truncated"):
        laquant.load(out, verify=False)
    with pytest.raises(LaquantError, match="already exists|exists and is not empty"):
        laquant.save(res, out, tokenizer=tok)


def test_unsupported_architecture_is_named(tmp_path):
    model = torch.nn.Linear(2, 2)
    model.config = type("C", (), {"model_type": "llama"})()
    with pytest.raises(LaquantError, match="no laquant adapter for model_type 'llama'; supported: gla"):
        get_adapter(model)


def test_calibrate_and_inspect_cli(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "q"
    code = main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--samples", "3",
                 "--seq-len", "128", "--eval-max-tokens", "600", "--eval-context", "128", "--out", str(out),
                 "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "| bf16 |" in printed and "| gla_int8 |" in printed and "state bytes / sequence" in printed
    for name in ("model.safetensors", "config.json", "recipe.yaml", "stats.safetensors", "tokenizer.json",
                 "report.md", "eval.json", "plots/outliers.png", "plots/gates.png", "plots/state.png"):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_text()
    assert "## Per layer" in report and "gk_proj" in report
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert rows[0]["name"] == "bf16" and rows[1]["state_bytes"] < rows[0]["state_bytes"] / 3
    # the output works with eval ppl and inspect
    assert main(["eval", "ppl", str(out), "--baseline", str(tiny_model_dir), "--max-tokens", "300",
                 "--context", "64", "--quiet"]) == 0
    assert "baseline" in capsys.readouterr().out
    assert main(["inspect", str(out), "--plots", str(tmp_path / "p")]) == 0
    assert "state format" in capsys.readouterr().out and (tmp_path / "p" / "state.png").stat().st_size > 1000
    # --offload: the model waits on the CPU while each layer calibrates on --device (here the CPU too)
    assert main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--samples", "2",
                 "--seq-len", "64", "--no-eval", "--offload", "--out", str(tmp_path / "off"), "--quiet"]) == 0
    # ... and quantizes exactly as the whole model on the device does
    assert main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--samples", "2",
                 "--seq-len", "64", "--no-eval", "--out", str(tmp_path / "on"), "--quiet"]) == 0
    assert checkpoint_decisions(tmp_path / "off") == checkpoint_decisions(tmp_path / "on")
    for name in ("model.safetensors", "stats.safetensors"):
        assert same_tensors(tmp_path / "off" / name, tmp_path / "on" / name), name
    # reusing the statistics needs no calibration data
    assert main(["calibrate", "--recipe", "gla_fp8_state", "--model", str(tiny_model_dir), "--stats",
                 str(out / "stats.safetensors"), "--no-eval", "--out", str(tmp_path / "q2"), "--quiet"]) == 0
    assert same_tensors(tmp_path / "q2" / "stats.safetensors", out / "stats.safetensors")
    # ... and, with the recipe that wrote them, gives the same checkpoint as that run
    assert main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--stats",
                 str(out / "stats.safetensors"), "--no-eval", "--out", str(tmp_path / "q3"), "--quiet"]) == 0
    assert checkpoint_decisions(tmp_path / "q3") == checkpoint_decisions(out)
    assert same_tensors(tmp_path / "q3" / "model.safetensors", out / "model.safetensors")


@pytest.mark.parametrize("argv,message", [
    (["--recipe", "nope"], "unknown recipe 'nope'; available:"),
    (["--recipe", "gla_int8", "--set", "state.format=fp4"], "state.format = 'fp4' is not allowed"),
    (["--recipe", "gla_int8", "--data", "{empty}"], "is empty"),
    (["--recipe", "gla_int8", "--data", "{short}", "--seq-len", "512"], "calibration data is too short"),
    (["--recipe", "gla_int8", "--out", "{nonempty}"], "exists and is not empty; pass --overwrite"),
    (["--recipe", "gla_int8", "--out", "{short}"], "is a file, not a folder"),
    (["--recipe", "gla_int8", "--out", "{short}/sub"], "cannot be made: "),
    (["--recipe", "gla_int8", "--out", "/proc/laquant-out"], "cannot be written: /proc does not take new folders"),
    (["--recipe", "gla_int8", "--model", "{llama}"], "model_type 'llama' is not supported"),
    (["--recipe", "gla_int8", "--stats", "{short}"], "not a laquant statistics file"),
    (["--recipe", "gla_int8", "--stats", "/no/such/stats.safetensors"], "statistics file not found"),
    (["--recipe", "gla_int8", "--out", "/dev/null"], "is a file, not a folder"),
    (["--recipe", "gla_int8", "--out", "/proc/self/laquant-out"], "cannot be written"),
    (["--recipe", "gla_int8", "--model", "{badjson}"], "is not valid JSON"),
    (["--recipe", "gla_int8", "--model", "{notobject}"], "is not a JSON object"),
    (["--recipe", "gla_int8", "--model", "{noweights}"], "could not load the tokenizer"),
    (["--recipe", "gla_int8", "--samples", "0"], "--samples must be >= 1"),
])
def test_calibrate_bad_input(tmp_path, tiny_model_dir, capsys, argv, message):
    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "short.txt").write_text("just a few words")
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "x").write_text("x")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    for name, text in (("badjson", '{"model_type": "gla",'), ("notobject", "[1, 2]"),
                       ("noweights", (tiny_model_dir / "config.json").read_text())):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
    subs = {"{empty}": str(tmp_path / "empty.txt"), "{short}": str(tmp_path / "short.txt"),
            "{nonempty}": str(tmp_path / "nonempty"), "{llama}": str(tmp_path / "llama"),
            **{f"{{{n}}}": str(tmp_path / n) for n in ("badjson", "notobject", "noweights")}}
    argv = [subs.get(a, a) for a in argv]
    argv = [a.replace("{short}", subs["{short}"]) for a in argv]
    if "--model" not in argv:
        argv += ["--model", str(tiny_model_dir)]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert main(["calibrate", *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@torch.no_grad()
def test_prefill_rounds_the_state_once_unless_asked_per_chunk(tiny_model_dir, calib_ids):
    """prefill_roundtrip false (the default): a prefill keeps the state in float32 and stores its
    final state in the format once; true: rounded after every 64-token chunk as well."""
    ids = torch.randint(0, 8192, (2, 200))  # four chunks
    finals = {}
    for roundtrip in (False, True):
        model, _ = laquant.load_model(tiny_model_dir)
        recipe = load_recipe("gla_int8_all", [f"state.prefill_roundtrip={str(roundtrip).lower()}"])
        result = laquant.calibrate(model, recipe, calib_ids, samples=2, seq_len=96, progress=False)
        decision = result.decisions["state"]["model.layers.0.attn"]
        assert decision["prefill_roundtrip"] is roundtrip
        cache = model.new_cache()
        model(ids, past_key_values=cache, use_cache=True)
        finals[roundtrip] = cache.get(0).load()
        if not roundtrip:  # the same prefill with a float32 state, its final state stored once
            mixer = model.model.layers[0].attn
            quantizer, mixer.state_quantizer = mixer.state_quantizer, StateQuantizer("fp32")
            plain = model.new_cache()
            model(ids, past_key_values=plain, use_cache=True)
            once = quantizer.store_state(plain.get(0).load(), None).load()
            assert torch.equal(finals[False], once)
    assert not torch.equal(finals[False], finals[True])


# every phase of `laquant calibrate`: tokenizing, loading, evaluating, calibrating, writing the
# checkpoint, adding eval.json and the plots after it
# (with --offload: the streamed path, whose checkpoint is written before the quantized model is evaluated)
@pytest.mark.parametrize("phase", ["tokenize", "load_model", "perplexity", "calibrate", "save", "write_stat_plots",
                                   "offload:load_model", "offload:calibrate_streamed", "offload:save",
                                   "offload:laquant_load", "offload:write_stat_plots"])
def test_ctrl_c_during_calibrate_is_one_line_and_leaves_nothing(tmp_path, tiny_model_dir, capsys, monkeypatch, phase):
    import laquant.cli.calibrate_steps as cli_calibrate

    offload = phase.startswith("offload:")
    phase = phase.removeprefix("offload:")
    real = getattr(cli_calibrate, phase)
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(phase)
        if phase == "save":  # half-way through writing: the staging folder exists
            import laquant.checkpoint as checkpoint

            with monkeypatch.context() as inner:
                inner.setattr(checkpoint, "storage_tensor", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
                return real(*args, **kwargs)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cli_calibrate, phase, interrupted)
        out = tmp_path / f"out-{phase}"
        assert main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--out", str(out),
                     "--samples", "2", "--seq-len", "64", "--eval-context", "64", "--eval-max-tokens", "130",
                     "--eval-mode", "decode", "--quiet", *(["--offload"] if offload else [])]) == 130
        assert calls == [phase]
        err = capsys.readouterr().err
        assert err.strip() == "laquant: interrupted" and "Traceback" not in err
        assert list(tmp_path.iterdir()) == []


def test_the_report_says_how_many_outliers_a_kept_projection_has():
    """The per-layer report names the outlier count of a projection kept whole for having too many (and of none
    where the recipe is not given, as for checkpoints of before the limit)."""
    from laquant.calibration.stats import Stats
    from laquant.eval.report import layer_summary
    from laquant.recipe import load_recipe

    absmax = {"a": torch.tensor([1.0, 9.0, 2.0, 3.0]), "b": torch.tensor([9.0, 9.0, 2.0, 3.0])}
    stats = Stats({f"{n}/act_absmax": t for n, t in absmax.items()}, {"roles": {"projections": ["a", "b"]}})
    decisions = {"projections": {"a": {"weight_granularity": "per_channel", "act_granularity": "per_token",
                                       "outliers": [1]}}, "gates": {}, "state": {}}
    rows = {line.split(" | ")[0][2:]: line for line in layer_summary(stats, decisions,
                                                                      load_recipe("gla_int8")["projections"]).splitlines()}
    assert "| int8 w:per_channel a:per_token |" in rows["a"] and "| 1 |" in rows["a"]
    assert "kept (bf16), 2 of 4 inputs are outliers" in rows["b"]
    assert "| kept (bf16) |" in layer_summary(stats, decisions).splitlines()[3]
    from laquant.eval.report import report_markdown

    calib = {"samples": 1, "seq_len": 8, "data": "calibration", "seed": 0}
    head = report_markdown(load_recipe("gla_int8"), "m", calib, "", stats, decisions, "").splitlines()
    assert ("projections in bf16 whose outlier inputs are more than 25% of all (the limit above which the plan keeps "
            "a layer whole): 1") in head[5]
