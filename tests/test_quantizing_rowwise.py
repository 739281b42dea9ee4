"""laquant.models.quantizing_rowwise: transformers' norms that write the int8 codes of the W8A8 projections
after them (handed over with their output, laquant.quant.fused.CodesHandoff), the MLPs whose SwiGLU writes
down_proj's, and the gated norm that writes out_proj's codes in qwen3_next's mixer."""

import copy
import os

import pytest
import torch
from conftest import INTERPRETED, rel_err
from test_hybrid import VOCAB, _model

from laquant.adapters import install
from laquant.models import quantizing_rowwise
from laquant.models.quantizing_rowwise import GATED_NORMS, MAMBA_GATED_NORMS, mamba_norm_group
from laquant.recipe import load_recipe


def _norms(model):
    return [m for name, m in model.named_modules() if name.endswith(("input_layernorm", "post_attention_layernorm"))]


@torch.no_grad()
def test_install_points_each_norm_at_the_projections_after_it():
    model = _model("qwen3_next").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, VOCAB, (2, 9))
    install(model)
    norms = _norms(model)
    assert norms and all(isinstance(n, quantizing_rowwise._QuantizingNorm) for n in norms)
    assert type(norms[0]).__name__ == "Qwen3NextRMSNorm"  # the class keeps its name (repr, hub kernels)
    layers = model.model.layers
    for layer in layers:
        owner, names = layer.input_layernorm.__dict__["_laquant_consumers"][0]
        want = ("in_proj_qkvz",) if hasattr(layer, "linear_attn") else ("q_proj", "k_proj", "v_proj")
        assert names == want and owner is (layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn)
        owner, names = layer.post_attention_layernorm.__dict__["_laquant_consumers"][0]
        assert names == ("gate_proj", "up_proj") and owner in (layer.mlp, getattr(layer.mlp, "shared_expert", None))
    mlps = [m for m in model.modules() if isinstance(m, quantizing_rowwise._QuantizingSwiGLU)]
    assert len(mlps) == len(layers)  # the dense MLPs and the MoE layers' shared experts
    assert all(type(m).__name__ == "Qwen3NextMLP" for m in mlps)
    assert sorted(model.state_dict()) == sorted(before)  # parameters keep their names
    assert quantizing_rowwise.install(layers) == len(norms) + len(mlps)  # idempotent: no second mixin
    assert type(norms[0]).__mro__[2] is norms[0]._laquant_base
    # on the CPU (and wherever the projections are not W8A8 on the GPU) the forward is transformers' own
    x = torch.randn(3, 5, 64)
    base = norms[0]._laquant_base
    assert torch.equal(norms[0](x), base.forward(norms[0], x))
    assert torch.equal(mlps[0](x), mlps[0]._laquant_base.forward(mlps[0], x))
    twin = copy.deepcopy(model)  # a copy's norms point at the copy's projections
    assert twin.model.layers[0].input_layernorm.__dict__["_laquant_consumers"][0][0] is twin.model.layers[0].linear_attn


def test_zamba2_norms_inside_its_hybrid_layers():
    """Zamba2's hybrid layers hold the shared attention block and a Mamba layer (NESTED_LAYERS): every norm there and
    in the Mamba layers points at the projections after it (the Mamba in_proj, the shared block's q/k/v and its
    fused gate/up), a block shared by two layers once."""
    model = _model("zamba2")
    install(model)
    layers = model.model.layers
    blocks = [m for layer in layers for m in (layer, getattr(layer, "mamba_decoder", None),
                                               getattr(layer, "shared_transformer", None)) if m is not None]
    consumers = {}
    for block in blocks:
        for name in ("input_layernorm", "pre_ff_layernorm"):
            norm = getattr(block, name, None)
            if norm is not None:
                assert isinstance(norm, quantizing_rowwise._QuantizingNorm), (type(block).__name__, name)
                (owner, names), = norm.__dict__["_laquant_consumers"]
                consumers[type(block).__name__, name] = names
    assert consumers == {("Zamba2MambaDecoderLayer", "input_layernorm"): ("in_proj",),
                         ("Zamba2AttentionDecoderLayer", "input_layernorm"): quantizing_rowwise._QKV,
                         ("Zamba2AttentionDecoderLayer", "pre_ff_layernorm"): ("gate_up_proj",)}
    assert len(quantizing_rowwise._with_nested(layers)) == len({id(b) for b in blocks})


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_vl", "nemotron_h", "mamba2", "zamba2", "kimi_linear",
                                    "minimax", "granitemoehybrid"])
