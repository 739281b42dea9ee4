"""The prefix state cache (laquant.serving): hits against recomputation, the snapshot's rounding
against its formula, LRU under the byte budget, hash chaining, bad input, ``laquant eval serve``."""

import subprocess
import sys

import pytest
import torch
from conftest import INTERPRETED, assert_lru_evicts_the_least_recent, require_triton_kernels

from laquant.errors import LaquantError
from laquant.kernels.common.formats import STATE_FORMATS
from laquant.kernels.common.state import StateQuantizer
from laquant.kernels.common.state_io import store_states
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.serving import PrefixStateCache

BLOCK = 64
VOCAB = 97
HYBRID = {"attn": {"layers": [1], "num_heads": 2}}  # fla's hybrid form: the snapshot holds the block's KV
CONFIGS = {
    "gla": {},
    "hybrid_conv": {"use_short_conv": True, **HYBRID},
    # laquant's Gated DeltaNet (short convs by default): checkpoints from a prefill run in pieces
    "gated_deltanet": {"kind": "gated_deltanet", **HYBRID},
    "delta_net": {"kind": "delta_net", **HYBRID},  # fla's DeltaNet: the delta rule without a decay
}


def _model(kind: str = "gla", **fields) -> GLAForCausalLM:
    torch.manual_seed(0)
    if kind == "gated_deltanet":
        from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

        cfg = GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, head_dim=32, vocab_size=VOCAB,
                                  **fields)
        return GatedDeltaNetForCausalLM(cfg).eval()
    if kind == "delta_net":
        from laquant.models import DeltaNetConfig, DeltaNetForCausalLM

        return DeltaNetForCausalLM(DeltaNetConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, vocab_size=VOCAB,
                                                  **fields)).eval()
    cfg = GLAConfig(hidden_size=64, num_hidden_layers=3, num_heads=2, vocab_size=VOCAB, **fields)
    return GLAForCausalLM(cfg).eval()


def _ids(n, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _recompute(model, ids, keep):
    with torch.no_grad():
        out = model(ids[None], use_cache=True)
    return out.logits[:, -keep:], out.past_key_values


def _step(model, cache, tok):
    with torch.no_grad():
        return model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True).logits[:, -1]


@pytest.mark.parametrize("name", CONFIGS)
def test_fp32_hit_matches_recomputation(name):
    model = _model(**CONFIGS[name])
    ids = _ids(3 * BLOCK + 20)
    pc = PrefixStateCache(model, BLOCK, state_format="fp32")
    _, _, cached = pc.prefill(ids[:2 * BLOCK + 5])
    assert cached == 0 and len(pc) == 2
    keep = ids.numel() - 2 * BLOCK
    logits, cache, cached = pc.prefill(ids, logits_to_keep=keep)
    assert cached == 2 * BLOCK and len(pc) == 3
    ref, ref_cache = _recompute(model, ids, keep)
    torch.testing.assert_close(logits, ref, atol=2e-5, rtol=1e-5)  # fp32: summation order only
    assert cache.seen_tokens == ref_cache.seen_tokens
    torch.testing.assert_close(_step(model, cache, 5), _step(model, ref_cache, 5), atol=2e-5, rtol=1e-5)


def test_snapshots_are_the_chunk_reference_checkpoints():
    """fp32 snapshots are the states of an uninterrupted prefill at every block end."""
    model = _model()
    ids = _ids(2 * BLOCK + 7)
    pc = PrefixStateCache(model, BLOCK, state_format="fp32")
    pc.prefill(ids)
    for j, key in enumerate(pc.block_hashes(ids)):
        _, ref_cache = _recompute(model, ids[:(j + 1) * BLOCK], 1)
        for layer, st in pc.entries[key].states.items():
            torch.testing.assert_close(st.load(), ref_cache.states[layer].load(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt,rounding", [("int8_row", "nearest"), ("int8_row", "stochastic"),
                                          ("fp8_row", "nearest"), ("bf16", None)])
