"""Per-group W8A8 (``act_granularity: per_group``): one activation scale per token and group of 128 input columns.
The reference against a computation written out here, the module's layout, and the Triton kernels (the quantize
pass, the split-K and tiled GEMMs) against the reference, on the CPU under Triton's interpreter and on the GPU."""

import pytest
import torch

from conftest import DEVICE, rel_err
from laquant.kernels import int8_outlier_linear
from laquant.kernels.common.numerics import ACT_GROUP, quantize_int8_groups
from laquant.quant.modules import QuantLinear

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 dot is wrong
TOL = dict(atol=2e-2, rtol=2e-2) if DTYPE == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)


def _linear(K, N, bias=True, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=gen) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=gen))
    return lin.to(dtype)


def _outliers(K, n_out, seed=0):
    return torch.randperm(K, generator=torch.Generator().manual_seed(seed + 7))[:n_out]


def _x(M, K, outliers, dtype=torch.float32, seed=1):
    """Activations whose magnitude differs by column group (what per-group scales are for), outlier columns x30."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen) * torch.logspace(-1, 1, -(-K // ACT_GROUP)).repeat_interleave(ACT_GROUP)[:K]
    x[:, outliers] *= 30
    return x.to(dtype)


def _reference(mod, x, act="per_group"):
    args = (mod.qweight[:, :mod.n_main], mod.weight_scale, mod.keep_idx if mod.n_outliers and not mod.act_group
            else None, mod.outlier_idx, mod.outlier_weight, mod.bias)
    return int8_outlier_linear(x.cpu(), *(t.cpu() if t is not None else None for t in args), act)


def test_group_codes_of_a_short_last_group():
    x = torch.randn(3, 300)
    q, scale = quantize_int8_groups(x)
    assert q.shape == (3, 300) and scale.shape == (3, 3)
    for g, cols in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
        amax = x[:, cols].abs().amax(-1)
        assert torch.equal(scale[:, g], amax / torch.tensor(127.0))
        assert torch.equal(q[:, cols], torch.round(x[:, cols] / scale[:, g:g + 1]).to(torch.int8))


@pytest.mark.parametrize("M,K,N,n_out", [(5, 300, 40, 6), (2, 256, 17, 0)])
def test_reference_is_the_sum_over_groups(M, K, N, n_out):
    """y = sum over groups of (codes . int8 weight) * group scale * column scale, + outlier columns in float, + bias:
    written out element by element in float64 here."""
    outliers = _outliers(K, n_out)
    mod = QuantLinear.from_linear(_linear(K, N), outliers, act_granularity="per_group")
    x = _x(M, K, outliers)
    xz = x.clone()
    xz[:, outliers] = 0
    want = torch.zeros(M, N, dtype=torch.float64)
    w = mod.qweight[:, :K].double()
    for g0 in range(0, K, ACT_GROUP):
        cols = slice(g0, g0 + ACT_GROUP)
        s = (xz[:, cols].abs().amax(-1, keepdim=True) / 127.0).double()
        codes = torch.round(xz[:, cols].double() / s)
        want += (codes @ w[:, cols].T) * s
    want = want * mod.weight_scale.double().view(1, -1)
    want += x[:, outliers].double() @ mod.outlier_weight.double().T + mod.bias.double()
    got = _reference(mod, x)
    assert rel_err(got.double(), want) < 1e-6


def test_module_layout_keeps_every_column():
    """The int8 weight spans every input in order, zero at the outlier columns, with the per-token module's int8
    values elsewhere; both dequantize to the same weight."""
    K, N, outliers = 300, 24, _outliers(300, 5)
    lin = _linear(K, N)
    grouped = QuantLinear.from_linear(lin, outliers, act_granularity="per_group")
    token = QuantLinear.from_linear(lin, outliers)
    assert grouped.n_main == K and grouped.qweight.shape == (N, 304) and token.n_main == K - 5
    assert not grouped.qweight[:, outliers].any()
    assert torch.equal(grouped.qweight[:, token.keep_idx], token.qweight[:, :token.n_main])
    assert torch.equal(grouped.weight_scale, token.weight_scale)
    assert torch.equal(grouped.dequantized_weight(), token.dequantized_weight())
    # a module rebuilt from its decision (a checkpoint's reload) has the same buffers' shapes
    empty = QuantLinear(K, N, 5, True, act_granularity="per_group", dtype=torch.float32)
    empty.load_state_dict(grouped.state_dict())
    x = _x(4, K, outliers)
    assert torch.equal(empty(x), grouped(x))
    with pytest.raises(ValueError, match="act_granularity must be one of"):
        QuantLinear(K, N, 5, True, act_granularity="per_block")


def test_per_group_scales_follow_the_groups_magnitudes():
    """On activations whose groups differ 100x in magnitude, per-group codes are closer to the float product than
    per-token ones (the same int8 weight)."""
    K, N, outliers = 512, 64, _outliers(512, 4)
    lin = _linear(K, N, bias=False)
    x = _x(16, K, outliers)
    exact = x @ QuantLinear.from_linear(lin, outliers).dequantized_weight().T
    err = {act: rel_err(QuantLinear.from_linear(lin, outliers, act_granularity=act)(x), exact)
           for act in ("per_token", "per_group")}
    assert err["per_group"] < 0.7 * err["per_token"]  # ~0.5x here


# --- the kernels: on the CPU under Triton's interpreter (float32), and on the GPU (bf16) ---

SPLITK = [dict(BM=16, BN=32, BK=64, SPLIT_K=1, FIXUP=True, num_warps=4, num_stages=2),
          dict(BM=16, BN=32, BK=64, SPLIT_K=3, FIXUP=True, num_warps=4, num_stages=2),
          dict(BM=32, BN=64, BK=256, SPLIT_K=2, FIXUP=False, num_warps=4, num_stages=2),  # two groups a step
          dict(BM=16, BN=32, BK=512, SPLIT_K=1, FIXUP=True, num_warps=4, num_stages=2),  # four, past an uneven K
          dict(BM=16, BN=64, BK=128, SPLIT_K=2, FIXUP=True, SWAP_AB=True, FUSE_Q=True, num_warps=4,
               num_stages=2)]  # neither applies to per-group codes: the plain path runs


def _kernels():
    from conftest import require_triton_kernels

    require_triton_kernels()
    from laquant.kernels.gemm import int8

    return int8


def _gpu_module(K, N, n_out, bias=True):
    outliers = _outliers(K, n_out)
    return QuantLinear.from_linear(_linear(K, N, bias, dtype=DTYPE), outliers,
                                   act_granularity="per_group").to(DEVICE), outliers


def test_quantize_groups_kernel_gives_the_reference_codes():
    int8 = _kernels()
    mod, outliers = _gpu_module(300, 16, 6)
    x = _x(19, 300, outliers, DTYPE).to(DEVICE)
    xq, xs, xo = int8.quantize_groups(x, mod.packed())
    xz = x.cpu().float().clone()
    xz[:, outliers] = 0
    q_ref, s_ref = quantize_int8_groups(xz)
    assert torch.equal(xq[:, :300].cpu(), q_ref) and not xq[:, 300:].any()  # zero padding up to 304
    assert torch.equal(xs.cpu(), s_ref)
    assert torch.equal(xo[:, :6].cpu(), x[:, mod.outlier_idx].cpu())


@pytest.mark.parametrize("cfg", SPLITK)
@pytest.mark.parametrize("M,K,N,n_out,bias", [(3, 300, 72, 7, True), (17, 256, 40, 0, False)])
def test_splitk_gemm_matches_reference(cfg, M, K, N, n_out, bias):
    int8 = _kernels()
    mod, outliers = _gpu_module(K, N, n_out, bias)
    x = _x(M, K, outliers, DTYPE).to(DEVICE)
    p = mod.packed()
    assert p.group == ACT_GROUP
    y = int8.int8_outlier_linear_triton(x, p, cfg)
    tol = 1e-2 if DTYPE == torch.bfloat16 else 1e-5
    assert y.dtype == x.dtype and rel_err(y.float().cpu(), _reference(mod, x).float()) < tol
    # the weight-only path reads the same layout (the outlier columns' int8 weights are zero)
    y16 = int8.int8_weight_only_linear_triton(x, p, dict(cfg, FUSE_Q=False))
    assert rel_err(y16.float().cpu(), _reference(mod, x, "none").float()) < tol


def test_tiled_gemm_matches_reference():
    """Above 256 tokens the tiled kernel runs (the committed tiles, 128-wide K steps)."""
    int8 = _kernels()
    mod, outliers = _gpu_module(384, 64, 5)
    x = _x(260, 384, outliers, DTYPE).to(DEVICE)
    y = int8.linear_triton(x, mod.packed(), "w8a8")
    tol = 1e-2 if DTYPE == torch.bfloat16 else 1e-5
    assert rel_err(y.float().cpu(), _reference(mod, x).float()) < tol


def test_per_group_packing_refuses_a_packed_out_layout():
    int8 = _kernels()
    mod = QuantLinear.from_linear(_linear(96, 16), _outliers(96, 5))  # per-token: outlier columns packed out
    with pytest.raises(ValueError, match="a per-group weight keeps all 96 input columns in order, not 91"):
        int8.PackedOutlierWeight.pack(mod.qweight, mod.weight_scale, mod.keep_idx, mod.outlier_idx,
                                      mod.outlier_weight, None, 96, group=ACT_GROUP)
    with pytest.raises(ValueError, match="quantize_rows quantizes per token"):
        int8.quantize_groups(torch.zeros(2, 96, device=DEVICE), mod.packed())


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 64, 2048])
def test_module_on_gpu_runs_per_group(M):
    mod, outliers = _gpu_module(2048, 2048, 8, bias=False)
    x = _x(M, 2048, outliers, DTYPE).to(DEVICE)
    assert rel_err(mod(x).float().cpu(), _reference(mod, x).float()) < 1e-2


def test_a_per_group_checkpoint_reloads_bit_exact(tiny_model_dir, tmp_path):
    """``--set projections.act_granularity=per_group`` end to end: calibrate, save, reload by laquant.load and by
    transformers' from_pretrained (same logits, the per-group layout rebuilt from the decisions). (A GLA has no
    compressed-tensors export at all; the export's refusal of per-group scales: test_compressed_tensors_export.)"""
    import laquant
    from laquant.recipe import load_recipe

    torch.manual_seed(5)
    model, tok = laquant.load_model(tiny_model_dir)
    recipe = load_recipe("gla_int8_all", ["projections.act_granularity=per_group"])
    result = laquant.calibrate(model, recipe, torch.randint(0, 8192, (2, 96)), progress=False)
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, QuantLinear) and down.act_granularity == "per_group" and down.n_main == down.in_features
    ids = torch.randint(0, 8192, (2, 30))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    laquant.save(result, tmp_path / "ckpt", tokenizer=tok)
    reloaded, _ = laquant.load(tmp_path / "ckpt")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits)
        assert torch.equal(hf(input_ids=ids).logits, logits)