@torch.no_grad()
def test_the_last_norm_is_one_launch(family, monkeypatch):
    """Every family's last norm (before the lm_head) gets the one-launch forward: transformers' own on the CPU, and
    where the kernel runs (interpreted here) transformers' output to float32 rounding, in one launch."""
    from laquant.adapters import get_adapter
    from laquant.adapters.hybrid import _resolve
    from laquant.kernels.rowwise import fused as rowwise

    try:
        model = _model(family)
    except (AttributeError, ImportError, KeyError):
        pytest.skip(f"this transformers has no {family}")
    install(model)
    text = _resolve(model, get_adapter(model).prefix)
    norm = next(getattr(text, n) for n in quantizing_rowwise.FINAL_NORMS if hasattr(text, n))
    assert isinstance(norm, quantizing_rowwise._FusedFinalNorm) and type(norm).__name__ == norm._laquant_base.__name__
    assert quantizing_rowwise.install_final_norm(text) == 1 and type(norm).__mro__[2] is norm._laquant_base
    with torch.no_grad():
        norm.weight.normal_(0.0, 0.5)
    x = torch.randn(2, 5, norm.weight.shape[0]) * 3
    want = norm._laquant_base.forward(norm, x)
    assert torch.equal(norm(x), want)
    if not INTERPRETED or os.environ.get("TRITON_INTERPRET") != "1":
        return
    calls = []
    real = rowwise.rms_norm_triton
    monkeypatch.setattr(rowwise, "rms_norm_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(quantizing_rowwise, "use_triton", lambda x, state_format=None: True)
    got = norm(x)
    assert calls == [1] and got.dtype == want.dtype and rel_err(got, want) < 1e-6
    logits = model(torch.randint(0, VOCAB, (2, 6))).logits  # the whole model through it
    assert calls == [1, 1] and torch.isfinite(logits).all()


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h", "zamba2", "granitemoehybrid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_gpu_the_last_norm_matches_transformers(family, dtype, monkeypatch):
    """On the GPU the last norm's one launch gives transformers' output: float32 to its rounding, bf16 within one
    rounding (only the mean's summation order differs), on an odd number of tokens."""
    from laquant.adapters import get_adapter
    from laquant.adapters.hybrid import _resolve
    from laquant.kernels.rowwise import fused as rowwise

    try:
        model = _model(family)
    except (AttributeError, ImportError, KeyError):
        pytest.skip(f"this transformers has no {family}")
    install(model)
    model = model.to("cuda", dtype)
    text = _resolve(model, get_adapter(model).prefix)
    norm = next(getattr(text, n) for n in quantizing_rowwise.FINAL_NORMS if hasattr(text, n))
    norm.weight.normal_(0.0, 0.5)
    x = (torch.randn(3, 37, norm.weight.shape[0], device="cuda") * 3).to(dtype)
    calls = []
    real = rowwise.rms_norm_triton
    monkeypatch.setattr(rowwise, "rms_norm_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    got, want = norm(x), norm._laquant_base.forward(norm, x)
    assert calls == [1] and got.dtype == want.dtype and torch.isfinite(got).all()
    assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 8e-3)


def test_other_families_keep_their_norms():
    model = _model("mamba2")
    for block in model.backbone.layers:  # a norm class the tables do not hold keeps transformers' forward
        block.norm.__class__ = type("SomeOtherRMSNorm", (type(block.norm),), {})
    install(model)
    assert not any(isinstance(m, (quantizing_rowwise._QuantizingNorm, quantizing_rowwise._QuantizingSwiGLU))
                   for m in model.modules())


@torch.no_grad()
def test_table_formulas_equal_transformers_norms():
    """Each norm class in NORM_WEIGHTS computes what the fused kernel's reference does with the table's weight and
    rounding, bit for bit on the CPU, in float32 and bfloat16 (the kernels' own tests cover kernel = reference)."""
    from laquant.kernels.rowwise.reference import rms_norm
    from laquant.models.quantizing_rowwise import NORM_WEIGHTS

    seen = {}
    for family in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "kimi_linear", "bailing_hybrid", "minimax", "bamba",
                   "granitemoehybrid", "falcon_h1", "nemotron_h", "olmo_hybrid", "mamba2", "zamba2"):
        for module in _model(family).modules():
            if type(module).__name__ in NORM_WEIGHTS and type(module).__name__ not in seen:
                seen[type(module).__name__] = module
    assert sorted(seen) == sorted(NORM_WEIGHTS)  # every row is checked
    for name, norm in seen.items():
        weight_of, eps_name, round_normed = NORM_WEIGHTS[name]
        with torch.no_grad():
            norm.weight.normal_(0.0, 0.5)
        for dtype in (torch.float32, torch.bfloat16):
            norm = norm.to(dtype)
            x = (torch.randn(4, 7, norm.weight.shape[0]) * 3).to(dtype)
            ref = rms_norm(x, weight_of(norm), getattr(norm, eps_name), round_normed=round_normed)[0]
            assert torch.equal(norm(x), ref), (name, dtype)


