"""The compressed-tensors export (``laquant export``, ``laquant calibrate --format compressed-tensors``).

The exported folder must load in plain transformers without laquant and compute what laquant's model
computes up to the activation grid (compressed-tensors' CPU fake quantization rounds activations to
absmax / 127.5 with codes -128..127, laquant and vLLM's int8 kernel to absmax / 127 with codes
-127..127): a second draw of the same rounding noise, so the documented tolerance is the size of the
quantization error itself. Module by module it equals a plain-PyTorch emulation of compressed-tensors'
W8A8 bit for bit, and its weight codes and scales are laquant's own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_err
from safetensors.torch import load_file, save_file
from test_hybrid import FAMILIES, VOCAB

import laquant
from laquant.cli import main
from laquant.compressed_tensors_export import W8A8_SCHEME, export_compressed_tensors
from laquant.errors import LaquantError
from laquant.quant.modules import QuantGate, QuantLinear
from laquant.recipe import load_recipe

ct = pytest.importorskip("compressed_tensors")

EXPORTED = ("qwen3_next", "bamba", "minimax")
# exported vs laquant logits, relative (Frobenius): at most this many times laquant's own error
# against the unquantized model, plus a floor for models whose quantization error is tiny
TOLERANCE_FACTOR, TOLERANCE_FLOOR = 2.0, 2e-3


def _calibrated(family, recipe="hybrid_int8", sets=()):
    torch.manual_seed(3)
    model = FAMILIES[family]().float().eval()
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(input_ids=ids).logits
    laquant.calibrate(model, load_recipe(recipe, list(sets)), torch.randint(0, VOCAB, (4, 96)), progress=False)
    return model, ids, base


def ct_w8a8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias=None) -> torch.Tensor:
    """compressed-tensors' W8A8 on the CPU in plain PyTorch: activations fake-quantized per token
    (absmax / 127.5, round half to even, codes -128..127), the int8 weight dequantized with its scale."""
    s = x.abs().amax(-1, keepdim=True) / 127.5
    xq = torch.clamp(torch.round(x / s), -128, 127) * s
    return F.linear(xq, weight.float() * scale, bias)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Each family calibrated with hybrid_int8 and exported: (model, ids, laquant logits, bf16 logits, folder)."""
    out = {}
    for family in EXPORTED:
        model, ids, base = _calibrated(family)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        folder = tmp_path_factory.mktemp(family) / "ct"
        export_compressed_tensors(model, folder)
        out[family] = (model, ids, logits, base, folder)
    return out