def test_group_tiles_come_from_the_sweep_else_its_pattern(monkeypatch):
    from laquant.kernels.gemm import configs

    swept = configs.group_config(64, 2048, 5632, "NVIDIA H200")
    assert swept == configs.GROUP_TABLES["NVIDIA H200"]["64@2048x5632"]
    monkeypatch.setattr(configs, "GROUP_TABLES", {})  # no table: the rule
    for M in (1, 16, 64):
        for N, K in ((6144, 2048), (2048, 2048), (11264, 2048), (2048, 5632), (22016, 4096)):
            c = configs.group_config(M, N, K)
            assert c["BK"] % ACT_GROUP == 0 and c["BM"] >= min(M, 16) and c["SPLIT_K"] in (1, 4)
    tiled = configs.group_config(257, 2048, 2048)  # prefill sizes: the tiled kernel, 8 warps (4 spill)
    assert "GROUP_M" in tiled and tiled["num_warps"] == 8 and tiled["BM"] * tiled["BN"] == 128 * 128


def test_linear_triton_runs_a_group_weight_per_group(monkeypatch):
    int8 = _kernels()
    mod, outliers = _gpu_module(300, 40, 4)
    x = _x(5, 300, outliers, DTYPE).to(DEVICE)
    seen = []
    real = int8.int8_outlier_linear_triton
    monkeypatch.setattr(int8, "int8_outlier_linear_triton", lambda x, p, c: seen.append(c) or real(x, p, c))
    tol = 1e-2 if DTYPE == torch.bfloat16 else 1e-5
    for mode in ("auto", "w8a8"):
        assert rel_err(int8.linear_triton(x, mod.packed(), mode).float().cpu(), _reference(mod, x).float()) < tol
    from laquant.kernels.gemm.configs import group_config

    assert seen == [group_config(5, 40, 300)] * 2  # the per-group tiles, whatever the mode asked
    with pytest.raises(ValueError, match="mode must be"):
        int8.linear_triton(x, mod.packed(), "int4")