@torch.no_grad()
def test_mamba_gated_norm_table_formulas_equal_transformers_norms():
    """Each gated norm class in MAMBA_GATED_NORMS computes what the fused kernel's reference does with the table's
    gate order and rounding and the groups norm_and_out reads off the module, bit for bit on the CPU, in float32
    and bfloat16; Falcon-H1's with the gate after the norm (its default) and before it."""
    from test_hybrid import falcon_h1

    from laquant.kernels.rowwise.reference import gated_rms_norm

    import importlib

    seen = {}
    families = ("bamba", "granitemoehybrid", "nemotron_h", "mamba2", "zamba2", "falcon_h1")
    models = [_model(f) for f in families]
    models.append(falcon_h1(mamba_norm_before_gate=False))
    for model in models:
        for module in model.modules():
            name = type(module).__name__
            if name in MAMBA_GATED_NORMS:
                seen.setdefault((name, getattr(module, "norm_before_gate", None)), module)
    unseen = set(MAMBA_GATED_NORMS) - {name for name, _ in seen}
    defined = {n for f in families for n in dir(importlib.import_module(f"transformers.models.{f}.modeling_{f}"))}
    assert not unseen & defined, unseen  # every row this transformers has is checked (5.17's Nemotron-H: Zamba2's)
    assert {False, True} <= {before for name, before in seen if name == "FalconH1RMSNormGated"}
    for (name, _), norm in seen.items():
        formula = MAMBA_GATED_NORMS[name]
        norm.weight.normal_(1.0, 0.5)
        width = norm.weight.shape[0]
        group = mamba_norm_group(norm, width)
        # Falcon-H1's weight may be in another dtype than x (it is upcast either way; Mamba2's must match)
        weight_dtypes = (None, torch.float32) if not formula.round_normed else (None,)
        for dtype, weight_dtype in ((d, w) for d in (torch.float32, torch.bfloat16) for w in weight_dtypes):
            norm = norm.to(weight_dtype or dtype)
            x, z = ((torch.randn(2, 3, width) * 3).to(dtype) for _ in range(2))
            rows = (6, width // group, group)
            ref = gated_rms_norm(x.reshape(rows), z.reshape(rows), norm.weight.view(rows[1:]),
                                 getattr(norm, formula.eps_name), gate_first=formula.gate_first(norm),
                                 round_normed=formula.round_normed).reshape(x.shape)
            assert torch.equal(norm(x, z).to(dtype), ref), (name, dtype, weight_dtype, formula.gate_first(norm))


def test_handed_over_codes_follow_a_view_of_the_same_rows():
    """transformers' MoE blocks flatten the tokens (view(-1, hidden)) before the shared expert: the codes handed
    over with the norm's output serve that view, not a view of other rows, and not after an in-place change."""
    from laquant.quant import fused

    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 3, 8)
    fused.hand_over(x, ("codes",), torch.nn.ModuleDict({"p": lin}), ("p",), "packed")
    assert fused._handoff(x).codes == ("codes",)
    assert fused._handoff(x.view(-1, 8)) is fused._handoff(x)  # the same rows, flattened
    assert fused._handoff(x[:, 1:]) is None  # other rows
    assert fused._handoff(x.transpose(0, 1).reshape(-1, 8)) is None  # a copy in another order
    assert fused._handoff(x.view(2, 24)) is None  # rows of another width
    x.mul_(2)
    assert fused._handoff(x) is None and fused._handoff(x.view(-1, 8)) is None


