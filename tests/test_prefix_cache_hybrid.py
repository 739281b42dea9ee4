"""The prefix state cache on transformers' hybrids (tiny random configs of tests/test_hybrid.py):
hits against recomputation (fp32 state: float tolerance; hybrid_int8's stochastic int8 state: against
its formula), the softmax layers' KV restored exactly, the byte budget counting the KV, refusals, and
``laquant eval serve`` on a hybrid folder."""

import json
import shutil

import pytest
import torch
from conftest import assert_lru_evicts_the_least_recent
from test_hybrid import FAMILIES, VOCAB, _model

import laquant
from laquant.adapters import get_adapter, install, new_cache
from laquant.errors import LaquantError
from laquant.kernels.common.state import State
from laquant.kernels.common.state_io import store_states
from laquant.models.cache import state_store
from laquant.serving import PrefixStateCache

BLOCK = 64
COVERED = list(FAMILIES)


def _installed(family):
    model = _model(family)
    install(model)
    return model


def _ids(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _run(model, ids, cache):
    with torch.no_grad():
        return model(input_ids=ids[None], past_key_values=cache, use_cache=True).logits


def _kv(cache):
    return {i: (layer.keys, layer.values) for i, layer in enumerate(cache.layers)
            if getattr(layer, "keys", None) is not None and layer.keys.numel()}


@pytest.mark.parametrize("family", COVERED)
def test_fp32_hit_matches_recomputation(family):
    """Two blocks cached, then the whole prompt: the resumed prefill's logits, its cache's counters and
    the next decode step are the uninterrupted run's (fp32 state: float32 summation order at most); the
    restored KV is the first prefill's, bit for bit."""
    model = _installed(family)
    adapter = get_adapter(model)
    ids = _ids(2 * BLOCK + 20)
    pc = PrefixStateCache(model, BLOCK, state_format="fp32")
    _, first, cached = pc.prefill(ids[:2 * BLOCK + 5])
    assert cached == 0 and len(pc) == 2
    snap = pc.entries[pc.block_hashes(ids)[1]]
    linear = sorted(adapter.mixer(i).layer_idx for i in adapter.linear_layers())
    assert sorted(snap.states) == linear and sorted(snap.conv) == ([] if family == "minimax" else linear)  # no short conv
    assert sorted(snap.kv) == adapter.attention_layers()
    assert all(k.shape[-2] == v.shape[-2] == BLOCK for k, v in snap.kv.values())

    restored = pc.restore(pc.lookup(ids))
    assert state_store(restored).seen_tokens == 2 * BLOCK
    for layer, (k, v) in _kv(restored).items():  # the KV part: exact copies of the first prefill's
        fk, fv = _kv(first)[layer]
        assert torch.equal(k, fk[..., :2 * BLOCK, :]) and torch.equal(v, fv[..., :2 * BLOCK, :])
        assert k.data_ptr() != fk.data_ptr()

    keep = ids.numel() - 2 * BLOCK
    logits, cache, cached = pc.prefill(ids, logits_to_keep=keep)
    assert cached == 2 * BLOCK and len(pc) == 2
    ref_cache = new_cache(model)
    ref = _run(model, ids, ref_cache)[:, -keep:]
    torch.testing.assert_close(logits, ref, atol=2e-5, rtol=1e-5)
    cold = _run(model, ids[2 * BLOCK:], new_cache(model))  # the suffix alone: what a lost prefix would give
    assert (cold - ref).abs().max() > 1e-2
    assert state_store(cache).seen_tokens == state_store(ref_cache).seen_tokens == ids.numel()
    assert {i: k.shape for i, (k, _) in _kv(cache).items()} == {i: k.shape for i, (k, _) in _kv(ref_cache).items()}
    tok = torch.tensor([5])
    torch.testing.assert_close(_run(model, tok, cache), _run(model, tok, ref_cache), atol=2e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=["qwen3_next", "nemotron_h"])
def int8_model(request):
    """The family quantized by hybrid_int8 (an int8 per-row state with stochastic rounding)."""
    model = _installed(request.param)
    laquant.calibrate(model, "hybrid_int8", _ids(128, 9).view(2, 64), progress=False)
    mixers = [get_adapter(model).mixer(i) for i in get_adapter(model).linear_layers()]
    assert {(m.state_quantizer.format.name, m.state_quantizer.rounding) for m in mixers} == {("int8_row", "stochastic")}
    return model


def test_int8_snapshot_is_the_state_rounded_once(int8_model):
    """A snapshot in the model's own format (int8, stochastic) is the fp32 snapshot stored once by the
    state codec (bit for bit: seed, row 0, store 1, chunk P/64), within one int8 step of each row's absmax."""
    ids = _ids(2 * BLOCK + 3)
    exact = PrefixStateCache(int8_model, BLOCK, state_format="fp32", seed=7)
    rounded = PrefixStateCache(int8_model, BLOCK, seed=7)
    exact.prefill(ids)
    rounded.prefill(ids)
    for j, (ke, kr) in enumerate(zip(exact.block_hashes(ids), rounded.block_hashes(ids))):
        for layer, st in rounded.entries[kr].states.items():
            assert st.format == "int8_row"
            s = exact.entries[ke].states[layer].load()
            want = store_states(s[:, None], "int8_row", "stochastic", 7, 1, [(j + 1) * BLOCK // 64]).data[:, 0]
            assert torch.equal(st.data, want)
            err = (st.load() - s).abs()
            assert err.max() > 0 and bool((err <= s.abs().amax(-1, keepdim=True) / 127 * (1 + 1e-6)).all())
        # the conv inputs and the KV are not rounded: the fp32 pool's, exactly
        for layer, conv in rounded.entries[kr].conv.items():
            assert torch.equal(conv, exact.entries[ke].conv[layer])
        for layer, (k, v) in rounded.entries[kr].kv.items():
            assert torch.equal(k, exact.entries[ke].kv[layer][0]) and torch.equal(v, exact.entries[ke].kv[layer][1])


def test_int8_hit_equals_recomputation_from_the_rounded_state(int8_model):
    """Resuming from the int8 snapshot is the uninterrupted run with the state at P replaced by its
    rounding, nothing else: the logits of a prefill from a cache holding the dequantized states (fp32
    tolerance), and close to (not equal to) the full recomputation."""
    model = int8_model
    ids = _ids(2 * BLOCK + 30)
    keep = 30
    pc = PrefixStateCache(model, BLOCK)
    pc.prefill(ids[:2 * BLOCK + 1])
    logits, cache, cached = pc.prefill(ids, logits_to_keep=keep)
    assert cached == 2 * BLOCK
    assert all(s.format == "int8_row" and s.n_stores == 1 for s in state_store(cache).states.values())
    hashes = pc.block_hashes(ids)[:2]
    snap = pc.entries[hashes[-1]]
    manual = new_cache(model)
    store = state_store(manual)
    store.states = {layer: State(st.load(), None, "fp32", 0) for layer, st in snap.states.items()}
    store.conv = dict(snap.conv)
    for layer in snap.kv:
        k, v = (torch.cat([pc.entries[h].kv[layer][i] for h in hashes], -2) for i in (0, 1))
        manual.update(k, v, layer)
    store.seen_tokens = 2 * BLOCK
    torch.testing.assert_close(logits, _run(model, ids[2 * BLOCK:], manual), atol=2e-5, rtol=1e-5)
    ref = _run(model, ids, new_cache(model))[:, -keep:]
    diff = (logits - ref).abs().max().item()
    assert 0 < diff < 0.05 * ref.abs().max().item()


def test_budget_counts_the_kv_bytes():
    """qwen3_next's int8 snapshot: 3 linear layers' states [2, 16, 24] + per-row scales, their convs'
    last 3 inputs of q|k|v (80 channels, fp32), and the attention layer's block of keys and values
    (1 KV head of 32, fp32); the LRU keeps what fits in 2.5 snapshots."""
    model = _installed("qwen3_next")
    pc = PrefixStateCache(model, BLOCK, state_format="int8_row")
    pc.prefill(_ids(BLOCK + 1))
    states, conv, kv = 3 * (2 * 16 * 24 + 4 * 2 * 16), 3 * 3 * 80 * 4, 2 * BLOCK * 32 * 4
    size = pc.snapshot_bytes()
    assert size == states + conv + kv
    pc = PrefixStateCache(model, BLOCK, budget_bytes=int(2.5 * size), state_format="int8_row")
    a, b, c = _ids(BLOCK + 1, 1), _ids(BLOCK + 1, 2), _ids(BLOCK + 1, 3)
    assert_lru_evicts_the_least_recent(pc, size, a, b, c)
    tiny = PrefixStateCache(model, BLOCK, budget_bytes=states + conv, state_format="int8_row")  # no room for the KV
    tiny.prefill(a)
    assert len(tiny) == 0 and tiny.stats["too_large"] == 1
    # the softmax layer needs every block's KV: with block 0 gone, block 1 is no hit
    ids = _ids(2 * BLOCK + 1, 4)
    pc.prefill(ids)
    del pc.entries[pc.block_hashes(ids)[0]]
    assert pc.lookup(ids).tokens == 0


def test_refusals():
    from transformers import LlamaConfig, LlamaForCausalLM

    from laquant.kernels.common.state import StateQuantizer

    # transformers' own mixers still in place
    with pytest.raises(LaquantError, match=r"still transformers' Qwen3NextGatedDeltaNet.*adapters\.install\(model\)"):
        PrefixStateCache(_model("qwen3_next"), BLOCK)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                         num_attention_heads=2))
    with pytest.raises(LaquantError, match="mixers installed \\(qwen3_next, .*not LlamaForCausalLM"):
        PrefixStateCache(llama, BLOCK)
    model = _installed("qwen3_next")
    for i in get_adapter(model).linear_layers():
        mixer = get_adapter(model).mixer(i)
        mixer.state_quantizer, mixer.prefill_roundtrip = StateQuantizer("int8_row"), True
    with pytest.raises(LaquantError, match="prefill_roundtrip"):
        PrefixStateCache(model, BLOCK)
    pc = PrefixStateCache(_installed("qwen3_5_vl"), BLOCK)  # a VL model: the text config's vocabulary
    with pytest.raises(LaquantError, match=f"vocabulary \\[0, {VOCAB}\\)"):
        pc.prefill(torch.full((70,), VOCAB, dtype=torch.long))


def test_eval_serve_on_a_hybrid_folder(tmp_path):
    """``laquant eval serve`` on a saved qwen3_next: both replays hit the system prompt's blocks and the
    accuracy resumes from a snapshot of every state format asked for."""
    from laquant.cli import main
    from laquant.loading import default_model_dir

    model_dir = tmp_path / "qwen3_next"
    _model("qwen3_next").save_pretrained(model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir() / name, model_dir / name)
    out = tmp_path / "serve"
    assert main(["eval", "serve", str(model_dir), "--system", "140", "--conversations", "2", "--turns", "2",
                 "--user", "8", "--reply", "3", "--block-size", "64", "--reps", "1", "--device", "cpu",
                 "--formats", "fp32", "int8_row", "--accuracy-prefix", "64", "--accuracy-len", "96",
                 "--accuracy-windows", "1", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "serve.json").read_text())["results"][0]
    assert [r["cached_tokens"] for r in res["requests"]["prefix_cache"]] == [0, 128, 128, 128]
    assert res["follow_up"]["cached_tokens"] == 128 and res["state_format"] == ["fp32"]
    assert [a["state_format"] for a in res["accuracy"]] == ["model", "int8_row"]
    assert all(a["tokens"] == 31 and abs(a["rel_loss_change"]) < 0.05 for a in res["accuracy"])


@pytest.mark.parametrize("family,state", [("nemotron_h", None), ("qwen3_next", "int8_row")])
def test_kernel_checkpoints_of_the_hybrid_mixers(family, state, monkeypatch):
    """The hybrids' Triton path (here under Triton's CPU interpreter): Mamba2 through GLA's chunk kernel
    checkpoints, the delta rule in pieces on its chunk kernel; the snapshots are the reference path's
    (fp32 within float32 rounding; int8 stochastic: the same codes) and the hit's logits too."""
    from conftest import INTERPRETED, require_triton_kernels

    from laquant.kernels.common.state import StateQuantizer

    if not INTERPRETED:
        pytest.skip("CPU tensors through the kernels need Triton's interpreter (on CUDA: the gpu test below)")
    require_triton_kernels()
    import laquant.models.recurrent as recurrent

    model = _installed(family)
    adapter = get_adapter(model)
    if state is not None:
        for i in adapter.linear_layers():
            adapter.mixer(i).state_quantizer = StateQuantizer(state, rounding="stochastic")
    ids = _ids(2 * BLOCK + 9)
    runs = {}
    for kernel in (False, True):
        monkeypatch.setattr(recurrent, "use_triton", lambda x, fmt=None, kernel=kernel: kernel)
        pc = PrefixStateCache(model, BLOCK, state_format="fp32" if state is None else None)
        pc.prefill(ids[:2 * BLOCK + 1])
        logits, _, cached = pc.prefill(ids, logits_to_keep=9)
        assert cached == 2 * BLOCK
        runs[kernel] = (logits, [pc.entries[h] for h in pc.block_hashes(ids)])
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(runs[True][1], runs[False][1]):
        for layer in a.states:
            torch.testing.assert_close(a.states[layer].load(), b.states[layer].load(), atol=1e-6, rtol=1e-5)
            if state is not None:
                assert torch.equal(a.states[layer].data, b.states[layer].data)


@pytest.mark.gpu
@pytest.mark.parametrize("state", [None, "int8_row"])
@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h", "kimi_linear"])
def test_gpu_hit_matches_recomputation(family, state):
    """On CUDA the hybrids' mixers run the Triton kernels (GLA's checkpoints for Mamba2, the delta rule
    in pieces): a hit's logits against the full prefill's (fp32 state: float tolerance; the model's own
    int8 stochastic state: within its rounding) and the decode step after it."""
    from conftest import rel_err

    from laquant.kernels.common.state import StateQuantizer

    model = _installed(family).cuda()
    adapter = get_adapter(model)
    if state is not None:
        for i in adapter.linear_layers():
            adapter.mixer(i).state_quantizer = StateQuantizer(state, rounding="stochastic")
    ids = _ids(3 * BLOCK + 17).cuda()
    pc = PrefixStateCache(model, BLOCK, state_format="fp32" if state is None else None)
    pc.prefill(ids[:3 * BLOCK + 1])
    logits, cache, cached = pc.prefill(ids, logits_to_keep=17)
    assert cached == 3 * BLOCK
    ref_cache = new_cache(model)
    ref = _run(model, ids, ref_cache)[:, -17:]
    assert rel_err(logits, ref) < (1e-3 if state is None else 2e-2)
    tok = torch.tensor([5], device="cuda")
    assert rel_err(_run(model, tok, cache), _run(model, tok, ref_cache)) < (1e-3 if state is None else 2e-2)