def test_swept_group_tiles_apply_to_configs_and_are_taken(tmp_path, monkeypatch):
    """tools/sweep_group_gemm.py --apply writes its table into configs.py's GROUP_TABLES (the other GPUs' entries
    stay), and group_config takes the nearest swept shape's tiles at M's bucket, the rule elsewhere."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from laquant.kernels.gemm import configs

    root = Path(__file__).resolve().parents[1]
    target = tmp_path / "configs.py"
    shutil.copy(root / "kernels" / "gemm" / "configs.py", target)
    tiles = dict(BM=64, BN=32, BK=512, SPLIT_K=1, FIXUP=True, num_warps=2, num_stages=4)
    prefill = dict(BM=128, BN=256, BK=128, GROUP_M=8, num_warps=8, num_stages=3)
    for name, entries in (("GPU A", {"64@2048x2048": tiles}), ("GPU B", {"64@2048x2048": tiles}),
                          ("GPU B", {"prefill@2048x2048": prefill})):  # a later sweep of the prefill tiles alone
        (tmp_path / "t.py").write_text(f"GROUP_TABLES: dict = {{{name!r}: {entries!r}}}\n")
        subprocess.run([sys.executable, str(root / "tools" / "sweep_group_gemm.py"), "--apply", str(tmp_path / "t.py"),
                        "--configs", str(target)], check=True)
    ns, src = {}, target.read_text()
    block = src[src.index("GROUP_TABLES: dict = {"):src.index("# --- generated by tools/sweep_group_gemm.py: end")]
    exec(block, ns)  # the block the tool wrote (the module's relative imports need its package)
    assert {"GPU A", "GPU B"} <= set(ns["GROUP_TABLES"])  # besides the committed GPUs' tables
    monkeypatch.setattr(configs, "GROUP_TABLES", ns["GROUP_TABLES"])
    assert configs.group_config(64, 2100, 2000, "GPU B") == tiles  # the nearest swept shape
    assert configs.group_config(40, 2048, 2048, "GPU B") == dict(tiles, BM=64)
    rule = configs.group_config(1, 2048, 2048, "GPU B")  # no entry at that bucket: the rule
    assert rule["BK"] == 256 and rule["SPLIT_K"] == 1 and rule != tiles
    assert configs.group_config(4096, 2048, 5632, "GPU B") == prefill  # the tiled kernel's swept tiles
    assert configs.group_config(4096, 2048, 5632, "GPU C") != prefill  # another GPU's: not its to fit
    assert configs.group_config(4096, 2048, 5632, "GPU A") == dict(configs.tiled_config(4096), num_warps=8)


# --- the producers: the norm and SwiGLU write per-group codes in their epilogue (interpreter / GPU) ---

@pytest.mark.parametrize("M,K,n_out,flags", [(3, 300, 5, False), (2, 256, 0, True), (70, 384, 3, False),
                                             (2, 1300, 6, True)])
def test_norm_and_swiglu_write_the_quantize_pass_codes(M, K, n_out, flags):
    """A norm's and SwiGLU's outputs equal the reference's, and their per-group codes equal quantize_groups' of them,
    bit for bit (codes, scales, the outlier block's real slots; its padding zeros); the GEMM on them equals the GEMM
    on its own pass. Inputs as a model hands them: x a slice of a wider tensor, the residual of another stride, gate
    and up the halves of one projection's output; ``flags``: round_sum and round_normed. 1,300 columns: SwiGLU
    spreads a token over two programs (GLU_GROUP_BLOCK), the last group short."""
    int8 = _kernels()
    from laquant.kernels.rowwise import reference
    from laquant.kernels.rowwise.fused import rms_norm_triton, swiglu_triton

    mod, outliers = _gpu_module(K, 40, n_out)
    p = mod.packed()
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(M, 3 * K, generator=gen) * 3).to(DEVICE, DTYPE)[:, K:2 * K]
    res = torch.randn(M, 2 * K, generator=gen).to(DEVICE, DTYPE)[:, :K]
    w = (torch.rand(K, generator=gen) + 0.5).to(DEVICE)
    out, summed, codes = rms_norm_triton(x, w, 1e-6, res, packed=p, round_sum=flags, round_normed=flags)
    ref, ref_sum = reference.rms_norm(x, w, 1e-6, res, round_sum=flags, round_normed=flags)
    torch.testing.assert_close(out, ref, **TOL)  # the per-group kernel holds the row a group a row
    torch.testing.assert_close(summed, ref_sum, **TOL)
    gate, up = (torch.randn(M, 2 * K, generator=gen) * 2).to(DEVICE, DTYPE).split(K, dim=-1)
    h, glu_codes = swiglu_triton(gate, up, p)
    torch.testing.assert_close(h, reference.swiglu(gate, up), **TOL)
    for y, (xq, xs, xo) in ((out, codes), (h, glu_codes)):
        rq, rs, ro = int8.quantize_groups(y, p)
        assert torch.equal(xq, rq) and torch.equal(xs, rs)
        assert torch.equal(xo[:, :n_out], ro[:, :n_out]) and not xo[:, n_out:p.outlier_idx.numel()].any()
        y_codes = torch.empty(M, 40, dtype=y.dtype, device=DEVICE)
        int8.int8_gemm(xq, xs, xo, p, y_codes, int8.group_config(M, 40, K))
        assert torch.equal(y_codes, int8.int8_outlier_linear_triton(y, p, int8.group_config(M, 40, K)))


@pytest.mark.parametrize("heads,D,n_out", [(2, 128, 3), (3, 128, 0), (2, 256, 4)])
def test_gated_norm_of_several_rows_a_token_writes_the_quantize_pass_codes(heads, D, n_out):
    """A gated norm of ``heads`` rows a token (a mixer's output norm), rows a power of two and whole groups wide:
    its per-group codes equal quantize_groups' of its output (3 heads: a tile of 4 rows, one masked)."""
    int8 = _kernels()
    from laquant.kernels.rowwise.fused import gated_rms_norm_triton

    mod, _ = _gpu_module(heads * D, 24, n_out)
    p = mod.packed()
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(7, heads, D, generator=gen) * 2).to(DEVICE, DTYPE)
    z = torch.randn(7, heads, D, generator=gen).to(DEVICE, DTYPE)
    out, (xq, xs, xo) = gated_rms_norm_triton(x, z, torch.rand(D, generator=gen).to(DEVICE) + 0.5, 1e-6, packed=p)
    rq, rs, ro = int8.quantize_groups(out.reshape(7, heads * D), p)
    assert torch.equal(xq, rq) and torch.equal(xs, rs)
    assert torch.equal(xo[:, :n_out], ro[:, :n_out]) and not xo[:, n_out:p.outlier_idx.numel()].any()


def test_per_group_producers_need_whole_groups():
    _kernels()
    from laquant.kernels.rowwise.fused import codes_fit, gated_rms_norm_triton, group_rows_fit

    narrow, _ = _gpu_module(96, 16, 2)
    assert not codes_fit(narrow.packed())  # narrower than a group: its GEMM quantizes its input itself
    assert group_rows_fit(128, ACT_GROUP) and group_rows_fit(512, ACT_GROUP)
    assert not group_rows_fit(96, ACT_GROUP) and not group_rows_fit(384, ACT_GROUP)  # 384: not a power of two
    mod, _ = _gpu_module(192, 16, 2)
    x = torch.randn(2, 2, 96, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="need rows of a power of two wide and a multiple of the group"):
        gated_rms_norm_triton(x, x, torch.ones(96, device=DEVICE), 1e-6, packed=mod.packed())


# the granularity overrides of gla_int8_all the GLA tests take: per group everywhere, or per token but for the
# projections that close a block (o_proj, down_proj), whose codes the decode kernel and SwiGLU write per group
GRANULARITIES = {"per_group": ["projections.act_granularity=per_group"],
                 "per_group_outputs": ["projections.output_act_granularity=per_group"]}


def _per_group_gla(vocab: int, calib_len: int, granularity: str = "per_group"):
    """A random GLA (hidden 256, two heads of V = 128) calibrated on the CPU with gla_int8_all and the
    ``GRANULARITIES`` overrides named, three outlier columns in every projection: the codes' outlier paths run too."""
    import laquant
    from laquant.models import GLAConfig, GLAForCausalLM
    from laquant.recipe import load_recipe

    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(hidden_size=256, num_hidden_layers=2, num_heads=2, vocab_size=vocab)).eval()
    laquant.calibrate(model, load_recipe("gla_int8_all", [*GRANULARITIES[granularity], "projections.outlier_top_k=3"]),
                      torch.randint(0, vocab, (2, calib_len)), progress=False)
    return model