def test_joined_columns_is_a_view_of_consecutive_slices_else_a_copy():
    """q, k and v split out of one GEMM's output reach the short conv as one view of their columns; slices that are
    not consecutive columns of one tensor (another order, a gap, another tensor, another dtype) are concatenated."""
    from laquant.quant.fused import joined_columns

    y = torch.randn(2, 3, 20)
    q, k, v, rest = y.split([4, 4, 6, 6], dim=-1)
    joined = joined_columns((q, k, v))
    assert joined.data_ptr() == y.data_ptr() and joined.stride() == y.stride()  # no copy
    assert torch.equal(joined, torch.cat([q, k, v], -1))
    assert torch.equal(joined_columns((k, v, rest)), y[..., 4:])
    for parts in ((k, q, v), (q, v), (q, torch.randn(2, 3, 4), v), (q, k.double(), v)):
        out = joined_columns(parts)
        assert out.data_ptr() != y.data_ptr() and torch.equal(out, torch.cat(parts, -1))
    flat = torch.randn(12)  # one row's worth: not column slices of rows
    assert joined_columns((flat[:4], flat[4:8])).data_ptr() != flat.data_ptr()


# what the codes path covers per family: the norms' groups always; the SwiGLU's down_proj and the gated norm's
# out_proj where the family's classes have them
CODES_PATHS = {"qwen3_next": ("swiglu_codes", "gated_norm_codes"), "qwen3_5": ("swiglu_codes", "gated_norm_codes"),
               "qwen3_next_grouped_heads": ("swiglu_codes", "gated_norm_codes"),
               "qwen3_5_moe": ("swiglu_codes", "gated_norm_codes"), "kimi_linear": ("swiglu_codes", "gated_norm_codes"),
               "bailing_hybrid": ("swiglu_codes", "gated_norm_codes"), "minimax": ("gated_norm_codes",),
               "bamba": ("swiglu_codes", "gated_norm_codes"),
               "granitemoehybrid": ("swiglu_codes", "gated_norm_codes"),
               "falcon_h1": ("swiglu_codes", "gated_norm_codes"),
               "falcon_h1_gate_first": ("swiglu_codes", "gated_norm_codes"),
               "nemotron_h": ("gated_norm_codes",), "olmo_hybrid": ("swiglu_codes", "gated_norm_codes"),
               "bamba_before_groups": ("swiglu_codes", "gated_norm_codes"), "mamba2": ("gated_norm_codes",),
               "zamba2": ("gated_norm_codes",)}
# their gate tail: one kernel (Kimi Delta Attention's forget gate too; Ling / Ring's bounded one is not that formula)
GATED_DELTA_NETS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen3_next_grouped_heads", "kimi_linear")


class _BambaRMSNormGatedBeforeGroups(torch.nn.Module):
    """transformers' ``BambaRMSNormGated`` before the groups (5.17): the whole row normalized, no ``group_size``."""

    def __init__(self, weight, eps):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(weight.detach().clone()), eps

    def forward(self, hidden_states, gate=None):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        if gate is not None:
            hidden_states = hidden_states * torch.nn.functional.silu(gate.to(torch.float32))
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


_BambaRMSNormGatedBeforeGroups.__name__ = "BambaRMSNormGated"


def _codes_model(family):
    """``_model(family)``; ``qwen3_next_grouped_heads``: two key heads of two value heads each, so that the gated norm
    reads z out of in_proj_qkvz's per-key-head layout through two strides; ``bamba_before_groups``: one group, its
    gated norms without ``group_size``, as transformers' classes were before the groups (5.17 on the lent GPU);
    ``falcon_h1_gate_first``: Falcon-H1 with its gated norm's gate before the norm."""
    if family == "bamba_before_groups":
        from test_hybrid import bamba

        torch.manual_seed(3)
        model = bamba(mamba_n_groups=1).float().eval()
        for module in model.modules():
            if type(getattr(module, "norm", None)).__name__ == "BambaRMSNormGated":
                module.norm = _BambaRMSNormGatedBeforeGroups(module.norm.weight, module.norm.variance_epsilon)
        return model
    if family == "falcon_h1_gate_first":  # its gated norm multiplies by silu(z) before normalizing
        from test_hybrid import falcon_h1

        torch.manual_seed(3)
        return falcon_h1(mamba_norm_before_gate=False).float().eval()
    if family == "qwen3_next_grouped_heads":
        from test_hybrid import qwen3_next

        torch.manual_seed(3)
        return qwen3_next(linear_num_key_heads=2, linear_num_value_heads=4).float().eval()
    return _model(family)


def _interpreted_codes_model(family):
    """``_codes_model(family)`` with laquant's mixers installed, for a test of the kernels' wiring under Triton's
    interpreter (skipped elsewhere: the GPU test covers CUDA)."""
    if not INTERPRETED or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("checks the kernels' wiring on the CPU under TRITON_INTERPRET=1 (the GPU test covers CUDA)")
    pytest.importorskip("triton")
    torch.manual_seed(0)
    model = _codes_model(family).eval()
    install(model)
    return model


