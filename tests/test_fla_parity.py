"""laquant's GLA path against flash-linear-attention's own model, on the GPU (device tool)."""

import pytest
import torch

from conftest import rel_err
from laquant.loading import load_model

fla = pytest.importorskip("fla", reason="flash-linear-attention is not installed")
pytestmark = pytest.mark.gpu


def _pair(model_dir, dtype):
    from fla.models import GLAForCausalLM as FlaGLA

    ours, _ = load_model(model_dir, device="cuda", dtype=dtype)
    theirs = FlaGLA.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    return ours, theirs


@torch.no_grad()
def test_trained_model_logits_match_fla(trained_model_dir):
    ours, theirs = _pair(trained_model_dir, torch.bfloat16)
    ids = torch.randint(0, ours.config.vocab_size, (3, 1001), device="cuda")  # T not a multiple of 64
    ref = theirs(input_ids=ids).logits.float()
    assert rel_err(ours(input_ids=ids).logits, ref) < 2e-2
    # laquant on CPU in float32 (the CPU path) against fla on the GPU in bf16
    cpu, _ = load_model(trained_model_dir)
    assert rel_err(cpu(input_ids=ids.cpu()).logits, ref.cpu()) < 2e-2


@torch.no_grad()
def test_decode_path_matches_fla_prefill(trained_model_dir):
    ours, theirs = _pair(trained_model_dir, torch.bfloat16)
    ids = torch.randint(0, ours.config.vocab_size, (2, 200), device="cuda")
    ref = theirs(input_ids=ids).logits.float()
    cache = ours.new_cache()
    steps = [ours(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits for t in range(200)]
    assert rel_err(torch.cat(steps, 1), ref) < 2e-2


@torch.no_grad()
def test_random_gqa_model_matches_fla(tmp_path):
    from fla.models import GLAConfig, GLAForCausalLM

    cfg = GLAConfig(hidden_size=192, num_hidden_layers=2, num_heads=4, num_kv_heads=2, vocab_size=500,
                    clamp_min=-0.2)
    GLAForCausalLM(cfg).save_pretrained(tmp_path)
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))).save_pretrained(tmp_path)
    ours, theirs = _pair(tmp_path, torch.float32)
    ids = torch.randint(0, 500, (2, 333), device="cuda")
    assert rel_err(ours(input_ids=ids).logits, theirs(input_ids=ids).logits) < 5e-3  # fla's fp32 dots may use tf32


@pytest.mark.parametrize("options", [dict(use_short_conv=True, conv_size=4), dict(use_output_gate=False),
                                     dict(fuse_norm=False), dict(elementwise_affine=False),
                                     dict(feature_map="relu", num_kv_heads=2), dict(tie_word_embeddings=True),
                                     dict(attn={"layers": [1], "num_heads": 4, "num_kv_heads": 2, "window_size": 100})])
@torch.no_grad()
def test_random_models_with_options_match_fla(tmp_path, options):
    from fla.models import GLAConfig, GLAForCausalLM

    if "attn" in options:
        pytest.importorskip("flash_attn", reason="fla's attention layers need flash-attn")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    cfg = GLAConfig(hidden_size=192, num_hidden_layers=2, num_heads=4, vocab_size=500, **options)
    GLAForCausalLM(cfg).save_pretrained(tmp_path)
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))).save_pretrained(tmp_path)
    ours, theirs = _pair(tmp_path, torch.float32)
    ids = torch.randint(0, 500, (2, 333), device="cuda")
    assert rel_err(ours(input_ids=ids).logits, theirs(input_ids=ids).logits) < 5e-3
