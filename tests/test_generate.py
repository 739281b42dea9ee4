"""laquant.generate (the eager reference loop on CPU, the CUDA-graphed loop on GPU), the static
cache it decodes on, the `laquant generate` command, and the e2e speed suite's CPU-side parts."""

import json

import pytest
import torch

from laquant.cli import main
from laquant.errors import LaquantError
from laquant.generate import DecodeSession, generate, pick_tokens, trim_after_eos
from laquant.kernels.common.state import State, StateQuantizer
from laquant.models import GLAConfig, GLAForCausalLM
from laquant.models.cache import GLAStateCache, StaticState


def _plain_loop(model, ids, n, cache=None):
    """Greedy decoding written out: the prompt, then one token at a time through the cache."""
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    cache, tokens = out.past_key_values, [ids]
    logits = out.logits[:, -1]
    for _ in range(n):
        tokens.append(logits.argmax(-1, keepdim=True))
        logits = model(input_ids=tokens[-1], past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.cat(tokens, 1)


def _tiny_gla(**kw):
    torch.manual_seed(1)
    cfg = dict(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=512, bos_token_id=0, eos_token_id=0)
    return GLAForCausalLM(GLAConfig(**{**cfg, **kw})).eval()


@torch.no_grad()
def test_eager_loop_equals_transformers_generate_and_a_plain_loop(tiny_model_dir):
    from laquant.loading import load_model

    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(0, 8192, (2, 9))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False)
    out = generate(model, ids, 7)
    assert torch.equal(out, ref)
    assert torch.equal(out, _plain_loop(model, ids, 7))
    assert torch.equal(generate(model, ids, 7, graphed=False), out)  # graphed=None is eager on the CPU


@torch.no_grad()
def test_eos_stops_when_every_sequence_has_finished():
    model = _tiny_gla()
    ids = torch.randint(1, 512, (3, 5))
    free = generate(model, ids, 40)[:, 5:]
    eos = int(free[0, 3])  # the first row produces it at step 3
    out = generate(model, ids, 40, eos_token_id=eos)[:, 5:]
    assert out.shape[1] <= 40 and torch.equal(out[0, :4], free[0, :4])
    for row, ref in zip(out, free):  # each row: as without EOS up to its first EOS, then EOS
        hits = (ref == eos).nonzero()
        if len(hits) and hits[0, 0] < out.shape[1]:
            first = int(hits[0, 0])
            assert torch.equal(row[:first + 1], ref[:first + 1]) and bool((row[first:] == eos).all())
        else:
            assert torch.equal(row, ref[:out.shape[1]])
    assert out.shape[1] == 40 or bool((out[:, -1] == eos).all())


def test_trim_after_eos():
    new = torch.tensor([[5, 2, 2, 2], [7, 7, 2, 2]])
    assert torch.equal(trim_after_eos(new, 2), new[:, :3])
    assert torch.equal(trim_after_eos(new, 9), new)
    assert torch.equal(trim_after_eos(new, None), new)