def _projection_kernels_interpreted(monkeypatch) -> None:
    """Send the projections, norms, SwiGLUs and mixers' norm / gate ops to their Triton path (run by Triton's
    interpreter on the CPU); the state kernels keep the references."""
    from laquant.models import hybrid_mixers
    from laquant.quant import fused, modules

    def interpreted(x, state_format=None):
        return state_format is None and not (x.requires_grad and torch.is_grad_enabled())

    for module in (quantizing_rowwise, fused, modules, hybrid_mixers):
        monkeypatch.setattr(module, "use_triton", interpreted)


def _with_codes(*args, packed=None, **kwargs) -> bool:
    """Whether a ``gated_rms_norm_triton`` call writes codes (``packed`` by keyword or as the fifth argument)."""
    return (args[4] if len(args) > 4 else packed) is not None


@pytest.mark.parametrize("family", list(CODES_PATHS))
@torch.no_grad()
def test_codes_path_under_the_interpreter_equals_the_reference_path(family, monkeypatch):
    """The GPU wiring, checked on the CPU: with the projections, norms and SwiGLUs taking their Triton path (run
    by Triton's interpreter, float32), every installed norm hands its codes to its group's one GEMM (none is
    computed in vain), the MLPs' SwiGLU and the mixers' gated norm write down_proj's / out_proj's, and the logits
    equal the reference path's (the gated delta rules' gate tail on its one kernel, too)."""
    import laquant
    from laquant.kernels.delta import gating
    from laquant.kernels.rowwise import fused as rowwise_fused
    from laquant.models import hybrid_mixers
    from laquant.quant import fused

    model = _interpreted_codes_model(family)
    # the MoE experts stay float (their kernel is not on the path sent to the interpreter here): with int8 experts
    # Ling's logits differed by 1.3e-3 between the two paths, the experts' inputs and routing equal up to 1e-7 in
    # the first MoE layer and 1.2e-3 apart in the next one (an int8 rounding of the layers between, on a tie),
    # which says nothing of the wiring this test checks
    laquant.calibrate(model, load_recipe("hybrid_int8", ["experts.format=keep"]), torch.randint(0, VOCAB, (2, 64)),
                      progress=False)
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = model(ids).logits

    _projection_kernels_interpreted(monkeypatch)
    calls = {"gemm_on_codes": 0, "gated_norm_codes": 0, "swiglu_codes": 0, "gdn_gating": 0, "norm_codes": 0}

    def counted(name, fn, when=lambda *a, **k: True):
        def wrapper(*args, **kwargs):
            calls[name] += bool(when(*args, **kwargs))
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(fused, "_gemm_on_codes", counted("gemm_on_codes", fused._gemm_on_codes))
    monkeypatch.setattr(fused, "glu_w8a8", counted("swiglu_codes", fused.glu_w8a8))
    monkeypatch.setattr(rowwise_fused, "gated_rms_norm_triton", counted(
        "gated_norm_codes", rowwise_fused.gated_rms_norm_triton, _with_codes))
    monkeypatch.setattr(gating, "gdn_gating_triton", counted("gdn_gating", gating.gdn_gating_triton))
    monkeypatch.setattr(rowwise_fused, "rms_norm_triton", counted(
        "norm_codes", rowwise_fused.rms_norm_triton, lambda *a, packed=None, **k: packed is not None))
    joined = []  # q / k / v of one GEMM reach the conv as a view of its output, not a copy

    def join(parts):
        out = joined_columns(parts)
        joined.append(out.data_ptr() == parts[0].data_ptr())
        return out

    joined_columns = hybrid_mixers.joined_columns
    monkeypatch.setattr(hybrid_mixers, "joined_columns", join)
    norm_calls = []  # a norm of a block that several layers share (Zamba2's) runs once a use
    for m in model.modules():
        if isinstance(m, quantizing_rowwise._QuantizingNorm):
            m.register_forward_hook(lambda *_: norm_calls.append(1))
    logits = model(ids).logits
    installed = sum(isinstance(m, (quantizing_rowwise._QuantizingNorm, quantizing_rowwise._QuantizingSwiGLU))
                    for m in model.modules())
    assert installed and calls["gemm_on_codes"] >= installed, (installed, calls)
    assert calls["norm_codes"] == len(norm_calls), (norm_calls, calls)  # each installed norm wrote its group's codes
    assert all(calls[name] for name in CODES_PATHS[family]), calls
    assert bool(calls["gdn_gating"]) == (family in GATED_DELTA_NETS), calls
    assert all(joined) and bool(joined) == (family in ("kimi_linear", "bailing_hybrid", "olmo_hybrid")), joined
    assert rel_err(logits, reference) < 1e-5


