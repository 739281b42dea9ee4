"""Calibrating a model streamed from its files layer by layer (laquant.streaming, `calibrate --offload`):
the same statistics and checkpoint bytes as the whole model in memory, at a peak memory of about
the resident parts and one layer."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import laquant
from laquant.cli import main
from laquant.errors import LaquantError

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file's bytes, plots included; eval.json without the --out it names."""
    out = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name == "eval.json":
                data = json.dumps({k: v for k, v in json.loads(data).items() if k != "out"}).encode()
            out[str(f.relative_to(folder))] = data
    return out


def test_offload_streams_and_writes_the_same_checkpoint(tiny_model_dir, tmp_path):
    common = ["calibrate", "--recipe", "gla_int8", "--model", str(tiny_model_dir), "--samples", "2", "--seq-len",
              "64", "--eval-max-tokens", "130", "--eval-context", "64", "--max-shard-size", "100KB", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    assert main([*common, "--out", str(tmp_path / "streamed"), "--offload"]) == 0
    whole, streamed = _files(tmp_path / "whole"), _files(tmp_path / "streamed")
    assert sum(name.startswith("model-0") for name in whole) > 2  # sharded
    assert whole.keys() == streamed.keys()
    for name in whole:
        assert whole[name] == streamed[name], name
    # reusing the statistics (no calibration pass): the same again
    stats = str(tmp_path / "whole" / "stats.safetensors")
    assert main([*common, "--no-eval", "--stats", stats, "--out", str(tmp_path / "w2")]) == 0
    assert main([*common, "--no-eval", "--stats", stats, "--out", str(tmp_path / "s2"), "--offload"]) == 0
    assert _files(tmp_path / "w2") == _files(tmp_path / "s2")


def test_streamed_api_with_tied_embeddings(tmp_path):
    """A tied lm_head (read once, kept tied) and a single weights file: the same bytes as
    calibrate + save of the model in memory."""
    from laquant.calibration.run import calibration_batches
    from laquant.loading import default_model_dir
    from laquant.models import GLAConfig, GLAForCausalLM

    model_dir = tmp_path / "tied"
    cfg = GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=512, tie_word_embeddings=True,
                    use_short_conv=True)
    GLAForCausalLM(cfg).to(torch.bfloat16).save_pretrained(model_dir)
    shutil.copy(default_model_dir() / "tokenizer.json", model_dir)
    batches = calibration_batches(torch.randint(0, 512, (2000,)), 3, 96, seed=1)
    model, _ = laquant.load_model(model_dir)
    assert model.lm_head.weight is model.model.embeddings.weight
    laquant.save(laquant.calibrate(model, "gla_int8", data=batches, progress=False), tmp_path / "whole")
    result = laquant.calibrate_streamed(model_dir, "gla_int8", data=batches, progress=False)
    assert all(p.is_meta for p in result.model.model.layers.parameters())  # no layer stays in memory
    laquant.save(result, tmp_path / "streamed")
    assert _files(tmp_path / "whole") == _files(tmp_path / "streamed")
    with pytest.raises(LaquantError, match="written once"):
        laquant.save(result, tmp_path / "again")
    assert not (tmp_path / "again").exists()
    with pytest.raises(LaquantError, match="calibration data"):
        laquant.calibrate_streamed(model_dir, "gla_int8", progress=False)


@pytest.mark.gpu
def test_streamed_on_cuda_equals_layer_by_layer_in_memory(tiny_model_dir, tmp_path):
    """On the GPU: layers streamed from the files to the device write what the model held in CPU
    memory and onloaded layer by layer writes."""
    batches = torch.randint(0, 8192, (3, 128))
    model, _ = laquant.load_model(tiny_model_dir)
    laquant.save(laquant.calibrate(model, "gla_int8", data=batches, progress=False, layerwise_device="cuda"),
                 tmp_path / "in-memory")
    laquant.save(laquant.calibrate_streamed(tiny_model_dir, "gla_int8", data=batches, progress=False, device="cuda"),
                 tmp_path / "streamed")
    assert _files(tmp_path / "in-memory") == _files(tmp_path / "streamed")


def test_hybrids_are_not_streamed():
    from laquant.streaming import streams

    assert streams("gla") and streams("gated_deltanet") and not streams("qwen3_next")


@pytest.mark.slow  # three fresh processes and a 145M-parameter model: ~60 s on 2 shared cores
def test_streamed_calibration_peak_memory(tmp_path):
    """Peak RSS of `laquant calibrate --no-eval` on a 145M-parameter random GLA (278 MiB of bf16
    weights, 555 MiB in float32 as laquant computes), each run in a fresh process, over the RSS
    after its imports. Streamed (--offload), the bound is the resident parts (embeddings, lm_head:
    64 MiB) + 3 layers' float32 size (49 MiB each: the layer, its quantized copy, the read buffers
    and casts) + one output shard (--max-shard-size 20MB) + 128 MiB (one layer's observers, the
    statistics, the calibration activations, the allocator's slack): 358 MiB, under the float32
    model alone, so the whole-model run must exceed it. Measured on 2 shared cores: 283 MiB
    streamed, 872 MiB whole, 209 MiB to load the quantized result (eval/results/calib_memory_cpu.md)."""
    out = tmp_path / "stream.json"
    spec = 'config:{"hidden_size": 1024, "num_hidden_layers": 10, "num_heads": 4, "vocab_size": 8192}'
    subprocess.run([sys.executable, str(ROOT / "tools" / "calib_memory.py"), "--stream", spec, "--samples", "2",
                    "--seq-len", "256", "--max-shard-size", "20MB", "--json", str(out)], check=True,
                   capture_output=True)
    r = json.loads(out.read_text())
    assert r["same_files"]
    bound = r["resident_fp32_MiB"] + 3 * r["layer_fp32_MiB"] + 20e6 / 2**20 + 128
    assert r["model_fp32_MiB"] > bound
    rows = r["rows"]
    assert rows["--offload (streamed)"]["peak_over_before_MiB"] < bound, rows
    assert rows["whole model"]["peak_over_before_MiB"] > bound, rows
    # loading holds the quantized model (int8 projections: about a third of the float32 one), not two
    assert rows["laquant.load"]["peak_over_before_MiB"] < 0.6 * r["model_fp32_MiB"], rows