def test_sampling():
    logits = torch.randn(4, 50)
    assert torch.equal(pick_tokens(logits, True, 0.7, top_k=1), logits.argmax(-1))  # top-1 sampling is greedy
    draws = torch.stack([pick_tokens(logits, True, 1.0, top_k=3) for _ in range(200)])
    top3 = logits.topk(3).indices
    assert all(bool(torch.isin(draws[:, b], top3[b]).all()) for b in range(4))
    assert len(draws[:, 0].unique()) > 1
    model, ids = _tiny_gla(), torch.randint(1, 512, (2, 4))
    a = generate(model, ids, 6, do_sample=True, top_k=20, generator=torch.Generator().manual_seed(3))
    b = generate(model, ids, 6, do_sample=True, top_k=20, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (2, 10)


def test_bad_input_is_an_error():
    model = _tiny_gla()
    with pytest.raises(LaquantError, match="CUDA"):
        generate(model, torch.ones(1, 3, dtype=torch.long), 4, graphed=True)
    with pytest.raises(LaquantError, match="vocabulary"):
        generate(model, torch.full((1, 3), 600), 4)
    with pytest.raises(LaquantError, match="LongTensor"):
        generate(model, torch.ones(3), 4)
    with pytest.raises(LaquantError, match="max_new_tokens"):
        generate(model, torch.ones(1, 3, dtype=torch.long), 0)
    with pytest.raises(LaquantError, match="temperature"):
        generate(model, torch.ones(1, 3, dtype=torch.long), 2, do_sample=True, temperature=0)


@torch.no_grad()
def test_eager_loop_on_a_transformers_hybrid():
    from laquant.adapters import install, new_cache
    from test_hybrid import qwen3_next  # tests/ is on sys.path under pytest (conftest.py)

    model = qwen3_next().eval()
    install(model)
    ids = torch.randint(0, 8192, (2, 7))
    assert torch.equal(generate(model, ids, 5), _plain_loop(model, ids, 5, new_cache(model)))


# ---------------------------------------------------------------------------------- static cache
def _filled_cache(n_layers=3, batch=2, n_stores=1, fmt="fp8_row"):
    cache = GLAStateCache(n_layers)
    quant = StateQuantizer(fmt)
    for i in range(n_layers):
        data, scale = quant.store(torch.randn(batch, 2, 4, 4))
        cache.states[i] = State(data, scale, fmt, n_stores)
    cache.seen_tokens = 9
    return cache


def test_static_cache_counts_stores_on_the_device():
    cache = _filled_cache()
    static = cache.static_copy()
    slots = static.slots
    assert all(isinstance(s, StaticState) and s.slots is slots for s in static.states)
    assert slots.pool_idx.tolist() == [0, 1] and slots.n_stores.tolist() == [1, 1]
    assert static.states[0].data.data_ptr() != cache.states[0].data.data_ptr()  # copies
    for _ in range(5):  # five decode steps of three layers: the shared counter moves once per step
        for layer in range(3):
            static.count_static_step(layer)
    assert slots.n_stores.tolist() == [6, 6] and static.states[0].n_stores == 1
    assert static.sync_counters() == 5
    assert [s.n_stores for s in static.states] == [6, 6, 6] and static.seen_tokens == 14
    data_ptr = static.states[1].data.data_ptr()
    other = _filled_cache(n_stores=4)
    static.load_from(other)
    assert static.states[1].data.data_ptr() == data_ptr and torch.equal(static.states[1].data.float(),
                                                                       other.states[1].data.float())
    assert slots.n_stores.tolist() == [4, 4] and static.seen_tokens == 9
    with pytest.raises(ValueError, match="stored"):
        uneven = _filled_cache()
        uneven.states[2].n_stores = 2
        uneven.static_copy()
    with pytest.raises(ValueError, match="every layer"):
        GLAStateCache(2).static_copy()


def test_mixer_uses_a_static_caches_tensors():
    from laquant.models.recurrent import RecurrentMixer

    static = _filled_cache().static_copy()
    mixer = RecurrentMixer(layer_idx=2)
    stored = static.get(2)
    pool_idx, _, n_stores = mixer._pool_slots(stored, 2, "cpu")
    assert pool_idx is static.slots.pool_idx and n_stores is static.slots.n_stores  # no per-step allocation
    mixer._count_decode_step(static, stored)
    assert static.get(2) is stored and static.slots.n_stores.tolist() == [2, 2]
    plain = _filled_cache()
    mixer._count_decode_step(plain, plain.get(2))
    assert plain.get(2).n_stores == 2 and plain.seen_tokens == 10  # an ordinary cache counts in Python


def test_dynamic_cache_layers_share_one_steps_slots(monkeypatch):
    """A dynamic cache's decode step makes its pool slots once for all its layers, with the values each layer's kernel
    would have been given; a new count or batch gets new ones, and a graph capture gets tensors of its own, not kept."""
    from laquant.models import recurrent

    monkeypatch.setattr(recurrent, "_EAGER_SLOTS", {})
    cache = _filled_cache(n_stores=4)
    mixers = [recurrent.RecurrentMixer(layer_idx=i) for i in range(3)]
    first, second = (m._pool_slots(cache.get(m.layer_idx), 2, "cpu") for m in mixers[1:])
    assert first[0] is second[0] and first[2] is second[2]
    assert first[0].tolist() == [0, 1] and first[2].tolist() == [4, 4] and first[2].dtype == torch.int32
    later = mixers[1]._pool_slots(State(cache.get(1).data, None, "fp32", 5), 2, "cpu")
    assert later[2].tolist() == [5, 5] and later[2] is not first[2]
    assert mixers[1]._pool_slots(cache.get(1), 3, torch.device("cpu"))[0].tolist() == [0, 1, 2]
    for n in range(6, 6 + 2 * recurrent._EAGER_SLOTS_KEPT):
        recurrent.eager_pool_slots(2, n, torch.device("cpu"))
    assert len(recurrent._EAGER_SLOTS) == recurrent._EAGER_SLOTS_KEPT  # the oldest steps' slots let go
    monkeypatch.setattr(recurrent, "_EAGER_SLOTS", {})
    kept = recurrent.eager_pool_slots(2, 9, torch.device("cpu"))
    monkeypatch.setattr(recurrent, "_capturing", lambda device: True)
    captured = recurrent.eager_pool_slots(2, 9, torch.device("cpu"))
    assert captured[1].tolist() == [9, 9] and captured[0] is not kept[0] and captured[1] is not kept[1]
    recurrent.eager_pool_slots(2, 10, torch.device("cpu"))
    assert list(recurrent._EAGER_SLOTS.values()) == [kept]  # a capture neither reads nor adds kept slots


# ------------------------------------------------------------------------------------------- CLI
def test_cli_generate(capsys):
    assert main(["generate", "--prompt", "The history of", "--max-new-tokens", "4", "--device", "cpu",
                 "--no-eos"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The history of") and "4 tokens" in out and "tokens/s (eager, cpu)" in out
    assert main(["generate", "--prompt", "x", "--temperature", "0.8", "--top-k", "5", "--max-new-tokens", "3",
                 "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["generate", "no-such-model-dir", "--prompt", "x"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--max-new-tokens", "0", "--device", "cpu"]) == 2
    assert "--max-new-tokens must be >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--top-k", "3", "--device", "cpu"]) == 2
    assert "needs --temperature" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--greedy", "--temperature", "1"])
    assert "not allowed with argument --greedy" in capsys.readouterr().err


# ------------------------------------------------------------------------------- eval speed, e2e
def test_eval_speed_arguments(capsys):
    from laquant.cli import build_parser

    args = build_parser().parse_args(["eval", "speed", "--suite", "e2e", "--peers", "--model",
                                      'config:{"hidden_size": 512}', "qwen3_next:{}", "--profile", "8", "128"])
    assert args.peers and args.profile == [8, 128] and args.model[1] == "qwen3_next:{}"
    assert main(["eval", "speed", "--suite", "e2e", "--model", "config:[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["eval", "speed", "--suite", "e2e", "--model", "qwen3_next:{oops"]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["eval", "speed", "--suite", "e2e", "--model", 'kimi_linear:{"hidden_size": "wide"}']) == 2
    assert "not a valid kimi_linear config" in capsys.readouterr().err
    args = build_parser().parse_args(["eval", "speed", "--set", "projections.outlier_fallback=weight_only"])
    assert args.overrides == ["projections.outlier_fallback=weight_only"]
    assert main(["eval", "speed", "--suite", "e2e", "--set", "projections.outlier_fallback=bf16"]) == 2
    assert "outlier_fallback = 'bf16' is not allowed; allowed: keep, weight_only" in capsys.readouterr().err
    assert main(["eval", "speed", "--suite", "e2e", "--set", "projections.outlier_fallback=weight_only",
                 "some_checkpoint"]) == 2
    assert "timed as saved" in capsys.readouterr().err


def test_recipe_variants_take_the_overrides():
    """``eval speed --set``: the quantized variant is calibrated with the overridden recipe and says so."""
    from laquant.eval.speed import recipe_variants

    (_, bf16, _), (_, name, _) = recipe_variants(['nemotron_h:{"num_hidden_layers": 2}'], "gla_int8",
                                                 overrides=["projections.outlier_fallback=weight_only"])
    assert bf16 == "bf16" and name == "hybrid_int8 projections.outlier_fallback=weight_only"


def test_qwen3_next_peer_config():
    from laquant.eval.speed import qwen3_next_config

    cfg = qwen3_next_config({"num_hidden_layers": 6, "full_attention_interval": 3})
    assert cfg.layer_types == ["linear_attention", "linear_attention", "full_attention"] * 2
    assert cfg.hidden_size == 1024


def _synthetic_kernels(layers=2):
    ks, t = [], 0.0

    def add(name, dur):
        nonlocal t
        ks.append((name, t, dur))
        t += dur + 1

    add("embedding_kernel", 2.0)
    for _ in range(layers):
        add("spin_kernel(long)", 0.5)
        for name, dur in (("gemm_bf16<128, 64>(Params)", 10.0), ("_gla_decode_kernel", 5.0), ("rmsnorm", 1.0)):
            add(name, dur)
    add("spin_kernel(long)", 0.5)
    add("gemm_bf16<128, 64>(Params)", 20.0)
    return ks


def test_profile_summary():
    from laquant.eval.speed import short_kernel_name, summarize_kernels

    s = summarize_kernels(_synthetic_kernels(), num_layers=2)
    assert s["kernels_per_step"] == 8 and s["kernels_per_layer"] == 3 and s["kernels_outside_layers"] == 2
    assert s["gpu_ms_per_step"] == pytest.approx(0.054)
    name, calls, ms, share = s["top_kernels"][0]
    assert (name, calls, ms) == ("gemm_bf16", 3, pytest.approx(0.040)) and share == pytest.approx(40 / 54)
    assert summarize_kernels(_synthetic_kernels(), num_layers=3)["kernels_per_layer"] is None  # markers missing
    assert short_kernel_name("void at::native::vectorized_elementwise_kernel<4, Functor<float>>(int, F)") == \
        "void at::native::vectorized_elementwise_kernel"


def _e2e_rows():
    from laquant.eval.speed import summarize_kernels

    prof = summarize_kernels(_synthetic_kernels(), num_layers=2)
    base = {"model": "random GLA 512x4", "params+buffers": 1000, "prompt_len": 256, "decode_steps": 8,
            "prefill_tok_per_s": 1e5, "decode_B1_tok_per_s": 100.0, "decode_B64_tok_per_s": 5000.0,
            "state_bytes_per_seq": 4096}
    return [
        {**base, "variant": "bf16", "decode_path": "graphed + eager", "decode_B1_graphed_tok_per_s": 300.0,
         "decode_B64_graphed_tok_per_s": 9000.0, **prof, "profile": "B=64, prompt 512, one eager step"},
        {**base, "variant": "gla_int8_all", "decode_path": "graphed + eager", "decode_B1_graphed_tok_per_s": 250.0,
         "decode_B64_graphed_tok_per_s": 11000.0, **prof},
        {**base, "variant": "fla_bf16", "decode_path": "eager only", "decode_B1_graphed_tok_per_s": None,
         "decode_B64_graphed_tok_per_s": None, "peer_path": "fla 0.6 GLAForCausalLM", **prof},
    ]


def test_e2e_markdown_and_plot(tmp_path):
    from laquant.eval.speed import best_decode_rate, markdown, plot_e2e

    rows = _e2e_rows()
    md = markdown({"versions": {"device": "test"}, "copy_bandwidth_GBps": 3000.0, "e2e": rows})
    assert "## e2e" in md and "### e2e: one eager decode step" in md
    assert "| random GLA 512x4 | fla_bf16 | 8 | 3 | 2 | 0.054 |" in md
    assert "`gemm_bf16` (3, 0.040, 74%)" in md and "**fla_bf16**: fla 0.6 GLAForCausalLM" in md
    header = next(line for line in md.splitlines() if line.startswith("| model | params"))
    assert "top_kernels" not in header and "decode_B64_graphed_tok_per_s" in header
    assert best_decode_rate(rows[0], 64) == (9000.0, True) and best_decode_rate(rows[2], 64) == (5000.0, False)
    plot_e2e(rows, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 10_000
    json.dumps(rows)  # what speed.json stores


# ------------------------------------------------------------------------------------------- GPU
def _gpu_model(recipe=None, renorm_interval=None, **kw):
    import laquant
    from laquant.recipe import load_recipe

    torch.manual_seed(0)
    cfg = dict(hidden_size=256, num_hidden_layers=3, num_heads=2, vocab_size=4096, bos_token_id=0, eos_token_id=0)
    with torch.device("cuda"):
        model = GLAForCausalLM(GLAConfig(**{**cfg, **kw}))
    model = model.to(torch.bfloat16).eval()
    if recipe is not None:
        rec = load_recipe(recipe, [f"state.renorm_interval={renorm_interval}"] if renorm_interval else None)
        laquant.calibrate(model, rec, torch.randint(0, 4096, (4, 256), device="cuda"), progress=False)
    return model


@pytest.mark.gpu
@pytest.mark.parametrize("recipe,renorm", [(None, None), ("gla_int8_all", None), ("gla_int8", 4)])
@torch.no_grad()
def test_graphed_loop_equals_the_eager_loop(recipe, renorm):
    from laquant.generate import release_graphs

    model = _gpu_model(recipe, renorm)
    if renorm:
        assert {m.state_quantizer.renorm_interval for m in model.modules() if hasattr(m, "state_quantizer")} == {renorm}
    for B, n in ((3, 40), (3, 25), (1, 12)):
        ids = torch.randint(1, 4096, (B, 17), device="cuda")
        eager = generate(model, ids, n, graphed=False)
        graphed = generate(model, ids, n)  # graphed=None: graphed on CUDA
        assert torch.equal(graphed, eager), (B, n)
    graphs = model.__dict__["_laquant_decode_graphs"]
    assert len(graphs) == 2  # captured once per batch size, reused across calls
    # the device counter ran with the steps (renormalisation schedule), and synced back
    session = DecodeSession(model, ids, 10, graphed=True)
    session.run()
    cache = session.graph.cache
    assert cache.slots.n_stores.tolist() == [10] and [s.n_stores for s in cache.states] == [10] * 3
    assert cache.seen_tokens == 17 + 9
    # EOS, checked every few steps
    ids = torch.randint(1, 4096, (2, 9), device="cuda")
    free = generate(model, ids, 30, graphed=False)
    eos = int(free[0, 9 + 5])
    assert torch.equal(generate(model, ids, 30, eos_token_id=eos), generate(model, ids, 30, eos_token_id=eos,
                                                                            graphed=False))
    release_graphs(model)
    assert "_laquant_decode_graphs" not in model.__dict__


@pytest.mark.gpu
@torch.no_grad()
def test_a_moved_model_is_captured_again():
    """A model moved after its decode step was captured (to the CPU and back: its weights reallocated): its graphs
    are released by the move, the next call captures again and decodes as the eager loop does."""
    model = _gpu_model("gla_int8_all")
    ids = torch.randint(1, 4096, (2, 17), device="cuda")
    generate(model, ids, 8)
    assert len(model.__dict__["_laquant_decode_graphs"]) == 1
    model.cpu()
    assert "_laquant_decode_graphs" not in model.__dict__
    hold = torch.empty(1 << 20, device="cuda")  # takes freed memory, so that the weights likely land elsewhere
    model.cuda()
    assert torch.equal(generate(model, ids, 8), generate(model, ids, 8, graphed=False))
    assert len(model.__dict__["_laquant_decode_graphs"]) == 1
    del hold


@pytest.mark.gpu
@torch.no_grad()
def test_graphed_sampling_runs():
    model = _gpu_model()
    ids = torch.randint(1, 4096, (4, 8), device="cuda")
    torch.manual_seed(5)
    out = generate(model, ids, 20, do_sample=True, temperature=0.9, top_k=50)
    assert out.shape == (4, 28) and bool((out < 4096).all())
    with pytest.raises(LaquantError, match="generator"):
        generate(model, ids, 4, do_sample=True, generator=torch.Generator("cuda"), graphed=True)
    g = torch.Generator("cuda")
    a = generate(model, ids, 6, do_sample=True, generator=g.manual_seed(1))  # graphed=None: eager with it
    assert torch.equal(a, generate(model, ids, 6, do_sample=True, generator=g.manual_seed(1), graphed=False))


@pytest.mark.gpu
def test_a_failed_capture_leaves_the_cuda_generator_usable():
    """torch leaves the default CUDA generator in capture mode when a capture fails (every later random op
    on the device then raises); capture_graph puts its state back."""
    from laquant.generate import capture_graph

    def refused():
        torch.rand(3, device="cuda")  # the generator joins the capture
        return torch.ones(2).cuda()  # a copy from pageable host memory: the capture fails

    with pytest.raises(RuntimeError):
        capture_graph(refused)
    torch.cuda.synchronize()
    assert torch.randint(0, 5, (4,), device="cuda").shape == (4,)
    graph, out = capture_graph(lambda: torch.rand(3, device="cuda") * 0 + 1)  # and captures work again
    graph.replay()
    assert torch.equal(out, torch.ones(3, device="cuda"))


def test_a_refused_capture_decodes_eagerly(monkeypatch):
    """graphed=None: a decode step the GPU refuses to capture (simulated on the CPU) falls back to
    the eager loop with a warning, and is not captured again; graphed=True names the refusal."""
    import laquant.generate as gen

    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=512)).eval()
    ids = torch.randint(0, 512, (2, 5))
    want = generate(model, ids, 6, graphed=False)
    tries = []

    class Refused:
        def __init__(self, *args):
            tries.append(1)
            raise gen._CaptureRefused("the GPU refused to capture this model's decode step (RuntimeError: x)")

    monkeypatch.setattr(gen, "is_graphable", lambda model: True)
    monkeypatch.setattr(gen, "_DecodeGraph", Refused)
    with pytest.warns(UserWarning, match="refused to capture"):
        assert torch.equal(generate(model, ids, 6), want)
    assert torch.equal(generate(model, ids, 6), want) and len(tries) == 1  # remembered, not captured again
    with pytest.raises(LaquantError, match="refused to capture"):
        generate(model, ids, 6, graphed=True)


@pytest.mark.parametrize("arch", ["gla", "gated_deltanet"])
@torch.no_grad()
def test_static_copy_carries_the_short_convs(arch):
    """laquant's models with short convs (fla's Gated DeltaNet has them by default) decode on a static
    copy too: its conv inputs are copies, updated in place by the steps, and the steps give the
    ordinary cache's logits; load_from refills them."""
    from laquant.generate import graphable_cache, static_cache, static_forward
    from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    torch.manual_seed(0)
    if arch == "gla":
        model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=512,
                                         use_short_conv=True)).eval()
    else:
        model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(hidden_size=64, num_hidden_layers=2, num_heads=2,
                                                             head_dim=16, vocab_size=512)).eval()
    ids, steps = torch.randint(0, 512, (2, 9)), torch.randint(0, 512, (2, 5))
    ordinary = model.new_cache()
    model(input_ids=ids, past_key_values=ordinary, use_cache=True)
    assert ordinary.conv and graphable_cache(ordinary)
    static = static_cache(ordinary, 0)
    assert static.static and all(static.conv[k] is not ordinary.conv[k] for k in ordinary.conv)
    ptrs = {k: t.data_ptr() for k, t in static.conv.items()}
    other = model.new_cache()
    model(input_ids=torch.randint(0, 512, (2, 9)), past_key_values=other, use_cache=True)
    static.load_from(other)  # refilled in place, then back
    assert all(torch.equal(static.conv[k], other.conv[k]) for k in other.conv)
    static.load_from(ordinary)
    assert {k: t.data_ptr() for k, t in static.conv.items()} == ptrs
    for t in range(steps.shape[1]):
        want = model(input_ids=steps[:, t:t + 1], past_key_values=ordinary, use_cache=True).logits[:, -1]
        torch.testing.assert_close(static_forward(model, steps[:, t:t + 1], static), want, atol=1e-5, rtol=1e-5)
    assert {k: t.data_ptr() for k, t in static.conv.items()} == ptrs  # the steps wrote into them
    assert all(torch.equal(static.conv[k], ordinary.conv[k]) for k in ordinary.conv)