@torch.no_grad()
def test_falcon_h1_attention_runs_its_projections_as_one_gemm(monkeypatch):
    """Falcon-H1 multiplies the norm's output by attention_in_multiplier before its attention, so no codes reach
    q/k/v: the attention (GROUPED_INPUTS) quantizes its input once and runs their one GEMM ahead of transformers'
    forward (under Triton's interpreter, float32): one GEMM an attention instead of three, none computed in vain,
    the logits the reference path's; without the mixin, three."""
    import laquant
    from laquant.kernels.gemm import int8
    from laquant.quant import fused

    model = _interpreted_codes_model("falcon_h1")
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 64)), progress=False)
    attentions = [layer.self_attn for layer in model.model.layers]
    assert all(type(a).__mro__[1] is quantizing_rowwise._GroupedInputs for a in attentions)
    qkv = sum(getattr(attentions[0], n).out_features for n in quantizing_rowwise._QKV)
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = model(ids).logits

    _projection_kernels_interpreted(monkeypatch)
    members = {getattr(a, n): n for a in attentions for n in quantizing_rowwise._QKV}
    widths, taken = [], []

    def counted(x, packed, *args, **kwargs):
        widths.append(packed.qweight.shape[0])
        return linear_triton(x, packed, *args, **kwargs)

    def took(module, x):
        out = take_output(module, x)
        if module in members:
            taken.append(out is not None)
        return out

    linear_triton, take_output = int8.linear_triton, fused.take_output
    monkeypatch.setattr(int8, "linear_triton", counted)
    monkeypatch.setattr(fused, "take_output", took)
    logits = model(ids).logits
    assert rel_err(logits, reference) < 1e-5
    assert widths.count(qkv) == len(attentions), widths  # one GEMM an attention, on its quantized input
    assert taken == [True] * len(members)  # each member took its columns of it, none ran its own
    for attention in attentions:  # the plain forward: each projection on its own
        attention.__class__ = attention._laquant_base
    widths.clear(), taken.clear()
    assert rel_err(model(ids).logits, reference) < 1e-5
    assert widths.count(qkv) == 0 and taken == [False] * len(members)


@pytest.mark.parametrize("family", ["bamba", "nemotron_h", "bamba_before_groups", "falcon_h1", "falcon_h1_gate_first"])
@pytest.mark.parametrize("variant", ["bf16", "weight_only"])
@torch.no_grad()
def test_mamba_gated_norm_is_one_kernel_without_codes(family, variant, monkeypatch):
    """Where Mamba2's out_proj takes no codes (the unquantized model; a recipe that makes it weight-only int8), the
    grouped gated norm still runs as laquant's one kernel on the GPU path (checked on the CPU under Triton's
    interpreter, float32), once per Mamba2 layer and token batch, and the logits equal transformers' norm's."""
    import laquant
    from laquant.kernels.rowwise import fused as rowwise_fused
    from laquant.models.hybrid_mixers import Mamba2Mixer
    from laquant.quant.modules import QuantLinear

    model = _interpreted_codes_model(family)
    if variant == "weight_only":  # every input column an outlier: weight-only int8
        recipe = load_recipe("hybrid_int8", ["projections.outlier_threshold=0.001",
                                             "projections.outlier_fallback=weight_only"])
        laquant.calibrate(model, recipe, torch.randint(0, VOCAB, (2, 64)), progress=False)
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    assert mixers
    if variant == "weight_only":
        assert all(isinstance(m.out_proj, QuantLinear) and m.out_proj.act_granularity == "none" for m in mixers)
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = model(ids).logits
    _projection_kernels_interpreted(monkeypatch)
    calls = {"codes": 0, "plain": 0}

    def counted(*args, **kwargs):
        calls["codes" if _with_codes(*args, **kwargs) else "plain"] += 1
        return gated_rms_norm_triton(*args, **kwargs)

    gated_rms_norm_triton = rowwise_fused.gated_rms_norm_triton
    monkeypatch.setattr(rowwise_fused, "gated_rms_norm_triton", counted)
    logits = model(ids).logits
    assert calls == {"codes": 0, "plain": len(mixers)}, calls
    assert rel_err(logits, reference) < 1e-5