def _quantize_passes(monkeypatch) -> list:
    """The shapes of the inputs the GEMMs quantize in a pass of their own from now on, per group or per token (the
    pass still runs)."""
    from laquant.kernels.gemm import int8

    passes = []
    for name in ("quantize_groups", "quantize_rows"):
        real = getattr(int8, name)
        monkeypatch.setattr(int8, name,
                            lambda x, *a, real=real, **kw: passes.append(tuple(x.shape)) or real(x, *a, **kw))
    return passes


def _interpreted_gla_kernels(monkeypatch) -> None:
    """The GLA model's Triton path on the CPU, run by Triton's interpreter (skipped elsewhere)."""
    from conftest import INTERPRETED, require_triton_kernels

    if not INTERPRETED:
        pytest.skip("checks the wiring under TRITON_INTERPRET=1")
    require_triton_kernels()
    from laquant.models import gla, recurrent
    from laquant.quant import fused, modules

    for module in (gla, recurrent, fused, modules):
        monkeypatch.setattr(module, "use_triton", lambda x, fmt=None: not x.requires_grad)


@torch.no_grad()
def test_output_act_granularity_applies_to_the_projections_that_close_a_block(tiny_model_dir, tmp_path):
    """``projections.output_act_granularity=per_group``: o_proj and down_proj per group, every other projection per
    token; the checkpoint reloads bit-exactly by laquant.load and by from_pretrained; a value it does not know is
    refused naming the allowed ones. (The compressed-tensors export's refusal: test_compressed_tensors_export.)"""
    import laquant
    from laquant.errors import LaquantError
    from laquant.families import OUTPUT_PROJECTIONS
    from laquant.recipe import load_recipe

    torch.manual_seed(5)
    model, tok = laquant.load_model(tiny_model_dir)
    result = laquant.calibrate(model, load_recipe("gla_int8_all", GRANULARITIES["per_group_outputs"]),
                               torch.randint(0, 8192, (2, 96)), progress=False)
    granularity = {n: m.act_granularity for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    outputs = {n for n in granularity if n.rpartition(".")[2] in OUTPUT_PROJECTIONS}
    assert {n.rpartition(".")[2] for n in outputs} == {"o_proj", "down_proj"}
    assert {granularity[n] for n in outputs} == {"per_group"}
    gate = {n for n, g in granularity.items() if g == "none"}  # the low-rank gate's weight-only linears
    assert gate and all(".gk_proj." in n for n in gate)
    assert {g for n, g in granularity.items() if n not in outputs | gate} == {"per_token"}
    ids = torch.randint(0, 8192, (2, 30))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    laquant.save(result, tmp_path / "ckpt", tokenizer=tok)
    from transformers import AutoModelForCausalLM

    reloaded = laquant.load(tmp_path / "ckpt")[0]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    assert {n: m.act_granularity for n, m in reloaded.named_modules() if isinstance(m, QuantLinear)} == granularity
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, logits)
        assert torch.equal(hf(input_ids=ids).logits, logits)
    with pytest.raises(LaquantError, match="output_act_granularity.*allowed: None, per_token, per_tensor, per_group"):
        load_recipe("gla_int8_all", ["projections.output_act_granularity=per_head"])


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_gla_per_group_model_path_takes_its_codes_from_the_producers(monkeypatch, granularity):
    """The GPU wiring on the CPU under Triton's interpreter (float32): a GLA calibrated with gla_int8_all per group (or
    per group on o_proj and down only, ``GRANULARITIES``) runs its q/k/v/g and gate/up GEMMs on codes its norms write,
    down's on codes SwiGLU writes and o_proj's on codes the gated output norm writes (heads of 128 columns): no GEMM
    quantizes its input in a pass of its own. Its logits equal the CPU reference path's to float rounding (the GEMMs sum
    their groups in another order)."""
    from conftest import INTERPRETED

    if not INTERPRETED:
        pytest.skip("checks the wiring under TRITON_INTERPRET=1")
    model = _per_group_gla(vocab=128, calib_len=32, granularity=granularity)
    ids = torch.randint(0, 128, (2, 6))
    reference = model(ids).logits
    passes = _quantize_passes(monkeypatch)
    _interpreted_gla_kernels(monkeypatch)
    logits = model(ids).logits
    assert passes == []
    assert torch.isfinite(logits).all() and rel_err(logits, reference) < 1e-4