@torch.no_grad()
def test_static_copy_carries_the_attn_layers_keys():
    """laquant's models with fla's softmax ``attn`` layers (GQA and a window at the first layer, plain at the last)
    decode on a static copy: the keys and values in buffers of ``capacity`` positions written at a device-side
    position, the steps giving the ordinary cache's logits; load_from refills the buffers and the position; the
    recurrent layers' device counter counts the steps (the last layer keeps keys, not a state); too small a
    capacity, a multi-token call and another attn layout are refused. (A speculative round, whose verify takes
    several tokens, is not captured on such a cache: graphable_cache.)"""
    from laquant.generate import graphable_cache, static_cache, static_forward

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=4, num_heads=2, vocab_size=512, attn=[
        {"layers": [0], "num_heads": 4, "num_kv_heads": 2, "window_size": 6}, {"layers": [3], "num_heads": 2}])).eval()
    ids, steps = torch.randint(0, 512, (2, 9)), torch.randint(0, 512, (2, 8))

    def prefilled(prompt):
        cache = model.new_cache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        return cache

    ordinary = prefilled(ids)
    assert not graphable_cache(ordinary)
    with pytest.raises(ValueError, match="cannot continue 9"):
        static_cache(ordinary, 9)
    static = static_cache(prefilled(ids), 32)
    assert static.capacity == 32 and int(static.kv_pos) == 9 and sorted(static.static_kv) == [0, 3]
    assert static.states[0] is None and static.states[3] is None and static.slots.last_layer == 2
    ptrs = {i: kv[0].data_ptr() for i, kv in static.static_kv.items()}
    other = prefilled(torch.randint(0, 512, (2, 5)))
    static.load_from(other)  # refilled in place, then back
    assert int(static.kv_pos) == 5 and torch.equal(static.static_kv[3][0][:, :, :5], other.kv[3][0].transpose(1, 2))
    static.load_from(prefilled(ids))
    for t in range(steps.shape[1]):
        want = model(input_ids=steps[:, t:t + 1], past_key_values=ordinary, use_cache=True).logits[:, -1]
        torch.testing.assert_close(static_forward(model, steps[:, t:t + 1], static), want, atol=1e-5, rtol=1e-5)
    assert int(static.kv_pos) == 17 and {i: kv[0].data_ptr() for i, kv in static.static_kv.items()} == ptrs
    torch.testing.assert_close(static.static_kv[0][0][:, :, :17], ordinary.kv[0][0].transpose(1, 2))
    assert static.sync_counters() == 8 and static.seen_tokens == 17
    with pytest.raises(ValueError, match="one token a step"):
        model(input_ids=steps[:, :2], past_key_values=static, use_cache=True)
    plain = GLAForCausalLM(GLAConfig(hidden_size=64, num_hidden_layers=4, num_heads=2, vocab_size=512)).eval()
    unkeyed = plain.new_cache()
    plain(input_ids=ids, past_key_values=unkeyed, use_cache=True)
    with pytest.raises(ValueError, match="layout|attn layers"):
        static.load_from(unkeyed)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["gla", "gated_deltanet"])