@pytest.mark.parametrize("family", ["kimi_linear", "bailing_hybrid"])
@torch.no_grad()
def test_kda_output_norm_and_forget_gate_without_codes(family, monkeypatch):
    """The unquantized KDA hybrids on the GPU path (Triton's interpreter, float32): the sigmoid-gated output norm is
    laquant's one kernel (no codes to write) once per KDA layer, Kimi Linear's forget gate tail one kernel (Ling /
    Ring's bounded gate keeps PyTorch's), and the logits equal the CPU path's (transformers' norm and gate tail)."""
    from laquant.kernels.delta import gating
    from laquant.kernels.rowwise import fused as rowwise_fused
    from laquant.models.hybrid_mixers import KimiDeltaAttentionMixer

    model = _interpreted_codes_model(family)
    mixers = [m for m in model.modules() if isinstance(m, KimiDeltaAttentionMixer)]
    assert mixers
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = model(ids).logits
    _projection_kernels_interpreted(monkeypatch)
    calls = {"codes": 0, "plain": 0, "gating": 0}

    def norm(*args, **kwargs):
        calls["codes" if _with_codes(*args, **kwargs) else "plain"] += 1
        assert kwargs["activation"] == "sigmoid"
        return gated_rms_norm_triton(*args, **kwargs)

    def gate(*args, **kwargs):
        calls["gating"] += 1
        return gdn_gating_triton(*args, **kwargs)

    gated_rms_norm_triton, gdn_gating_triton = rowwise_fused.gated_rms_norm_triton, gating.gdn_gating_triton
    monkeypatch.setattr(rowwise_fused, "gated_rms_norm_triton", norm)
    monkeypatch.setattr(gating, "gdn_gating_triton", gate)
    logits = model(ids).logits
    assert calls == {"codes": 0, "plain": len(mixers), "gating": len(mixers) if family == "kimi_linear" else 0}, calls
    assert rel_err(logits, reference) < 1e-5


@torch.no_grad()
def _static_greedy(model, ids, n):
    """Greedy decoding on the static cache the captured loop replays, its steps run eagerly. In bf16 the
    eager loop (graphed=False, the dynamic cache's attention) rounds differently, so its tokens may part
    from the graph's at a near tie; these steps run the graph's kernels on the graph's inputs."""
    from laquant.generate import _forward, _fresh_cache, graph_history, kv_room, static_cache, static_forward

    logits, cache = _forward(model, ids, _fresh_cache(model))
    tokens = [logits.argmax(-1)]
    static = static_cache(cache, kv_room(ids.shape[1], graph_history(n)))  # the graph's room
    for _ in range(n - 1):
        tokens.append(static_forward(model, tokens[-1][:, None], static).argmax(-1))
    return torch.cat([ids, torch.stack(tokens, 1)], 1)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "nemotron_h", "bamba", "mamba2", "zamba2", "falcon_h1",
                                    "falcon_h1_gate_first", "kimi_linear", "bailing_hybrid", "olmo_hybrid", "minimax"])
@torch.no_grad()
def test_gpu_codes_handed_over_match_the_unfused_path(family, monkeypatch):
    """hybrid_int8 on qwen3_next, Qwen3.5, Nemotron-H, Bamba, Mamba-2, Zamba2, Falcon-H1, Kimi Linear, Ling / Ring,
    OLMo and MiniMax, bf16 on the kernels: with the norms writing the codes (and the MLPs' SwiGLU down_proj's, the
    mixer's gated norm out_proj's, Mamba2's gate-first grouped one, KDA's and MiniMax's sigmoid-gated ones too,
    Falcon-H1's attention its q/k/v's in one pass), the logits match the path that quantizes each projection's input
    on its own (the norms' float32 formula, rounded once), with fewer quantization launches; graphed greedy decoding
    equals the same static-cache steps run eagerly."""
    import laquant
    from laquant.generate import generate

    torch.manual_seed(0)
    model = _codes_model(family).to("cuda", torch.bfloat16).eval()
    install(model)
    laquant.calibrate(model, "hybrid_int8", torch.randint(0, VOCAB, (2, 128), device="cuda"), progress=False)
    ids = torch.randint(0, VOCAB, (3, 37), device="cuda")

    def run():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            logits = model(ids).logits.float()
            torch.cuda.synchronize()
        return logits, sum(e.count for e in prof.key_averages() if "quantize_rows" in e.key)

    fused, fused_quantize = run()
    assert torch.isfinite(fused).all()
    assert torch.equal(generate(model, ids[:, :9], 12), _static_greedy(model, ids[:, :9], 12))
    for module in model.modules():
        if isinstance(module, (quantizing_rowwise._QuantizingNorm, quantizing_rowwise._QuantizingSwiGLU,
                               quantizing_rowwise._GroupedInputs)):
            monkeypatch.setattr(module, "__class__", module._laquant_base)
    for table in (GATED_NORMS, MAMBA_GATED_NORMS):
        for name in list(table):
            monkeypatch.delitem(table, name)
    plain, plain_quantize = run()
    assert fused_quantize < plain_quantize, (fused_quantize, plain_quantize)
    assert (fused - plain).abs().max() <= 0.05 * plain.abs().max(), float((fused - plain).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["bamba", "nemotron_h", "falcon_h1", "falcon_h1_gate_first"])
