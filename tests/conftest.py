import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU under Triton's interpreter (tiny shapes); set before any @triton.jit
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Kernel tests run on the GPU, or on the CPU under the interpreter, whose bf16 tl.dot is wrong and
# whose fp8/bf16 casts misround (see test_decode_kernel): interpreted runs use float32 inputs and
# allow those elements to differ.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"


def require_triton_kernels():
    """Skip the calling test module unless its Triton kernels can run here; returns ``triton``."""
    triton = pytest.importorskip("triton")
    if INTERPRETED and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels run on CPU only under TRITON_INTERPRET=1", allow_module_level=True)
    return triton


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "NaN/Inf in compared tensors"
    return ((a - b).norm() / b.norm()).item()


def assert_lru_evicts_the_least_recent(pc, size: int, a, b, c) -> None:
    """A prefix cache with room for two snapshots of ``size`` bytes, fed the one-block prompts a and b,
    a hit on a, then c: b, the least recently used, goes."""
    pc.prefill(a)
    pc.prefill(b)
    assert len(pc) == 2 and pc.used_bytes == 2 * size
    assert pc.lookup(a).tokens == pc.block_size  # a is now the most recent: b goes first
    pc.prefill(c)
    assert len(pc) == 2 and pc.stats["evicted"] == 1 and pc.used_bytes == 2 * size <= pc.budget_bytes
    assert pc.lookup(a).tokens == pc.lookup(c).tokens == pc.block_size and pc.lookup(b).tokens == 0


def graphed_and_eager_perplexity(model, ids, **kwargs):
    """Decode-mode ``perplexity`` twice: as it runs (graphed where it can be) and with the graphed
    scorer switched off (the eager loop); asserts which one each was."""
    import laquant.eval.ppl as ppl

    graphed = ppl.perplexity(model, ids, mode="decode", progress=False, **kwargs)
    make = ppl._GraphedScorer.make
    ppl._GraphedScorer.make = classmethod(lambda cls, *a: None)
    try:
        eager = ppl.perplexity(model, ids, mode="decode", progress=False, **kwargs)
    finally:
        ppl._GraphedScorer.make = make
    assert graphed.graphed and not eager.graphed
    return graphed, eager


def greedy_decode_steps(model, ids, steps: int = 3, static: bool = False):
    """The prompt ``ids`` through laquant's forward, then ``steps`` greedy tokens one by one on its cache (the
    static cache a graph replays, when ``static``): the logits of the prompt's last position and of each step
    ``[B, steps + 1, V]``, and the whole sequence ``[B, T + steps]``."""
    from laquant.generate import _forward, _fresh_cache, static_cache, static_forward

    logits, cache = _forward(model, ids, _fresh_cache(model))
    if static:
        cache = static_cache(cache, 64)
    out, tokens = [logits], []
    for _ in range(steps):
        tokens.append(out[-1].argmax(-1)[:, None])
        out.append(static_forward(model, tokens[-1], cache) if static else _forward(model, tokens[-1], cache)[0])
    return torch.stack(out, 1), torch.cat([ids, *tokens], 1)


def checkpoint_decisions(folder) -> dict:
    """The quantization decisions a laquant checkpoint folder records in its config.json."""
    import json
    from pathlib import Path

    return json.loads((Path(folder) / "config.json").read_text())["quantization_config"]["decisions"]


def same_tensors(file_a, file_b) -> bool:
    """Two safetensors files hold the same names with bit-equal tensors."""
    from safetensors.torch import load_file

    a, b = load_file(str(file_a)), load_file(str(file_b))
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def trained_model_dir():
    from laquant.loading import default_model_dir

    return os.environ.get("LAQUANT_TEST_MODEL") or str(default_model_dir())


def write_tiny_gla(out, **config):
    """A tiny random GLA checkpoint in fla's format (``config`` fields over the defaults), with the embedded
    tokenizer, written to ``out`` (plumbing tests only)."""
    import shutil

    from laquant.loading import default_model_dir
    from laquant.models import GLAConfig, GLAForCausalLM

    torch.manual_seed(1)
    cfg = GLAConfig(**{**dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=8192, bos_token_id=0,
                              eos_token_id=0), **config})
    GLAForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)  # stored as bf16, like the shipped model
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """:func:`write_tiny_gla`'s checkpoint with the default config."""
    return write_tiny_gla(tmp_path_factory.mktemp("tiny-gla"))