@pytest.mark.slow
def test_exports_load_without_laquant_and_match_laquant(exports, tmp_path):
    jobs = {f: (str(folder), str(tmp_path / f"{f}.safetensors")) for f, (_, ids, _, _, folder) in exports.items()}
    for family, (_, ids, _, _, _) in exports.items():
        save_file({"ids": ids}, str(tmp_path / f"{family}-ids.safetensors"))
    script = textwrap.dedent(f"""
        import json, sys, torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM
        for family, (folder, result) in json.loads({json.dumps(json.dumps(jobs))}).items():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            ids = load_file(result.replace(f"{{family}}.safetensors", f"{{family}}-ids.safetensors"))["ids"]
            with torch.no_grad():
                save_file({{"logits": model(input_ids=ids).logits.contiguous()}}, result)
        assert not any(m == "laquant" or m.startswith("laquant.") for m in sys.modules), "laquant was imported"
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for family, (_, _, logits, base, _) in exports.items():
        exported = load_file(jobs[family][1])["logits"]
        quant_err = rel_err(logits, base)
        assert 0 < rel_err(exported, logits) < TOLERANCE_FACTOR * quant_err + TOLERANCE_FLOOR, family


@pytest.mark.slow  # the module's calibrated exports take ~20 s to build on 2 cores
@torch.no_grad()
def test_each_int8_layer_is_compressed_tensors_w8a8_of_laquant_codes(exports):
    from transformers import AutoModelForCausalLM

    for family, (model, _, _, _, folder) in exports.items():
        tensors = load_file(str(folder / "model.safetensors"))
        loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        loaded(input_ids=torch.zeros(1, 2, dtype=torch.long))  # compressed-tensors decompresses on the first forward
        config = json.loads((folder / "config.json").read_text())["quantization_config"]
        int8 = sorted(k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale"))
        assert int8 and not set(int8) & set(config["ignore"])
        for name in int8:
            q = model.get_submodule(name)
            q = q[0] if isinstance(q, QuantGate) else q
            assert isinstance(q, QuantLinear) and q.n_outliers == 0
            # laquant's codes and float32 scales, bit for bit
            assert tensors[f"{name}.weight"].dtype == torch.int8
            assert torch.equal(tensors[f"{name}.weight"], q.qweight[:, :q.n_main])
            assert tensors[f"{name}.weight_scale"].dtype == torch.float32
            assert torch.equal(tensors[f"{name}.weight_scale"], q.weight_scale.expand(q.out_features, 1))
            x = torch.randn(3, 7, q.in_features) * torch.rand(q.in_features) * 4
            got = loaded.get_submodule(name)(x)
            assert torch.equal(got, ct_w8a8(x, q.qweight[:, :q.n_main], q.weight_scale, q.bias)), name
            assert rel_err(got, q(x)) < 0.02  # laquant's grid: same codes up to activation rounding
        # everything else is dense and listed in `ignore`
        ignored = [n for n in config["ignore"] if f"{n}.weight" in tensors]
        assert ignored and all(tensors[f"{n}.weight"].is_floating_point() for n in ignored)


@pytest.mark.slow  # the module's calibrated exports take ~20 s to build on 2 cores
def test_config_is_compressed_tensors_w8a8(exports):
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from transformers import AutoConfig, CompressedTensorsConfig

    preset = preset_name_to_scheme("W8A8", ["Linear"]).model_dump()
    assert W8A8_SCHEME == preset
    for family, (_, _, _, _, folder) in exports.items():
        raw = json.loads((folder / "config.json").read_text())
        qcfg = raw["quantization_config"]
        parsed = QuantizationConfig.model_validate(qcfg)
        assert parsed.format == "int-quantized" and parsed.quant_method == "compressed-tensors"
        assert parsed.quantization_status == "compressed"
        group = parsed.config_groups["group_0"]
        assert group.weights.strategy == "channel" and not group.weights.dynamic and group.weights.symmetric
        assert group.input_activations.strategy == "token" and group.input_activations.dynamic
        assert CompressedTensorsConfig.from_dict(qcfg).is_quantization_compressed
        assert raw["dtype"] == "bfloat16" and raw["architectures"][0].endswith("ForCausalLM")
        assert AutoConfig.from_pretrained(folder).model_type == family
        ignore = set(qcfg["ignore"])
        assert "lm_head" in ignore
        if family == "qwen3_next":  # gates dense; MoE router-side linears and expert blocks ignored
            assert {"model.layers.0.linear_attn.in_proj_ba", "model.layers.1.mlp.shared_expert_gate",
                    "model.layers.1.mlp.experts"} <= ignore
            assert "model.layers.0.linear_attn.in_proj_qkvz" not in ignore
        if family == "bamba":  # the dt channels are a slice of in_proj: it stays int8 (the logit treatment goes)
            assert "model.layers.0.mamba.in_proj" not in ignore
        assert (folder / "serving.md").is_file()


@pytest.mark.slow
@torch.no_grad()
def test_outlier_columns_are_requantized_or_kept_dense(tmp_path):
    from laquant.compressed_tensors_export import write_compressed_tensors
    from laquant.kernels.common.numerics import quantize_int8

    model, ids, _ = _calibrated("qwen3_5", sets=["projections.outlier_top_k=2"])
    decisions = model.config.quantization_config.decisions
    for policy in ("requantize", "bf16"):
        folder = tmp_path / policy
        folder.mkdir()
        summary = write_compressed_tensors(model, decisions, folder, outliers=policy)
        tensors = load_file(str(folder / "model.safetensors"))
        ignore = set(json.loads((folder / "config.json").read_text())["quantization_config"]["ignore"])
        qkv = "model.layers.0.linear_attn.in_proj_qkv"
        q = model.get_submodule(qkv)
        assert q.n_outliers == 2
        if policy == "requantize":
            codes, scale = quantize_int8(q.dequantized_weight(), dim=-1)
            assert torch.equal(tensors[f"{qkv}.weight"], codes) and torch.equal(tensors[f"{qkv}.weight_scale"], scale)
            assert summary.requantized[qkv] == 2 and qkv not in ignore
        else:
            assert tensors[f"{qkv}.weight"].is_floating_point() and qkv in ignore and not summary.requantized
            assert torch.equal(tensors[f"{qkv}.weight"], q.dequantized_weight().to(torch.bfloat16))
        # vLLM fuses in_proj_b with the gate in_proj_a, and q/k/v: one scheme per fused layer
        assert {"model.layers.0.linear_attn.in_proj_a", "model.layers.0.linear_attn.in_proj_b"} <= ignore
        if policy == "requantize":  # in_proj_b would be int8 but for its fused sibling
            assert "in_proj_a" in summary.dense["model.layers.0.linear_attn.in_proj_b"]
        attn = [f"model.layers.3.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
        assert all(a in ignore for a in attn) or not any(a in ignore for a in attn)


def test_weight_only_projections_are_written_dense(tmp_path):
    """Projections the recipe's outlier_fallback made weight-only int8 have no form in the W8A8 group: written dense
    (their dequantized weights, in the ignore list), with their fused siblings."""
    from laquant.compressed_tensors_export import write_compressed_tensors

    model, _, _ = _calibrated("qwen3_5", sets=["projections.outlier_threshold=3.0", "projections.outlier_max_fraction=0.01",
                                               "projections.outlier_fallback=weight_only"])
    decisions = model.config.quantization_config.decisions
    projections = decisions["projections"] if isinstance(decisions, dict) else decisions.to_dict()["projections"]
    weight_only = {n for n, d in projections.items() if d["act_granularity"] == "none"}
    assert weight_only and len(weight_only) < len(projections)
    summary = write_compressed_tensors(model, decisions, tmp_path)
    ignore = set(json.loads((tmp_path / "config.json").read_text())["quantization_config"]["ignore"])
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for name in weight_only:
        assert name in ignore and name not in summary.int8
        assert "weight-only" in summary.dense[name] or "served fused" in summary.dense[name]
        q = model.get_submodule(name)
        assert torch.equal(tensors[f"{name}.weight"], q.dequantized_weight().to(torch.bfloat16))


def test_a_quantized_lm_head_is_written_dense(tmp_path):
    """lm_head quantized too (``--set keep=...`` without lm_head) has no W8A8 form engines load for it: written dense
    (its dequantized weight), in the ignore list."""
    from laquant.compressed_tensors_export import write_compressed_tensors

    model, _, _ = _calibrated("qwen3_5", sets=["keep=embeddings,norms,routers,experts,conv,decay"])
    assert type(model.lm_head).__name__ == "QuantLinear"
    summary = write_compressed_tensors(model, model.config.quantization_config.decisions, tmp_path)
    ignore = json.loads((tmp_path / "config.json").read_text())["quantization_config"]["ignore"]
    assert "lm_head" in ignore and "lm_head" not in summary.int8 and "lm_head" in summary.dense
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(tensors["lm_head.weight"], model.lm_head.dequantized_weight().to(torch.bfloat16))


def _checkpoint(family, tmp_path):
    from laquant.loading import default_model_dir

    model_dir = tmp_path / f"{family}-bf16"
    torch.manual_seed(3)
    FAMILIES[family]().to(torch.bfloat16).save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, model_dir / name)
    return model_dir


def _leftovers(parent):
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".probe-" in p.name]


@pytest.mark.slow
def test_export_cli_and_its_errors(tmp_path, capsys):
    model_dir = _checkpoint("bamba", tmp_path)
    ckpt = tmp_path / "lq"
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(model_dir), "--samples", "2", "--seq-len",
                 "64", "--no-eval", "--out", str(ckpt), "--quiet"]) == 0
    out = tmp_path / "ct"
    assert main(["export", str(ckpt), "--format", "compressed-tensors", "--out", str(out), "--eval-max-tokens", "300",
                 "--eval-context", "64", "--baseline", str(model_dir), "--quiet"]) == 0
    serving = (out / "serving.md").read_text()
    assert "--mamba-ssm-cache-dtype bfloat16" in serving and "`int8_row`" in serving
    rows = [line for line in serving.splitlines() if line.startswith("| ") and "ppl" not in line and "%" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| laquant (hybrid_int8)", "| compressed-tensors export"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "serving.md",
                                                     "tokenizer.json", "tokenizer_config.json"]
    capsys.readouterr()

    def fails(args, *needles):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and all(n in err for n in needles), err

    # an existing folder is kept as it was
    before = (out / "model.safetensors").read_bytes()
    fails(["export", str(ckpt), "--format", "compressed-tensors", "--out", str(out), "--no-eval"], "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before
    fails(["export", str(ckpt), "--format", "compressed-tensors", "--out", str(ckpt), "--no-eval"],
          "is the checkpoint itself")
    # not a laquant checkpoint: says what to run
    fails(["export", str(model_dir), "--format", "compressed-tensors", "--out", str(tmp_path / "x"), "--no-eval"],
          "not a laquant checkpoint", "laquant calibrate")
    # GLA: no transformers / vLLM model class
    gla = tmp_path / "gla"
    gla.mkdir()
    (gla / "config.json").write_text(json.dumps({"model_type": "gla", "quantization_config": {
        "quant_method": "laquant", "format_version": 1, "recipe": {}, "decisions": {}}}))
    fails(["export", str(gla), "--format", "compressed-tensors", "--out", str(tmp_path / "y"), "--no-eval"],
          "GLA", "vLLM")
    # a decision the format cannot run fails inside the staging folder: nothing is left behind (per-group scales on
    # the projections that close a block only: the message says which field to drop)
    for setting, out, needles in (
            ("projections.act_granularity=per_tensor", "z",
             ("per-tensor activation scales", "--set projections.act_granularity=per_token")),
            ("projections.output_act_granularity=per_group", "w",
             ("per-group activation scales", "without projections.output_act_granularity"))):
        calibrated = tmp_path / f"calibrated_{out}"
        assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(model_dir), "--samples", "2", "--seq-len",
                     "64", "--no-eval", "--set", setting, "--out", str(calibrated), "--quiet"]) == 0
        capsys.readouterr()
        fails(["export", str(calibrated), "--format", "compressed-tensors", "--out", str(tmp_path / out), "--no-eval"],
              *needles)
    assert not any((tmp_path / d).exists() for d in "xyzw")
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_calibrate_writes_the_compressed_tensors_form(tmp_path, capsys, tiny_model_dir):
    from compressed_tensors.quantization import QuantizationConfig

    model_dir = _checkpoint("qwen3_next", tmp_path)
    out = tmp_path / "ct"
    assert main(["calibrate", "--recipe", "hybrid_int8", "--model", str(model_dir), "--samples", "2", "--seq-len",
                 "64", "--eval-max-tokens", "300", "--eval-context", "64", "--eval-mode", "prefill",
                 "--format", "compressed-tensors", "--out", str(out), "--quiet"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "serving.md", "report.md", "recipe.yaml", "eval.json",
            "plots"} <= names
    assert not [n for n in names if n.endswith(".safetensors") and n != "model.safetensors"]
    QuantizationConfig.model_validate(json.loads((out / "config.json").read_text())["quantization_config"])
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["bf16", "hybrid_int8", "compressed-tensors export"]
    assert abs(rows[2]["prefill"] / rows[1]["prefill"] - 1) < 0.01
    assert "| compressed-tensors export |" in (out / "serving.md").read_text()
    capsys.readouterr()
    # GLA is refused before any calibration, nothing written
    assert main(["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--format",
                 "compressed-tensors", "--out", str(tmp_path / "g"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "neither transformers nor vLLM has a model class" in err and not (tmp_path / "g").exists()


def test_the_python_api_refuses_an_uncalibrated_model(tmp_path):
    with pytest.raises(LaquantError, match="no laquant quantization decisions"):
        export_compressed_tensors(FAMILIES["bamba"]().eval(), tmp_path / "o")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # the module's calibrated exports take ~20 s to build on 2 cores
def test_a_gate_inside_a_projection_is_counted_once(exports):
    from laquant.compressed_tensors_export import plan_export

    model = exports["bamba"][0]
    summary, _ = plan_export(model, model.config.quantization_config.decisions)
    assert summary.gate_treatment_dropped == [f"model.layers.{i}.mamba.in_proj" for i in (0, 1, 3)]
    assert "model.layers.0.mamba.in_proj" in summary.int8 and not summary.dense