def test_8bit_snapshot_is_the_state_rounded_once(fmt, rounding):
    """A snapshot in a format is the fp32 snapshot stored once by the one state codec (bit for bit,
    random bits keyed by seed, row 0, store 1, chunk P/64), and its error is within the format's step:
    int8 to nearest <= absmax/127/2 per row, stochastic < absmax/127, fp8 e4m3 <= 2^-4 relative
    (3 mantissa bits; below 2^-6 * scale the subnormal step 2^-9 * scale), bf16 <= 2^-8 relative."""
    model = _model()
    ids = _ids(2 * BLOCK + 3)
    exact = PrefixStateCache(model, BLOCK, state_format="fp32", seed=7)
    rounded = PrefixStateCache(model, BLOCK, state_format=fmt, rounding=rounding, seed=7)
    exact.prefill(ids)
    rounded.prefill(ids)
    for j, (ke, kr) in enumerate(zip(exact.block_hashes(ids), rounded.block_hashes(ids))):
        for layer, st in rounded.entries[kr].states.items():
            s = exact.entries[ke].states[layer].load()
            want = store_states(s[:, None], fmt, rounding or "nearest", 7, 1, [(j + 1) * BLOCK // 64]).data[:, 0]
            assert torch.equal(st.data.view(torch.uint8) if st.data.element_size() == 1 else st.data,
                               want.view(torch.uint8) if want.element_size() == 1 else want)
            err = (st.load() - s).abs()
            absmax = s.abs().amax(-1, keepdim=True)
            if fmt == "int8_row":
                bound = absmax / 127 * (0.5 if rounding == "nearest" else 1.0) * (1 + 1e-6)
            elif fmt == "fp8_row":
                scale = absmax / 448
                bound = torch.maximum(s.abs() * 2**-4, scale * 2**-9) * (1 + 1e-6)
            else:
                bound = s.abs() * 2**-8
            assert err.max() > 0 and bool((err <= bound).all())


@pytest.mark.parametrize("fmt,rounding,name", [("int8_row", "stochastic", "gla"), ("fp8_row", "nearest", "gla"),
                                               ("int8_row", "nearest", "gated_deltanet")])
def test_8bit_hit_equals_recomputation_from_the_rounded_state(fmt, rounding, name):
    """Resuming from an 8-bit snapshot is the uninterrupted run with the state at P replaced by its
    rounding, nothing else: the same logits as a prefill from the dequantized snapshot (fp32 tolerance),
    and different (by the rounding) from the fp32 resume."""
    model = _model(**CONFIGS[name])
    ids = _ids(2 * BLOCK + 30)
    keep = 30
    pc = PrefixStateCache(model, BLOCK, state_format=fmt, rounding=rounding)
    pc.prefill(ids[:2 * BLOCK + 1])
    logits, cache, cached = pc.prefill(ids, logits_to_keep=keep)
    assert cached == 2 * BLOCK
    snap = pc.entries[pc.block_hashes(ids)[-1]]
    manual = model.new_cache()
    from laquant.kernels.common.state import State

    for layer, st in snap.states.items():
        manual.states[layer] = State(st.load(), None, "fp32", 0)
    manual.conv = dict(snap.conv)
    manual.kv = {layer: tuple(torch.cat([pc.entries[h].kv[layer][i] for h in pc.block_hashes(ids)[:2]], 1)
                              for i in (0, 1)) for layer in snap.kv}
    manual.seen_tokens = 2 * BLOCK
    with torch.no_grad():
        want = model(ids[None, 2 * BLOCK:], past_key_values=manual, use_cache=True).logits
    torch.testing.assert_close(logits, want, atol=2e-5, rtol=1e-5)
    ref, _ = _recompute(model, ids, keep)
    diff = (logits - ref).abs().max().item()
    assert 0 < diff < 0.05 * ref.abs().max().item()


@pytest.mark.parametrize("fmt", STATE_FORMATS)
def test_every_state_format_snapshots_and_resumes(fmt):
    """Each state format the pool accepts (`laquant eval serve --formats`) takes snapshots (fp8_tensor's
    one scale too), resumes from them close to recomputation, and sizes them as its codes and scales:
    the per-row formats pay one float32 per row, fp8_head one per head, fp8_tensor one per snapshot."""
    model = _model()
    ids = _ids(2 * BLOCK + 9)
    pc = PrefixStateCache(model, BLOCK, state_format=fmt)
    pc.prefill(ids[:2 * BLOCK + 1])
    logits, _, cached = pc.prefill(ids, logits_to_keep=9)
    assert cached == 2 * BLOCK
    ref, _ = _recompute(model, ids, 9)
    assert torch.isfinite(logits).all()
    assert (logits - ref).abs().max() < 0.1 * ref.abs().max()
    layers, H, K, V = 3, 2, 16, 32  # the tiny GLA: expand_k 0.5, expand_v 1 over hidden 64
    per_row = {"fp32": 4 * V, "bf16": 2 * V, "fp8_row": V + 4, "int8_row": V + 4, "int4_row": -(-V // 2) + 4}
    want = {"fp8_head": layers * H * (K * V + 4), "fp8_tensor": layers * (H * K * V + 4)}.get(fmt)
    assert pc.snapshot_bytes() == (want or layers * H * K * per_row[fmt])


def test_quantized_state_model_restores_its_own_format():
    """A model whose recipe stores an int8 state (stochastic): snapshots default to that format and
    rounding, and a restored state is stored 0 times, so the resumed prefill's final store is store 1."""
    model = _model()
    for layer in model.model.layers:
        layer.attn.state_quantizer = StateQuantizer("int8_row", rounding="stochastic")
    ids = _ids(BLOCK + 10)
    pc = PrefixStateCache(model, BLOCK)
    pc.prefill(ids[:BLOCK + 1])
    snap = next(iter(pc.entries.values()))
    assert {s.format for s in snap.states.values()} == {"int8_row"}
    restored = pc.restore(pc.lookup(ids))
    assert all(s.format == "int8_row" and s.n_stores == 0 for s in restored.states)
    assert restored.states[0].data.data_ptr() != snap.states[0].data.data_ptr()  # a copy: decode updates in place
    logits, cache, cached = pc.prefill(ids, logits_to_keep=10)
    assert cached == BLOCK and all(s.n_stores == 1 for s in cache.states)
    ref, _ = _recompute(model, ids, 10)
    assert (logits - ref).abs().max() < 0.05 * ref.abs().max()


def _snapshot_cache(budget_snaps: float, **kw):
    model = _model()
    probe = PrefixStateCache(model, BLOCK, state_format="int8_row", **kw)
    probe.prefill(_ids(BLOCK + 1))
    size = probe.snapshot_bytes()
    return PrefixStateCache(model, BLOCK, budget_bytes=int(budget_snaps * size), state_format="int8_row", **kw), size


def test_lru_eviction_under_the_byte_budget():
    pc, size = _snapshot_cache(2.5)
    a, b, c = _ids(BLOCK + 1, 1), _ids(BLOCK + 1, 2), _ids(BLOCK + 1, 3)
    assert_lru_evicts_the_least_recent(pc, size, a, b, c)
    tiny = PrefixStateCache(pc.model, BLOCK, budget_bytes=size - 1, state_format="int8_row")
    tiny.prefill(a)
    assert len(tiny) == 0 and tiny.stats["too_large"] == 1


def test_fp32_snapshots_take_four_times_the_bytes():
    model = _model()
    sizes = {}
    for fmt in ("fp32", "bf16", "int8_row", "fp8_row"):
        pc = PrefixStateCache(model, BLOCK, state_format=fmt)
        pc.prefill(_ids(BLOCK + 1))
        sizes[fmt] = pc.snapshot_bytes()
    H, K, V = 2, 16, 32  # per layer: 2 heads of [16, 32]; per-row scales add 4 bytes per K row
    assert sizes["fp32"] == 3 * H * K * V * 4 and sizes["bf16"] == sizes["fp32"] // 2
    assert sizes["int8_row"] == sizes["fp8_row"] == 3 * (H * K * V + 4 * H * K)


def test_hash_chaining_a_different_earlier_block_never_matches():
    model = _model()
    pc = PrefixStateCache(model, BLOCK, state_format="fp32")
    x, y = _ids(BLOCK, 1), _ids(BLOCK, 2)
    tail = _ids(BLOCK + 1, 3)
    pc.prefill(torch.cat([x, tail]))
    other = torch.cat([y, tail])
    assert pc.block_hashes(other)[1] != pc.block_hashes(torch.cat([x, tail]))[1]
    assert pc.lookup(other).tokens == 0
    assert pc.lookup(torch.cat([x, tail])).tokens == 2 * BLOCK
    # a lookup always leaves a token to run: a prompt of exactly the cached blocks resumes one block early
    assert pc.lookup(torch.cat([x, tail[:BLOCK]])).tokens == BLOCK
    salted = PrefixStateCache(model, BLOCK, state_format="int8_row")
    assert salted.block_hashes(x) != pc.block_hashes(x)  # a pool of another format shares no keys


def test_softmax_layers_need_the_whole_chain():
    """A hybrid's snapshot holds its own block's KV only: with block 0 evicted, block 1 is no hit."""
    model = _model(**CONFIGS["hybrid_conv"])
    pc = PrefixStateCache(model, BLOCK, state_format="fp32")
    ids = _ids(2 * BLOCK + 1)
    pc.prefill(ids)
    assert pc.lookup(ids).tokens == 2 * BLOCK
    snap = pc.entries[pc.block_hashes(ids)[1]]
    assert snap.kv[1][0].shape[1] == BLOCK and snap.conv
    del pc.entries[pc.block_hashes(ids)[0]]
    assert pc.lookup(ids).tokens == 0


def test_bad_input_errors():
    model = _model()
    with pytest.raises(LaquantError, match="multiple of 64"):
        PrefixStateCache(model, 100)
    with pytest.raises(LaquantError, match="budget_bytes"):
        PrefixStateCache(model, BLOCK, budget_bytes=-1)
    with pytest.raises(LaquantError, match="state format"):
        PrefixStateCache(model, BLOCK, state_format="fp9")
    with pytest.raises(LaquantError, match="rounding"):
        PrefixStateCache(model, BLOCK, rounding="up")
    with pytest.raises(LaquantError, match="seed"):
        PrefixStateCache(model, BLOCK, seed=-1)
    pc = PrefixStateCache(model, BLOCK)
    with pytest.raises(LaquantError, match="one sequence at a time"):
        pc.prefill(torch.zeros(2, 70, dtype=torch.long))
    with pytest.raises(LaquantError, match="at least one token"):
        pc.prefill(torch.zeros(0, dtype=torch.long))
    with pytest.raises(LaquantError, match="LongTensor"):
        pc.prefill(torch.zeros(70))
    with pytest.raises(LaquantError, match="vocabulary"):
        pc.prefill(torch.full((70,), VOCAB, dtype=torch.long))
    with pytest.raises(LaquantError, match="GLAForCausalLM.*not Linear"):
        PrefixStateCache(torch.nn.Linear(2, 2), BLOCK)
    gdn = _model("gated_deltanet")
    for layer in gdn.model.layers:
        layer.attn.state_quantizer, layer.attn.prefill_roundtrip = StateQuantizer("int8_row"), True
    with pytest.raises(LaquantError, match="prefill_roundtrip"):
        PrefixStateCache(gdn, BLOCK)


@pytest.mark.parametrize("fmt,rounding,name", [("fp32", None, "gla"), ("int8_row", "stochastic", "gla"),
                                               ("int8_row", "stochastic", "gated_deltanet")])
def test_chunk_kernel_checkpoints_wired_to_the_cache(fmt, rounding, name, monkeypatch):
    """The mixers' Triton path (the chunk kernel's ``checkpoint_every``, here under Triton's CPU
    interpreter) makes the snapshots the reference path makes: fp32 within float32 rounding, int8
    with the same codes (one codec keyed alike; a code could differ only where the two float32 states
    straddle a rounding boundary, which these sizes do not hit)."""
    if not INTERPRETED:
        pytest.skip("CPU tensors through the kernels need Triton's interpreter (on CUDA: the gpu test below)")
    require_triton_kernels()
    import laquant.models.recurrent as recurrent

    model = _model(**CONFIGS[name])
    ids = _ids(2 * BLOCK + 9)
    snaps = {}
    for kernel in (False, True):
        monkeypatch.setattr(recurrent, "use_triton", lambda x, fmt=None, kernel=kernel: kernel)
        pc = PrefixStateCache(model, BLOCK, state_format=fmt, rounding=rounding)
        logits, _, _ = pc.prefill(ids, logits_to_keep=9)
        snaps[kernel] = (logits, [pc.entries[h] for h in pc.block_hashes(ids)])
    torch.testing.assert_close(snaps[True][0], snaps[False][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(snaps[True][1], snaps[False][1]):
        for layer in a.states:
            torch.testing.assert_close(a.states[layer].load(), b.states[layer].load(), atol=1e-6, rtol=1e-5)
            if fmt != "fp32":
                assert torch.equal(a.states[layer].data, b.states[layer].data)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gla", "gated_deltanet"])
@pytest.mark.parametrize("fmt", ["fp32", "int8_row"])
def test_kernel_checkpoints_are_the_reference_snapshots(fmt, name, monkeypatch):
    """On CUDA the snapshots come from the chunk kernels (GLA's checkpoints, the delta rule's pieces);
    with LAQUANT_KERNELS=reference from the references: the same states (fp32: float tolerance; int8: at most one code apart,
    where the two float32 states straddle a rounding boundary)."""
    model = _model(**CONFIGS[name]).cuda()
    ids = _ids(3 * BLOCK + 9).cuda()
    snaps = {}
    for choice in ("auto", "reference"):
        monkeypatch.setenv("LAQUANT_KERNELS", choice)
        pc = PrefixStateCache(model, BLOCK, state_format=fmt)
        pc.prefill(ids)
        snaps[choice] = [pc.entries[h] for h in pc.block_hashes(ids)]
    for a, b in zip(snaps["auto"], snaps["reference"]):
        for layer in a.states:
            sa, sb = a.states[layer], b.states[layer]
            if fmt == "fp32":
                torch.testing.assert_close(sa.data, sb.data, atol=1e-4, rtol=1e-4)
            else:
                torch.testing.assert_close(sa.scale, sb.scale, atol=0, rtol=1e-4)
                assert (sa.data.int() - sb.data.int()).abs().max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("kind,state,dtype", [("gla", None, torch.bfloat16), ("gla", "int8_row", torch.bfloat16),
                                              ("hybrid_conv", "int8_row", torch.float32)])
def test_gpu_hit_and_graphed_decode_match_recomputation(kind, state, dtype):
    """On the kernels: a hit's logits against the full prefill's, and the graphed greedy decode after a hit against
    the eager decode after the same hit (the restored state decodes in place). A model with an fla softmax attn
    layer (float32: its static step's attention is another kernel than the eager step's, equal to float32
    rounding) decodes from its graph too (it decoded eagerly before)."""
    from conftest import rel_err

    from laquant.serving.replay import full_prefill, greedy_decode

    model = _model(**CONFIGS[kind]).cuda().to(dtype)
    if state is not None:
        for layer in model.model.layers:
            if hasattr(layer.attn, "state_quantizer"):  # not the softmax attn layer
                layer.attn.state_quantizer = StateQuantizer(state, rounding="stochastic")
    ids = _ids(3 * BLOCK + 17)  # the hit's suffix is shorter than a block: no new snapshot, the same hit again
    pc = PrefixStateCache(model, BLOCK, state_format="fp32" if state is None else None)
    pc.prefill(ids[:3 * BLOCK + 1])
    logits, cache, cached = pc.prefill(ids)
    assert cached == 3 * BLOCK
    ref_logits, _ = full_prefill(model, ids)
    assert rel_err(logits[:, -1].float(), ref_logits[:, -1].float()) < 2e-2
    again, cache_b, _ = pc.prefill(ids)
    assert torch.equal(again, logits)  # the snapshot was copied out, not decoded in place
    first = logits[:, -1].argmax(-1)
    graphed = greedy_decode(model, cache, first, 8)
    eager = []
    tok = first
    with torch.no_grad():
        for _ in range(8):
            tok = model(tok[:, None], past_key_values=cache_b, use_cache=True).logits[:, -1].argmax(-1)
            eager.append(tok)
    assert torch.equal(graphed, torch.stack(eager, 1))
    from laquant.generate import _DecodeGraph

    graphs = model.__dict__["_laquant_decode_graphs"].values()  # a refused capture is kept there as its error
    assert graphs and all(isinstance(g, _DecodeGraph) for g in graphs)  # the replay's decode was captured


SERVE_ERRORS = [
    ["eval", "serve", "--block-size", "100"],
    ["eval", "serve", "--system", "0"],
    ["eval", "serve", "--formats", "fp9"],
    ["eval", "serve", "--budget-mb", "-1"],
    ["eval", "serve", "--accuracy-prefix", "1024", "--accuracy-len", "1024"],
    ["eval", "serve", "--no-replay", "--no-accuracy"],
    ["eval", "serve", "/no/such/model"],
    ["eval", "serve", "config:[1]"],
    ["eval", "serve", "--recipe", "no_such_recipe"],
    ["eval", "serve", "--draft-tokens", "0"],
    ["eval", "serve", "--draft", "config:{}"],
    ["eval", "serve", "--draft", "gla-small", "--no-replay"],
]


@pytest.mark.parametrize("argv", SERVE_ERRORS + [["eval", "serve", "--help"], ["eval", "serve", "{gdn}"]])
def test_serve_cli_argument_errors_import_no_torch(argv, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a model the cache does not cover
    argv = [a.replace("{gdn}", str(tmp_path)) for a in argv]
    code = ("import sys\nfrom laquant.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    rc = e.code\nprint('HEAVY', 'torch' in sys.modules, 'RC', rc, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("HEAVY False RC "), proc.stderr[-2000:]
    if "--help" not in argv:
        assert last == "HEAVY False RC 2" and "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_eval_serve_end_to_end(tmp_path):
    """``laquant eval serve`` on a tiny random GLA: both replays, the follow-up TTFT, the memory table."""
    import json

    from laquant.cli import main

    cfg = '{"hidden_size": 64, "num_hidden_layers": 2, "num_heads": 2, "vocab_size": 97}'
    out = tmp_path / "serve"
    assert main(["eval", "serve", f"config:{cfg}", "--system", "140", "--conversations", "2", "--turns", "2",
                 "--user", "8", "--reply", "3", "--block-size", "64", "--reps", "1", "--device", "cpu",
                 "--formats", "fp32", "int8_row", "--quiet", "--out", str(out)]) == 0
    res = json.loads((out / "serve.json").read_text())["results"][0]
    assert (out / "serve.md").exists() and (out / "serve.png").stat().st_size > 0
    assert [r["cached_tokens"] for r in res["requests"]["no_cache"]] == [0] * 4
    # conversation 0's first request caches the system prompt's 2 blocks; every later request hits them
    assert [r["cached_tokens"] for r in res["requests"]["prefix_cache"]] == [0, 128, 128, 128]
    assert res["follow_up"]["cached_tokens"] == 128 and res["pool"]["request_hit_rate"] == 0.75
    mem = {m["format"]: m for m in res["memory"]}
    assert mem["int8_row"]["vs_fp32"] == pytest.approx(4 * 32 / (32 + 4), rel=1e-3)  # V = 32: 4 scale bytes per row
    assert "accuracy" not in res  # a random model has no accuracy to measure


def test_eval_serve_with_speculation(tmp_path):
    """``--draft``: the cached replay again with speculative decoding. The model drafting for itself
    is accepted every time and its replies are the greedy ones, request by request."""
    import json

    import shutil

    from laquant.cli import main
    from laquant.loading import default_model_dir

    torch.manual_seed(0)
    folder = tmp_path / "tiny"
    GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=97)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # laquant.load reads a folder's tokenizer
        shutil.copy(default_model_dir() / name, folder / name)
    out = tmp_path / "serve"
    assert main(["eval", "serve", str(folder), "--draft", str(folder), "--draft-tokens", "3", "--system", "70",
                 "--conversations", "2", "--turns", "2", "--user", "8", "--reply", "6", "--block-size", "64",
                 "--reps", "1", "--device", "cpu", "--formats", "fp32", "--no-accuracy", "--quiet",
                 "--out", str(out)]) == 0
    res = json.loads((out / "serve.json").read_text())["results"][0]
    spec = res["speculation"]
    assert spec["replies_equal_greedy"] and spec["acceptance"] == 1.0 and spec["rounds"] > 0
    assert [r["reply"] for r in res["requests"]["speculative"]] == [r["reply"] for r in res["requests"]["prefix_cache"]]
    assert res["speculative"]["decode_tokens_per_s"] > 0 and "speculative decoding" in (out / "serve.md").read_text()


@torch.no_grad()
def test_first_partings_measure_the_logit_gap_where_each_conversation_parts():
    """Replies that part from the greedy ones: for each conversation, where it first parts and the gap of the two
    tokens' logits there (the prompt plus the greedy reply's prefix run whole); its later replies are skipped, and
    the report names them."""
    from laquant.eval.serve import _partings
    from laquant.serving.replay import Workload, first_partings, replay

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=97)).eval()
    workload = Workload(system=20, conversations=2, turns=2, user=5, reply=6, seed=3)
    prompts = []
    greedy = replay(model, workload, prompts=prompts)
    assert [len(p) for p in prompts] == [r["prompt_tokens"] for r in greedy]
    other = [dict(r, reply=list(r["reply"])) for r in greedy]
    other[0]["reply"][3] = (other[0]["reply"][3] + 1) % 97  # conversation 0 parts at its first reply's token 3
    other[2]["reply"][0] = (other[2]["reply"][0] + 1) % 97  # its next reply: a history of its own, skipped
    assert first_partings(model, greedy, greedy, prompts) == []
    (part,) = first_partings(model, greedy, other, prompts)
    assert part["request"] == 0 and part["position"] == 3
    logits = model(torch.cat([prompts[0], torch.tensor(greedy[0]["reply"][:3])])[None]).logits[0, -1]
    want = (logits[greedy[0]["reply"][3]] - logits[other[0]["reply"][3]]).abs() / logits.abs().max()
    assert part["gap"] == pytest.approx(float(want), rel=1e-5) and part["gap"] > 0
    assert "0 at 3:" in _partings([part]) and _partings(None) == "the gap is not measured"


def test_speculative_replay_with_another_draft_gives_the_greedy_replies():
    """A draft that is another model: acceptance below 1, replies still the greedy ones (CPU: exact)."""
    from laquant.serving.replay import SpeculativeDecode, Workload, replay

    cfg = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=97)
    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(**cfg)).eval()
    draft = GLAForCausalLM(GLAConfig(**cfg)).eval()
    work = Workload(system=70, conversations=2, turns=2, user=8, reply=9)
    pool = lambda: PrefixStateCache(model, 64)  # noqa: E731
    greedy = replay(model, work, pool())
    spec = SpeculativeDecode(draft, 4)
    got = replay(model, work, pool(), spec)
    assert [r["reply"] for r in got] == [r["reply"] for r in greedy]
    assert 0 <= spec.stats.acceptance < 1 and spec.stats.rounds >= 4


def test_resume_from_8bit_snapshot_keeps_the_loss_of_shipped_gla_small():
    """The issue's target (< 0.1% next-token loss change from resuming at an 8-bit snapshot), on the
    trained gla-small and real text, at a CPU size."""
    from laquant.api import load
    from laquant.data import load_text, tokenize
    from laquant.serving.accuracy import resume_loss, text_windows

    model, tok = load(None)
    windows = text_windows(tokenize(load_text("wikitext2")[:20000], tok), 1, 384)
    res = resume_loss(model, windows, 256, "int8_row")
    assert res["tokens"] == 127 and res["max_logit_diff"] > 0
    assert abs(res["rel_loss_change"]) < 1e-3 and res["rel_token_loss_abs_change"] < 1e-3