@torch.no_grad()
def test_gpu_mamba_gated_norm_without_codes_matches_transformers(family, monkeypatch):
    """The unquantized bf16 model on the GPU: Mamba2's gated norm runs as laquant's one kernel (no codes to write), once
    per Mamba2 layer, and the logits match those with transformers' norm (the same formula; float32 sums in another
    order)."""
    from laquant.kernels.rowwise import fused as rowwise_fused
    from laquant.models.hybrid_mixers import Mamba2Mixer

    torch.manual_seed(0)
    model = _codes_model(family).to("cuda", torch.bfloat16).eval()
    install(model)
    mixers = sum(isinstance(m, Mamba2Mixer) for m in model.modules())
    ids = torch.randint(0, VOCAB, (3, 37), device="cuda")
    calls = []
    kernel = rowwise_fused.gated_rms_norm_triton
    monkeypatch.setattr(rowwise_fused, "gated_rms_norm_triton", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    fused = model(ids).logits.float()
    assert len(calls) == mixers and torch.isfinite(fused).all()
    for name in list(MAMBA_GATED_NORMS):
        monkeypatch.delitem(MAMBA_GATED_NORMS, name)
    plain = model(ids).logits.float()
    assert len(calls) == mixers
    assert (fused - plain).abs().max() <= 0.03 * plain.abs().max(), float((fused - plain).abs().max())



@torch.no_grad()
def test_per_group_codes_from_the_installed_norms_and_swiglu(monkeypatch):
    """``act_granularity: per_group`` on a transformers hybrid (Bamba, hidden 128: one group; SwiGLU 384 wide:
    three; the Mamba2 mixers' gated norms two rows of 128 a token), under Triton's interpreter: every installed norm
    and SwiGLU and every Mamba2 gated norm writes its GEMM's per-group codes (only the attention's o_proj quantizes
    its input in a pass of its own), and the logits equal the reference path's."""
    if not INTERPRETED or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("checks the kernels' wiring on the CPU under TRITON_INTERPRET=1")
    pytest.importorskip("triton")
    import laquant
    from laquant.kernels.gemm import int8
    from laquant.quant import fused
    from laquant.recipe import load_recipe
    from test_hybrid import bamba

    torch.manual_seed(3)
    model = bamba(hidden_size=128, intermediate_size=384, mamba_d_head=64).float().eval()
    install(model)
    laquant.calibrate(model, load_recipe("hybrid_int8", ["projections.act_granularity=per_group"]),
                      torch.randint(0, VOCAB, (2, 64)), progress=False)
    ids = torch.randint(0, VOCAB, (2, 11))
    reference = model(ids).logits
    _projection_kernels_interpreted(monkeypatch)
    widths = []  # the inputs quantized in a pass of their own
    real = int8.quantize_groups
    monkeypatch.setattr(int8, "quantize_groups", lambda x, p: widths.append(x.shape[-1]) or real(x, p))
    on_codes = []
    gemm_on_codes = fused._gemm_on_codes
    monkeypatch.setattr(fused, "_gemm_on_codes", lambda x, c, p: on_codes.append(p.group) or gemm_on_codes(x, c, p))
    logits = model(ids).logits
    layers = model.config.num_hidden_layers
    assert on_codes.count(128) >= 2 * layers  # each layer's input norm and its MLP's (or SwiGLU's) codes
    assert widths == [128] * len(model.config.attn_layer_indices)  # the attention layers' o_proj alone
    assert rel_err(logits, reference) < 1e-5
