"""Checkpoints written by an earlier laquant (tests/fixtures/legacy_v1, see its make.py) load with
today's code and give the logits that code computed, in prefill and in token-by-token decode (where
the stored state format acts): prefill to the bit under the torch version that wrote them (CI's),
decode up to one flipped 8-bit state code (another CPU's summation order), and within the rounding of
another version's CPU kernels elsewhere (one flipped int8 activation code moves a logit by up to
~1/127 of its scale)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import laquant
from laquant.adapters import new_cache
from laquant.integrity import verify_checkpoint
from laquant.loading import default_model_dir

from conftest import rel_err

LEGACY = Path(__file__).parent / "fixtures" / "legacy_v1"
CASES = ["gla_int8", "gla_fp8_state_naive", "qwen3_next_hybrid_int8", "bamba_hybrid_int8"]


@pytest.fixture(params=CASES)
def legacy_dir(request, tmp_path):
    out = tmp_path / request.param
    shutil.copytree(LEGACY / request.param, out)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # not stored twice in the repository
        shutil.copy(default_model_dir() / name, out / name)
    return out


@torch.no_grad()
def test_a_legacy_checkpoint_gives_the_logits_it_gave(legacy_dir):
    expected = load_file(legacy_dir / "expected.safetensors")
    with safe_open(legacy_dir / "expected.safetensors", "pt") as f:
        same_torch = f.metadata()["torch"] == torch.__version__
    assert verify_checkpoint(legacy_dir) is False  # written before digests: no laquant.json, loads unchecked
    model, _ = laquant.load(legacy_dir)
    ids = expected["ids"]
    cache = new_cache(model)
    decode = torch.cat([model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
                        for t in range(ids.shape[1])], 1)
    # same torch, prefill: equal up to the summation order of the CPU's thread count (7e-8 seen between
    # 1 and 2 threads), far below what a wrongly loaded tensor gives (> 1e-3)
    assert rel_err(model(input_ids=ids).logits, expected["prefill"]) < (1e-6 if same_torch else 2e-2)
    # decode stores the state in 8 bits at every token: an element within an ulp of a rounding boundary
    # can land on the other code on another CPU (its kernels sum in another order: seen on an Intel Xeon
    # for gla_fp8_state_naive, 1e-7 until token 9, then 1.8e-3), and the flipped code stays in the
    # state. A mis-scaled state is far outside (its static scale x1.25: 7e-2).
    assert rel_err(decode, expected["decode"]) < (1e-2 if same_torch else 2e-2)


def test_inspect_reads_a_legacy_checkpoint(legacy_dir, capsys):
    from laquant.cli import main

    assert main(["inspect", str(legacy_dir), "--plots", str(legacy_dir / "plots-new")]) == 0
    out = capsys.readouterr().out
    recipe = json.loads((legacy_dir / "config.json").read_text())["quantization_config"]["recipe"]["name"]
    assert f": recipe {recipe} " in out and len(list((legacy_dir / "plots-new").glob("*.png"))) == 3