@torch.no_grad()
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_gla_per_group_decode_kernel_writes_o_projs_codes(monkeypatch, granularity):
    """Under Triton's interpreter (float32): in decode steps the GLA decode kernel writes o_proj's per-group codes
    (each head's 128 columns a group); logits and states equal those of the steps that run the output norm's own
    kernel (which writes them then). No GEMM of either quantizes its own input."""
    from conftest import INTERPRETED

    if not INTERPRETED:
        pytest.skip("checks the wiring under TRITON_INTERPRET=1")
    from laquant.kernels.gla import decode
    from laquant.models import recurrent

    model = _per_group_gla(vocab=128, calib_len=32, granularity=granularity)
    assert model.model.layers[0].attn.o_proj.n_outliers == 3
    passes = _quantize_passes(monkeypatch)
    monkeypatch.setattr(recurrent, "FUSED_CODES_MIN_BATCH", 2)
    kernel_codes = []
    step = decode.gla_decode_step
    monkeypatch.setattr(decode, "gla_decode_step",
                        lambda *a, **kw: kernel_codes.append(kw.get("packed") is not None) or step(*a, **kw))
    _interpreted_gla_kernels(monkeypatch)
    ids = torch.randint(0, 128, (2, 5))

    def decode_two(fused_norm: bool):
        monkeypatch.setattr(recurrent, "FUSED_OUTPUT_NORM", fused_norm)
        cache = model.new_cache(seed=3)
        model(ids, past_key_values=cache, use_cache=True)
        passes.clear()
        logits = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(2)]
        return torch.cat(logits, 1), cache, list(passes)

    unfused, unfused_cache, unfused_passes = decode_two(False)
    assert kernel_codes == [False] * 4  # 2 layers x 2 steps
    kernel_codes.clear()
    logits, cache, fused_passes = decode_two(True)
    assert kernel_codes == [True] * 4 and unfused_passes == fused_passes == []
    assert torch.equal(logits, unfused)
    for a, b in zip(cache.states, unfused_cache.states):
        assert torch.equal(a.data, b.data)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_gpu_gla_per_group_steps_take_produced_codes(monkeypatch, granularity):
    """On CUDA (bf16): a per-group GLA's decode steps (either of ``GRANULARITIES``) run no quantize pass (norms, SwiGLU
    and the decode kernel write the codes), match the steps whose output norm runs in its own kernel (the same state;
    logits within the bf16 rounding of the norm's sum, which the decode kernel may group differently), and stay near the
    float32 CPU reference's logits."""
    from laquant.models import recurrent

    model = _per_group_gla(vocab=512, calib_len=64, granularity=granularity)
    ids = torch.randint(0, 512, (3, 9))
    reference = model(ids).logits  # the CPU reference path, float32
    model = model.cuda().to(torch.bfloat16)
    monkeypatch.setattr(recurrent, "FUSED_CODES_MIN_BATCH", 1)
    passes = _quantize_passes(monkeypatch)

    def decode_steps(fused_norm: bool):
        monkeypatch.setattr(recurrent, "FUSED_OUTPUT_NORM", fused_norm)
        cache = model.new_cache(seed=3)
        first = model(ids[:, :5].cuda(), past_key_values=cache, use_cache=True).logits
        logits = [model(ids[:, i:i + 1].cuda(), past_key_values=cache, use_cache=True).logits for i in range(5, 9)]
        return torch.cat([first] + logits, 1).float(), cache

    unfused, unfused_cache = decode_steps(False)
    logits, cache = decode_steps(True)
    assert passes == []
    assert torch.isfinite(logits).all() and rel_err(logits, unfused) < 2e-2
    for a, b in zip(cache.states, unfused_cache.states):
        assert (a.data.float() - b.data.float()).abs().max() <= 1
    assert rel_err(logits.cpu()[:, :5], reference[:, :5]) < 5e-2  # the prefill's logits: bf16 against float32