@torch.no_grad()
def test_gpu_graphed_loop_with_short_convs(arch):
    """Short convs on a static cache: the captured loop's greedy tokens are the eager loop's (bf16 on
    the kernels; fla's Gated DeltaNet has short convs by default)."""
    from laquant.generate import _DecodeGraph
    from laquant.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        if arch == "gla":
            model = _gpu_model(use_short_conv=True)
        else:
            model = GatedDeltaNetForCausalLM(GatedDeltaNetConfig(hidden_size=256, num_hidden_layers=3, num_heads=2,
                                                                 head_dim=64, vocab_size=4096))
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(1, 4096, (3, 17), device="cuda")
    assert torch.equal(generate(model, ids, 30), generate(model, ids, 30, graphed=False))
    assert all(isinstance(g, _DecodeGraph) for g in model.__dict__["_laquant_decode_graphs"].values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_gpu_graphed_loop_with_attn_layers(dtype):
    """fla's softmax attn layers (GQA and a window first, plain last) on a static cache: the captured loop's greedy
    tokens are the eager loop's (in bf16 up to near-ties: the static steps' attention is laquant's decode kernel, the
    eager one fla's; on an H200 a row of the 1,100-token prompt parted at its tenth token), one graph per batch size, a
    longer prompt than the keys' room captured again."""
    from test_speculative import _assert_same_up_to_near_ties

    from laquant.generate import _DecodeGraph

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = _gpu_model(attn=[{"layers": [0], "num_heads": 4, "num_kv_heads": 2, "window_size": 40},
                                 {"layers": [2], "num_heads": 4}])
    model = model.to(dtype).eval()
    for B, T, n in ((3, 17, 30), (3, 1100, 12)):
        ids = torch.randint(1, 4096, (B, T), device="cuda")
        got, want = generate(model, ids, n), generate(model, ids, n, graphed=False)
        if dtype == torch.float32:
            assert torch.equal(got, want), (B, T)
        else:
            _assert_same_up_to_near_ties(model, got, want, T, (B, T))
    graphs = list(model.__dict__["_laquant_decode_graphs"].values())
    assert graphs and all(isinstance(g, _DecodeGraph) for g in graphs)
    assert max(g.cache.capacity for g in graphs) >= 1100 + 12


# ------------------------------------------------------------------------------------ padded prompts
class _StandInGraph:
    """The CPU stand-in of a captured step: a replay runs the step on the static cache."""

    def __init__(self, fn):
        self.replay = fn


def _graphs_on_the_cpu(monkeypatch):
    """laquant.generate's graphed loop on the CPU: no warm-up stream, each replay the captured function run eagerly."""
    import laquant.generate as gen

    monkeypatch.setattr(gen, "is_graphable", lambda model: True)
    monkeypatch.setattr(gen, "warm_up_outside_capture", lambda fn, runs=2: [fn() for _ in range(runs)])
    monkeypatch.setattr(gen, "capture_graph", lambda fn, pool=None: (_StandInGraph(fn), None))


def _padded_model(kind):
    if kind == "gla-conv":
        return _tiny_gla(use_short_conv=True)
    from test_static_hybrid import _installed

    return _installed(kind)


@pytest.mark.parametrize("kind", ["gla-conv", "qwen3_next", "nemotron_h", "minimax", "kimi_linear"])
@torch.no_grad()
def test_padded_prompts_decode_as_each_one_alone(kind, monkeypatch):
    """Prompts of several lengths padded on the left (``attention_mask``): each sequence gets the tokens it gets
    alone, in the eager loop and in the graphed one (its CPU stand-in: the static cache's steps), whose static cache
    masks a hybrid's padded keys and counts each sequence's positions on the device."""
    model = _padded_model(kind)
    torch.manual_seed(2)
    ids = torch.randint(1, 100, (3, 8))
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :1] = 0, 0
    eager = generate(model, ids.masked_fill(mask == 0, 0), 6, attention_mask=mask, graphed=False)
    for row in range(3):
        pad = int((mask[row] == 0).sum())
        alone = generate(model, ids[row:row + 1, pad:], 6, graphed=False)
        assert torch.equal(eager[row, pad:], alone[0])
    _graphs_on_the_cpu(monkeypatch)
    graphed = generate(model, ids.masked_fill(mask == 0, 0), 6, attention_mask=mask, graphed=True)
    assert torch.equal(graphed, eager)
    (graph,) = model.__dict__["_laquant_decode_graphs"].values()
    assert getattr(graph.cache, "padded", False) == (kind != "gla-conv")
    unpadded = generate(model, ids, 6, graphed=True)  # prompts of one length: the unpadded graph
    assert torch.equal(unpadded, generate(model, ids, 6, graphed=False))
    assert len(model.__dict__["_laquant_decode_graphs"]) == (1 if kind == "gla-conv" else 2)


def test_padding_that_generate_cannot_take_is_an_error():
    model = _tiny_gla()
    ids = torch.randint(1, 100, (2, 5))
    right = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    with pytest.raises(LaquantError, match="on the left"):
        generate(model, ids, 3, attention_mask=right)
    with pytest.raises(LaquantError, match="attention_mask must be"):
        generate(model, ids, 3, attention_mask=right[:, :4])
    left = torch.tensor([[0, 0, 1, 1, 1], [1] * 5])
    with pytest.raises(LaquantError, match="one length"):
        generate(model, ids, 3, attention_mask=left, draft_model="ngram")
    with pytest.raises(LaquantError, match="graphed prefill"):
        generate(model, ids, 3, attention_mask=left, graphed_prefill=True)
    assert torch.equal(generate(model, ids, 3, attention_mask=torch.ones_like(ids)), generate(model, ids, 3))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gla-conv", "qwen3_next", "minimax"])
@torch.no_grad()
def test_gpu_graphed_loop_on_padded_prompts(kind):
    """Left-padded prompts on the GPU: the captured loop gives the eager loop's tokens (bf16)."""
    model = _padded_model(kind).to("cuda", torch.bfloat16)
    torch.manual_seed(2)
    ids = torch.randint(1, 100, (3, 8), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :1] = 0, 0
    ids = ids.masked_fill(mask == 0, 0)
    eager = generate(model, ids, 12, attention_mask=mask, graphed=False)
    assert torch.equal(generate(model, ids, 12, attention_mask=mask, graphed=True), eager)
