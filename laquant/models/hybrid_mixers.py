"""laquant's linear-attention mixers for transformers' hybrid models.

Each one takes over a transformers mixer's submodules and parameters under the same names (so a
checkpoint's state dict loads unchanged) and keeps its call signature, but runs the state path on
laquant's ops: the recurrent state lives in laquant's state store beside transformers' cache (see
:mod:`laquant.models.cache`), in the format of the mixer's ``state_quantizer``. This also keeps
transformers from routing the layer to fla's GPU-only kernels on a CPU machine.

* :class:`GatedDeltaNetMixer` (``qwen3_next``): the gated delta rule.
* :class:`LightningMixer` (``minimax``): linear attention with a fixed per-head decay.
* :class:`Mamba2Mixer` (``bamba``, ``nemotron_h``, ``granitemoehybrid``, ``zamba2``): Mamba2's SSD, a
  per-head scalar decay ``dt * A``; :class:`FalconH1Mamba2Mixer` (``falcon_h1``) with muP multipliers.
* :class:`KimiDeltaAttentionMixer` (``kimi_linear``): the delta rule with a per-channel decay (KDA).
* :class:`BailingKDAMixer` (``bailing_hybrid``): KDA with a full-rank, bounded forget gate.

Lightning and SSD are gated linear attention with a scalar decay, so they run on the GLA kernels.
In laquant's state layout ``[K, V]`` a Mamba2 state is ``[d_state, head_dim]``: transformers'
``[head_dim, d_state]`` transposed.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import ACT2FN

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.numerics import ACT_GROUP
from laquant.kernels.conv.short_conv import ACTIVATIONS as ONE_KERNEL_ACTIVATIONS
from laquant.kernels.rowwise.fused import group_rows_fit
from laquant.models.cache import state_store
from laquant.models.quantizing_rowwise import GATED_NORMS, MAMBA_GATED_NORMS, mamba_norm_group
from laquant.models.recurrent import RecurrentMixer
from laquant.models.side_stream import fork
from laquant.quant.fused import joined_columns, project, w8a8_inputs
from laquant.quant.modules import QuantGate


def layer_states(cache, legacy=None):
    """The state store of the cache a transformers decoder layer hands its mixer: ``cache`` from
    transformers 5.24 on, ``cache_params`` / ``past_key_values`` (``legacy``) before."""
    return state_store(cache if cache is not None else legacy)


def mask_padding(x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Zero padded positions (a 2-D ``[B, T]`` mask of this call's tokens), as transformers does."""
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] == x.shape[1]:
        return (x * attention_mask[:, :, None]).to(x.dtype)
    return x


def short_conv(x: torch.Tensor, states, layer_idx: int, conv: nn.Conv1d, activation: str | None,
               cols: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise causal conv over ``x [B, T, C]``, continuing from the last ``W - 1`` inputs kept in
    the state store ``states`` (None: no cache) and keeping this call's last ones there. ``cols``
    (int32 ``[C]``): x is a projection's output ``[B, T, N]`` whose columns ``cols`` are the conv's input.
    A decode token on the GPU is one kernel (:mod:`laquant.kernels.conv.short_conv`), and so is a prompt's conv
    where nothing else is to be recorded (no verify step or state checkpoints, not a static cache)."""
    W = conv.kernel_size[0]
    prev = states.conv.get(layer_idx) if states is not None else None
    if _one_kernel_prompt(x, states, prev, activation):
        from laquant.kernels.conv.short_conv import short_conv_triton

        out, kept = short_conv_triton(x, prev, conv.weight.view(-1, W), conv.bias, activation, cols,
                                      keep=states is not None, mask=getattr(states, "token_mask", None))
        if states is not None:
            states.conv[layer_idx] = kept
        return out
    if _one_kernel_step(x, states, prev, activation):
        from laquant.kernels.conv.short_conv import short_conv_step_triton

        static = getattr(states, "static", False)  # a static cache (a CUDA-graphed step): the kept tensor in place
        kept = prev if static else torch.empty(prev.shape, dtype=x.dtype, device=x.device)
        out = short_conv_step_triton(x[:, 0], prev, conv.weight.view(-1, W), conv.bias, activation, cols,
                                     state_out=kept)
        if not static:
            states.conv[layer_idx] = kept
        return out[:, None]
    if cols is not None:
        x = x.index_select(-1, cols)
    B, T, C = x.shape
    mask = getattr(states, "token_mask", None) if states is not None else None
    if mask is not None:  # padding is no input: a sequence padded on the left starts from zeros, as alone
        x = x * mask[:, :, None].to(x.dtype)
    if prev is None:
        prev = x.new_zeros(B, W - 1, C)
    inp = torch.cat([prev.to(x.dtype), x], 1)
    out = F.conv1d(inp.transpose(1, 2).to(conv.weight.dtype), conv.weight, conv.bias, groups=C).transpose(1, 2)
    if activation is not None:
        out = ACT2FN[activation](out)
    if states is not None:
        if getattr(states, "static", False):  # a static cache (a CUDA-graphed step): the kept tensor in place
            prev.copy_(inp[:, inp.shape[1] - (W - 1):])
        elif mask is None:
            states.conv[layer_idx] = inp[:, inp.shape[1] - (W - 1):]
        else:  # padded (past the real tokens, or before them): keep the W - 1 inputs that end at the last real one
            last = (mask.long() * torch.arange(1, T + 1, device=mask.device)).amax(-1)  # its position + 1 (0: none)
            idx = last.to(x.device)[:, None] + torch.arange(W - 1, device=x.device)
            states.conv[layer_idx] = inp.gather(1, idx[..., None].expand(B, W - 1, C))
        if getattr(states, "pending", None) is not None:  # a verify step: the commit picks the window
            states.pending.conv[layer_idx] = inp
        if getattr(states, "checkpoints", None) is not None:
            states.checkpoints.keep_conv(layer_idx, inp, W)
    return out.to(x.dtype)


def _one_kernel_prompt(x: torch.Tensor, states, prev: torch.Tensor | None, activation: str | None) -> bool:
    """Whether :func:`short_conv` runs a prompt (more than one token, or a first one) as one kernel: on the GPU, with
    nothing else to record (no verify step or state checkpoints) into a cache that is not static."""
    recorded = states is not None and (getattr(states, "static", False) or any(
        getattr(states, name, None) is not None for name in ("pending", "checkpoints")))
    return ((x.shape[1] > 1 or prev is None) and activation in ONE_KERNEL_ACTIVATIONS and use_triton(x)
            and (prev is None or prev.stride(-1) == 1) and not recorded)


def _one_kernel_step(x: torch.Tensor, states, prev: torch.Tensor | None, activation: str | None) -> bool:
    """Whether :func:`short_conv` runs a decode token as one kernel: one token on the GPU, inputs kept
    from before, and nothing else to record (no padding mask, verify step or state checkpoints)."""
    return (x.shape[1] == 1 and prev is not None and prev.stride(-1) == 1 and activation in ONE_KERNEL_ACTIVATIONS
            and use_triton(x) and getattr(states, "token_mask", None) is None
            and getattr(states, "pending", None) is None and getattr(states, "checkpoints", None) is None)


def gate_logits(gate: nn.Module, x: torch.Tensor):
    """``(logits, treatment)``: a gated delta rule's gate projection's raw output and, for a calibrated
    :class:`QuantGate`, its logit treatment (None for a plain linear), where the one-launch gate tail
    (:mod:`laquant.kernels.delta.gating`) may take them: on the GPU, with no hooks on the gate (calibration
    observes its treated output). Else None: the module's forward and PyTorch's tail."""
    if not use_triton(x) or gate._forward_hooks or gate._forward_pre_hooks:
        return None
    if isinstance(gate, QuantGate):
        return (gate.project(x), gate.logit_treatment()) if gate.channel_start is None else None
    return gate(x), None


def gated_norm_and_out(mixer: nn.Module, out: str, norm: nn.Module, o: torch.Tensor, gate: torch.Tensor,
                       fallback) -> torch.Tensor:
    """``mixer.<out>`` of the gated output norm over ``o`` and its gate ``[B, T, H, D]`` (``norm`` per row of D):
    laquant's gated norm kernel (float32 throughout) where ``norm``'s class is in
    :data:`~laquant.models.quantizing_rowwise.GATED_NORMS`, Triton runs and the norm is not hooked, writing the
    projection's codes too where it is W8A8; else ``fallback()``, the module's own ops."""
    formula = GATED_NORMS.get(type(norm).__name__)
    if formula is None or not use_triton(o) or norm._forward_hooks or norm._forward_pre_hooks:
        return fallback()
    from laquant.kernels.rowwise.fused import gated_rms_norm_triton

    B, T = o.shape[:2]
    packed = w8a8_inputs(mixer, (out,), o, groups=group_rows_fit(o.shape[-1], ACT_GROUP))
    normed = gated_rms_norm_triton(o, gate, norm.weight, getattr(norm, formula.eps_name), packed,
                                   activation=formula.activation)
    if packed is None:
        return getattr(mixer, out)(normed.reshape(B, T, -1))
    normed, codes = normed
    return project(mixer, (out,), normed.reshape(B, T, -1), codes)[0]


def treatment_view(treatment: dict | None, view) -> dict | None:
    """A gate's treatment with its per-channel tensors passed through ``view`` (to the heads' ``[G, R]``
    layout); a per-tensor scale stays as it is."""
    if treatment is None:
        return None
    return {k: None if v is None else v if k == "logit_scale" and v.numel() == 1 else view(v)
            for k, v in treatment.items()}


class HybridMixer(RecurrentMixer):
    """A laquant mixer that takes over a transformers mixer ``src``: its submodules, parameters,
    buffers and attributes (``MODULES``, ``PARAMETERS``, ``BUFFERS``, ``ATTRS``) under the same names.
    The class also says how it sits in the model (read by
    :class:`~laquant.adapters.hybrid.HybridAdapter`): its ordinary projections (``PROJECTIONS``), its
    gate projection (``GATE``, or None), its decay parameters (``DECAY``), the split of its fused
    projections (:meth:`fused_splits`) and the shape ``(heads, K, V)`` of its state."""

    MODULES: tuple[str, ...] = ()
    PARAMETERS: tuple[str, ...] = ()
    BUFFERS: tuple[str, ...] = ()  # transformers saves them: registered again to keep the state dict
    ATTRS: tuple[str, ...] = ()
    PROJECTIONS: tuple[str, ...] = ()
    GATE: str | None = None
    DECAY: tuple[str, ...] = ()

    def __init__(self, src: nn.Module):
        super().__init__(src.layer_idx)
        for name in self.MODULES + self.PARAMETERS + self.ATTRS:
            setattr(self, name, getattr(src, name))
        for name in self.BUFFERS:
            self.register_buffer(name, getattr(src, name))
        self.layer_type = getattr(src, "layer_type", "linear_attention")

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        """Fused projection of the source module -> its parts and their widths."""
        return {}

    @staticmethod
    def layout_problem(src: nn.Module) -> str | None:
        """What makes the source module's layout unusable beyond missing parts (None: nothing)."""
        return None

    def gate_channels(self) -> tuple[int, int] | None:
        """``(first, count)`` when the gate is a slice of a fused projection's outputs."""
        return None

    def state_shape(self) -> tuple[int, int, int]:
        raise NotImplementedError

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no gate projection")


class GatedDeltaNetMixer(HybridMixer):
    """transformers' ``Qwen3NextGatedDeltaNet``: fused ``in_proj_qkvz`` (q, k, v and the output gate
    z, grouped per key head), ``in_proj_ba`` (beta logits b and decay logits a, grouped the same way),
    a short conv over q, k, v, and the gated delta rule with ``g = -exp(A_log) softplus(a + dt_bias)``."""

    MODULES = ("conv1d", "in_proj_qkvz", "in_proj_ba", "norm", "out_proj")
    PARAMETERS = ("dt_bias", "A_log")
    ATTRS = ("num_v_heads", "num_k_heads", "head_k_dim", "head_v_dim", "key_dim", "value_dim", "activation")
    PROJECTIONS = ("in_proj_qkvz", "out_proj")
    GATE = "in_proj_ba"
    DECAY = ("A_log", "dt_bias")
    NORM, OUT = "norm", "out_proj"  # the gated output norm and the projection after it

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        return {"in_proj_qkvz": {"q": src.key_dim, "k": src.key_dim, "v": src.value_dim, "z": src.value_dim},
                "in_proj_ba": {"b": src.num_v_heads, "a": src.num_v_heads}}

    @staticmethod
    def layout_problem(src: nn.Module) -> str | None:
        if src.num_v_heads % src.num_k_heads:
            return (f"{src.num_v_heads} value heads do not group evenly over {src.num_k_heads} key heads; "
                    "the fused split is unknown")
        return None

    def state_shape(self) -> tuple[int, int, int]:
        return self.num_v_heads, self.head_k_dim, self.head_v_dim

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay of ``in_proj_ba``'s outputs."""
        return self.log_decay(self.split_ba(logits)[1])

    def grouped_qkvz(self, qkvz: torch.Tensor):
        """``in_proj_qkvz``'s output as it is laid out, per key head: q, k ``[..., Hk, K]`` and v, z
        ``[..., Hk, r * V]`` (views: the short conv reads q, k and v in place, :meth:`conv_columns`, and
        the gated norm z, :meth:`norm_and_out`)."""
        r = self.num_v_heads // self.num_k_heads
        x = qkvz.unflatten(-1, (self.num_k_heads, 2 * self.head_k_dim + 2 * r * self.head_v_dim))
        return x.split([self.head_k_dim, self.head_k_dim, r * self.head_v_dim, r * self.head_v_dim], dim=-1)

    def split_ba(self, ba: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``in_proj_ba``'s output -> (b, a), each ``[..., num_v_heads]``."""
        r = self.num_v_heads // self.num_k_heads
        b, a = ba.unflatten(-1, (self.num_k_heads, 2 * r)).split([r, r], dim=-1)
        return b.flatten(-2), a.flatten(-2)

    def log_decay(self, a: torch.Tensor) -> torch.Tensor:
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())

    def conv_and_attend(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, states,
                        cols: torch.Tensor | None = None) -> torch.Tensor:
        """The short conv over the concatenated ``q, k, v [B, T, 2 * key_dim + value_dim]`` (or over
        the columns ``cols`` of a projection's output, see :func:`short_conv`), then the gated delta
        rule: ``o [B, T, Hv, V]``."""
        mixed = short_conv(qkv, states, self.layer_idx, self.conv1d, self.activation, cols)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], -1)
        q, k = q.unflatten(-1, (-1, self.head_k_dim)), k.unflatten(-1, (-1, self.head_k_dim))
        return self.attend_delta(q, k, v.unflatten(-1, (-1, self.head_v_dim)), g, beta, states)

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g, beta)`` float32 ``[B, T, Hv]`` from ``in_proj_ba(x)``; on the GPU the tail is one kernel
        reading the fused projection's output in place."""
        fused = gate_logits(self.in_proj_ba, x)
        if fused is None:
            b, a = self.split_ba(self.in_proj_ba(x))
            return self.log_decay(a), b.float().sigmoid()
        from laquant.kernels.delta.gating import gdn_gating_triton

        logits, treatment = fused
        r = self.num_v_heads // self.num_k_heads
        grouped = logits.unflatten(-1, (self.num_k_heads, 2 * r))  # per key head: r beta logits, r decay logits
        by_head = lambda t: t.view(self.num_k_heads, 2 * r)  # noqa: E731
        return gdn_gating_triton(grouped[..., r:], grouped[..., :r], self.A_log, self.dt_bias,
                                 a_treatment=treatment_view(treatment, lambda t: by_head(t)[:, r:]),
                                 b_treatment=treatment_view(treatment, lambda t: by_head(t)[:, :r]))

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, cache=None, **kwargs):
        x = mask_padding(hidden_states, attention_mask)
        gates = fork(self.gates, x)  # in a captured step, beside the big GEMM
        qkvz = self.in_proj_qkvz(x)
        g, beta = gates.join()
        o = self.conv_and_attend(qkvz, g, beta, layer_states(cache, cache_params), cols=self.conv_columns(qkvz))
        return self.norm_and_out(o, self.grouped_qkvz(qkvz)[3])

    def conv_columns(self, qkvz: torch.Tensor) -> torch.Tensor:
        """The columns of ``in_proj_qkvz``'s output that are q, k and v, in the short conv's channel
        order (int32, made once per device by :meth:`grouped_qkvz` itself)."""
        cols = self.__dict__.get("_conv_columns")
        if cols is None or cols.device != qkvz.device:
            q, k, v, _ = self.grouped_qkvz(torch.arange(qkvz.shape[-1], dtype=torch.int32, device=qkvz.device))
            cols = self.__dict__["_conv_columns"] = torch.cat([q.flatten(-2), k.flatten(-2), v.flatten(-2)])
        return cols

    def norm_and_out(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``out_proj(norm(o, z))`` (the modules :attr:`NORM`, :attr:`OUT`) over ``o [B, T, Hv, V]`` and the gate z
        ``[B, T, Hv, V]``, or ``[B, T, Hk, r * V]`` grouped per key head (qwen3_next's, a view into its fused
        projection). Where out_proj is W8A8 on the GPU and the norm's formula is one
        :data:`~laquant.models.quantizing_rowwise.GATED_NORMS` knows, laquant's gated norm (float32
        throughout) writes out_proj's codes in the same kernel, reading z where it lies."""
        B, T = o.shape[:2]
        norm = getattr(self, self.NORM)
        formula = GATED_NORMS.get(type(norm).__name__)
        hooked = norm._forward_hooks or norm._forward_pre_hooks  # a hooked norm runs its own forward
        packed = (w8a8_inputs(self, (self.OUT,), o, groups=group_rows_fit(self.head_v_dim, ACT_GROUP))
                  if formula is not None and not hooked else None)
        if packed is not None:
            from laquant.kernels.rowwise.fused import gated_rms_norm_triton

            g = z.reshape(B * T, *z.shape[2:-1], -1, self.head_v_dim)  # [B * T, G, R, V]: a view
            out, codes = gated_rms_norm_triton(o.reshape(g.shape), g, norm.weight, getattr(norm, formula.eps_name),
                                               packed, token_rows=self.num_v_heads, activation=formula.activation)
            return project(self, (self.OUT,), out.reshape(B, T, -1), codes)[0]
        o = norm(o.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return getattr(self, self.OUT)(o.reshape(B, T, -1))


class LightningMixer(HybridMixer):
    """transformers' ``MiniMaxLightningAttention``: ``act(qkv_proj(x))`` split per head into q, k, v;
    ``S_t = exp(-slope) S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t`` (no q scaling); RMSNorm over all
    heads, a sigmoid output gate, ``out_proj``. The decay (``slope_rate``) is a fixed buffer."""

    MODULES = ("norm", "qkv_proj", "out_proj", "output_gate")
    BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
    ATTRS = ("head_dim", "num_attention_heads", "act_fn", "block_size")
    PROJECTIONS = ("qkv_proj", "output_gate", "out_proj")
    GATE = None  # the decay is a fixed buffer
    DECAY = ("slope_rate",)

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        width = src.num_attention_heads * src.head_dim
        return {"qkv_proj": {"q": width, "k": width, "v": width}}

    def state_shape(self) -> tuple[int, int, int]:
        return self.num_attention_heads, self.head_dim, self.head_dim

    def log_decay(self) -> torch.Tensor:
        """Per-head log-decay ``[H]`` (the same at every token)."""
        return -self.slope_rate.float().reshape(-1)

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                past_key_values=None, cache=None, **kwargs):
        B, T, _ = hidden_states.shape
        H, D = self.num_attention_heads, self.head_dim
        qkv = mask_padding(self.act_fn(self.qkv_proj(hidden_states)), attention_mask)
        q, k, v = qkv.reshape(B, T, H, 3 * D).split(D, dim=-1)
        g = self.log_decay().to(q.device).expand(B, T, H)
        o = self.attend_gla(q, k, v, g, layer_states(cache, past_key_values), scale=1.0)
        return self.norm_and_out(o.reshape(B, T, 1, H * D), self.output_gate(hidden_states)), None

    def norm_and_out(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``out_proj(sigmoid(gate) * norm(o))`` over ``o [B, T, 1, H * D]`` (the norm spans all heads) and the
        output gate ``[B, T, H * D]``. On the GPU, where the norm's class is in
        :data:`~laquant.models.quantizing_rowwise.GATED_NORMS` (MiniMax's RMSNorm with the mixer's sigmoid gate; float32
        throughout, where transformers rounds the normalized rows and the gate's product to the model's dtype),
        laquant's gated norm kernel computes it in one launch, writing out_proj's codes too where out_proj is W8A8."""
        B, T = o.shape[:2]
        return gated_norm_and_out(self, "out_proj", self.norm, o, gate.reshape(o.shape),
                                  lambda: self.out_proj(torch.sigmoid(gate) * self.norm(o.reshape(B, T, -1))))


class Mamba2Mixer(HybridMixer):
    """transformers' ``BambaMixer`` (Mamba2): fused ``in_proj`` -> (gate z, x|B|C, dt); a short conv
    over x|B|C; the SSD scan ``S_t = exp(dt_t A) S_{t-1} + B_t^T (dt_t x_t)``, ``y_t = C_t S_t + D x_t``
    (B and C shared by the heads of a group); a gated RMSNorm with z; ``out_proj``."""

    MODULES = ("in_proj", "conv1d", "norm", "out_proj")
    PARAMETERS = ("dt_bias", "A_log", "D")
    ATTRS = ("num_heads", "head_dim", "ssm_state_size", "n_groups", "intermediate_size", "conv_dim", "activation",
             "time_step_limit")
    PROJECTIONS = ("in_proj", "out_proj")
    GATE = "in_proj"  # the dt channels of the fused in_proj (also a projection)
    DECAY = ("A_log", "dt_bias", "D")

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        return {"in_proj": {"z": src.intermediate_size, "x": src.intermediate_size,
                            "B": src.n_groups * src.ssm_state_size, "C": src.n_groups * src.ssm_state_size,
                            "dt": src.num_heads}}

    def gate_channels(self) -> tuple[int, int]:
        """The gate's outputs within ``in_proj``: ``(first, count)`` (the dt channels)."""
        return self.intermediate_size + self.conv_dim, self.num_heads

    def state_shape(self) -> tuple[int, int, int]:
        return self.num_heads, self.ssm_state_size, self.head_dim  # [d_state, head_dim] per head

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay of the dt logits (the gate's channels of ``in_proj``)."""
        return self.log_decay(logits)

    def split_in_proj(self, proj: torch.Tensor):
        """``in_proj``'s output -> (z ``[..., I]``, x|B|C ``[..., conv_dim]``, dt ``[..., H]``)."""
        return proj.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)

    def time_step(self, dt: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(dt.float() + self.dt_bias.float())
        lo, hi = self.time_step_limit if self.time_step_limit is not None else (0.0, float("inf"))
        return dt.clamp(lo, hi)

    def log_decay(self, dt_logits: torch.Tensor) -> torch.Tensor:
        """Per-head log-decay ``dt * A`` from the dt logits (``in_proj``'s last ``H`` outputs)."""
        return self.time_step(dt_logits) * -self.A_log.float().exp()

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, cache=None, **kwargs):
        dtype = hidden_states.dtype
        x = mask_padding(hidden_states, attention_mask)
        B, T, _ = x.shape
        H, P, N, G = self.num_heads, self.head_dim, self.ssm_state_size, self.n_groups
        states = layer_states(cache, cache_params)
        z, xbc, dt_logits, treatment = self.projected(x)
        xbc = short_conv(xbc, states, self.layer_idx, self.conv1d, self.activation)
        xbc = mask_padding(xbc, attention_mask)
        xs, b, c = xbc.split([self.intermediate_size, G * N, G * N], dim=-1)
        stored = self._one_kernel_state(xs, states)
        if stored is not None:  # the kernel treats the dt logits itself
            y = self._ssd_step(xs, b, c, dt_logits, treatment, states, stored, dtype)
            return self.norm_and_out(y.reshape(B, T, -1), z)
        if treatment is not None:
            dt_logits = self.in_proj.treat(dt_logits)
        dt = self.time_step(dt_logits)
        g = dt * -self.A_log.float().exp()
        xs = xs.unflatten(-1, (H, P))
        k = b.unflatten(-1, (G, N)).repeat_interleave(H // G, dim=2)
        q = c.unflatten(-1, (G, N)).repeat_interleave(H // G, dim=2)
        v = xs.float() * dt.unsqueeze(-1)
        # float32 as transformers' scan, its products on the tensor cores (tf32x3): exact ones ran a 1.37B Mamba-2's
        # 1K-token prefill at ~5,000 tokens/s on an H200 (eval/results/mamba2_prefill_h200/)
        y = self.attend_gla(q.float(), k.float(), v, g, states, scale=1.0, fp32_dots="tf32x3")
        y = y + xs.float() * self.D.float()[:, None]
        return self.norm_and_out(y.reshape(B, T, -1).to(dtype), z)

    def _one_kernel_state(self, xs: torch.Tensor, states):
        """The stored state when a decode token's scan runs as one kernel
        (:func:`~laquant.kernels.gla.decode.ssd_decode_step`: the dt logits' treatment, the time step, decay,
        ``dt x``, the groups' B and C and ``D x`` inside): one token on the GPU with a stored state, not a verify
        step nor a padded prefill, no gradient wanted through ``xs``. Else None: the PyTorch glue and
        :meth:`attend_gla`."""
        if (xs.shape[1] != 1 or states is None or getattr(states, "pending", None) is not None
                or getattr(states, "token_mask", None) is not None
                or not use_triton(xs, self.state_quantizer.format.name)):
            return None
        return states.get(self.layer_idx)

    def _ssd_step(self, xs, b, c, dt_logits, treatment, states, stored, dtype: torch.dtype) -> torch.Tensor:
        """One decode token's scan, ``y [B, 1, H, P]`` in ``dtype`` (the kernel rounds its float32 output once, as
        ``.to(dtype)`` would), ``stored`` updated in place; ``treatment``: the calibrated gate's, for dt logits
        :meth:`projected` left untreated."""
        from laquant.kernels.gla.decode import ssd_decode_step
        from laquant.models.recurrent import _seed

        B, H, P, N, G = xs.shape[0], self.num_heads, self.head_dim, self.ssm_state_size, self.n_groups
        y = ssd_decode_step(c[:, 0].unflatten(-1, (G, N)), b[:, 0].unflatten(-1, (G, N)),
                            xs[:, 0].unflatten(-1, (H, P)),
                            dt_logits[:, 0], self.dt_bias, self.A_log, self.D, self.time_step_limit, stored.data,
                            stored.row_scale, *self._pool_slots(stored, B, xs.device), seed=_seed(states),
                            dt_treatment=treatment, out=torch.empty(B, H, P, dtype=dtype, device=xs.device),
                            early_state=True)  # the layer's conv precedes the step
        self._count_decode_step(states, stored)
        return y.unsqueeze(1)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``in_proj``'s output as the scan reads it."""
        return self.in_proj(x)

    def projected(self, x: torch.Tensor):
        """``(z, x|B|C, dt logits, treatment)`` of ``in_proj(x)``. A calibrated ``in_proj`` (a :class:`QuantGate` of
        its last ``H`` outputs, the dt channels) runs its linears alone and returns the dt logits untreated with its
        treatment (:meth:`QuantGate.logit_treatment`), for the SSD decode kernel to apply or ``in_proj.treat``
        (six PyTorch kernels a layer and token): its forward would copy the whole output to put the treated
        channels back among the others (one ``cat`` a layer and token, 12 of the 24 in a quantized Nemotron-H's
        1K-token prefill profile, ``eval/results/families_h200/profiles_b1/``). ``treatment`` None: the logits are
        final (no gate, or a gate with hooks, calibration observing its output, which runs its forward)."""
        gate = self.in_proj
        first, count = self.gate_channels()
        if (isinstance(gate, QuantGate) and gate.channel_start == first and gate.logit_min.numel() == count
                and not (gate._forward_hooks or gate._forward_pre_hooks)):
            return *self.split_in_proj(gate.untreated(x)), gate.logit_treatment()
        return *self.split_in_proj(self.project(x)), None

    def gated_output(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The scan's output ``[B, T, I]`` gated by z (the gated RMSNorm)."""
        return self.norm(y, z)

    def norm_and_out(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``out_proj(gated_output(y, z))`` over the scan's output ``y [B, T, I]`` in the model's dtype. On the GPU,
        where the norm is a grouped gated norm of :data:`~laquant.models.quantizing_rowwise.MAMBA_GATED_NORMS`
        (Mamba2's with its weight in y's dtype, or Falcon-H1's), laquant's norm kernel computes it (the gate
        before or after the norm as the table says, one weight row per group, the same formula), z read in place
        out of in_proj's output: one kernel where transformers' norm takes about ten. Where out_proj is W8A8 the
        same launch writes its codes; else (bf16, or weight-only int8 under ``outlier_fallback``) out_proj reads
        the norm's output."""
        formula = MAMBA_GATED_NORMS.get(type(self.norm).__name__)  # Falcon-H1 without its norm: nn.Identity
        norm = self.norm
        if (formula is None or (formula.round_normed and norm.weight.dtype != y.dtype) or not use_triton(y)
                or norm._forward_hooks or norm._forward_pre_hooks):  # a hooked norm runs its own forward
            return self.out_proj(self.gated_output(y, z).to(y.dtype))
        from laquant.kernels.rowwise.fused import gated_rms_norm_triton

        B, T, width = y.shape
        group = mamba_norm_group(norm, width)
        packed = w8a8_inputs(self, ("out_proj",), y, groups=group == width or group_rows_fit(group, ACT_GROUP))
        rows = (B * T, width // group, group)
        out = gated_rms_norm_triton(y.reshape(rows), z.reshape(rows), norm.weight.view(rows[1:]),
                                    getattr(norm, formula.eps_name), packed, gate_first=formula.gate_first(norm),
                                    round_normed=formula.round_normed)
        if packed is None:
            return self.out_proj(out.reshape(B, T, width))
        out, codes = out
        return project(self, ("out_proj",), out.reshape(B, T, width), codes)[0]


class FalconH1Mamba2Mixer(Mamba2Mixer):
    """transformers' ``FalconH1Mixer``: Mamba2 with muP multipliers, the input scaled by
    ``ssm_in_multiplier`` before ``in_proj`` and ``in_proj``'s outputs by ``mup_vector`` (one
    multiplier per part z, x, B, C, dt: ``config.ssm_multipliers``), so the dt logits reach the
    softplus multiplied by the dt part's; the gated RMSNorm (grouped, norm before or after the gate)
    is optional (``mamba_rms_norm``; without it the output is ``y * silu(z)``). ``mup_vector`` is a
    non-persistent buffer transformers computes from the config: kept so, not saved."""

    ATTRS = (*Mamba2Mixer.ATTRS, "ssm_in_multiplier", "mamba_rms_norm")

    def __init__(self, src: nn.Module):
        super().__init__(src)
        self.register_buffer("mup_vector", src.mup_vector, persistent=False)

    @staticmethod
    def layout_problem(src: nn.Module) -> str | None:
        want = src.in_proj.out_features
        got = getattr(src, "mup_vector", None)
        if not isinstance(got, torch.Tensor) or got.shape[-1] != want:
            shape = None if not isinstance(got, torch.Tensor) else tuple(got.shape)
            return f"mup_vector is {shape}, expected one multiplier per in_proj output ({want})"
        return None

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay of ``in_proj``'s raw dt channels (their muP multiplier applied first)."""
        dt_mup = self.mup_vector.reshape(-1)[-self.num_heads:].to(logits.device, torch.float32)
        return self.log_decay(logits.float() * dt_mup)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return self.in_proj(x * self.ssm_in_multiplier) * self.mup_vector

    def projected(self, x: torch.Tensor):
        """``in_proj``'s output split, the dt logits final (treatment None: the muP multipliers apply after the
        gate's treatment, so it runs in the gate's forward)."""
        return *self.split_in_proj(self.project(x)), None

    def gated_output(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if self.mamba_rms_norm:  # as rows: transformers 5.17's norm squeezed a [B, 1, I] y to [B, I], times z [B, 1, I]
            return self.norm(y.reshape(-1, y.shape[-1]), z.reshape(-1, z.shape[-1])).reshape(y.shape)
        return y * F.silu(z)



def _widths_problem(src: nn.Module, want: dict[str, int]) -> str | None:
    """What differs in a Gated DeltaNet with separate projections: the head grouping or a width."""
    if src.num_v_heads % src.num_k_heads:
        return f"{src.num_v_heads} value heads do not group evenly over {src.num_k_heads} key heads"
    for name, n in want.items():
        if getattr(src, name).out_features != n:
            return f"{name} has {getattr(src, name).out_features} outputs, expected {n}"
    return None


class SplitGatedDeltaNetMixer(GatedDeltaNetMixer):
    """transformers' ``Qwen3_5GatedDeltaNet`` / ``Qwen3_5MoeGatedDeltaNet``: qwen3_next's gated delta
    rule with separate projections, ``in_proj_qkv`` (q, k, v contiguous, the conv's input),
    ``in_proj_z`` (the output gate), ``in_proj_b`` (beta logits) and ``in_proj_a`` (decay logits,
    the gate projection)."""

    MODULES = ("conv1d", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "norm", "out_proj")
    PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "out_proj")
    GATE = "in_proj_a"
    BETA = "in_proj_b"  # the beta logits' projection

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        return {"in_proj_qkv": {"q": src.key_dim, "k": src.key_dim, "v": src.value_dim}}

    @staticmethod
    def layout_problem(src: nn.Module) -> str | None:
        return _widths_problem(src, {"in_proj_z": src.value_dim, "in_proj_b": src.num_v_heads,
                                     "in_proj_a": src.num_v_heads})

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay of the gate projection's outputs (the decay logits alone)."""
        return self.log_decay(logits)

    def beta_scale(self) -> float:
        return 1.0

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(g, beta)`` float32 ``[B, T, Hv]`` from the decay projection (``GATE``) and the beta one
        (``BETA``); on the GPU the tail is one kernel."""
        gate, beta_proj = getattr(self, self.GATE), getattr(self, self.BETA)
        fused = gate_logits(gate, x)
        if fused is None:
            g, beta = self.log_decay(gate(x)), beta_proj(x).float().sigmoid()
            return g, beta * self.beta_scale() if self.beta_scale() != 1.0 else beta
        from laquant.kernels.delta.gating import gdn_gating_triton

        logits, treatment = fused
        as_heads = lambda t: t.unflatten(-1, (1, self.num_v_heads))  # noqa: E731
        return gdn_gating_triton(as_heads(logits), as_heads(beta_proj(x)), self.A_log, self.dt_bias,
                                 beta_scale=self.beta_scale(), a_treatment=treatment_view(treatment, as_heads))

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, cache=None, **kwargs):
        x = mask_padding(hidden_states, attention_mask)
        B, T, _ = x.shape
        gates = fork(self.gates, x)  # in a captured step, beside the GEMMs
        z = self.in_proj_z(x)
        qkv = self.in_proj_qkv(x)
        g, beta = gates.join()
        o = self.conv_and_attend(qkv, g, beta, layer_states(cache, cache_params))
        return self.norm_and_out(o, z.unflatten(-1, (self.num_v_heads, self.head_v_dim)))


class OlmoGatedDeltaNetMixer(SplitGatedDeltaNetMixer):
    """transformers' ``OlmoHybridGatedDeltaNet``: separate ``q_proj``, ``k_proj``, ``v_proj`` (their
    concatenation is the conv's input; the conv has no bias), ``a_proj`` (decay logits, the gate
    projection), ``b_proj`` (beta logits; beta doubled to ``[0, 2]`` with ``allow_neg_eigval``),
    ``g_proj`` (the output gate) into the gated ``o_norm``, and ``o_proj``."""

    MODULES = ("conv1d", "q_proj", "k_proj", "v_proj", "a_proj", "b_proj", "g_proj", "o_norm", "o_proj")
    ATTRS = (*SplitGatedDeltaNetMixer.ATTRS, "allow_neg_eigval")
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj", "o_proj")
    GATE = "a_proj"
    BETA = "b_proj"
    NORM, OUT = "o_norm", "o_proj"

    @staticmethod
    def fused_splits(src: nn.Module) -> dict[str, dict[str, int]]:
        return {}

    @staticmethod
    def layout_problem(src: nn.Module) -> str | None:
        return _widths_problem(src, {"q_proj": src.key_dim, "k_proj": src.key_dim, "v_proj": src.value_dim,
                                     "g_proj": src.value_dim, "a_proj": src.num_v_heads, "b_proj": src.num_v_heads})

    def beta_scale(self) -> float:
        return 2.0 if self.allow_neg_eigval else 1.0  # beta in [0, 2]

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, cache=None, **kwargs):
        x = mask_padding(hidden_states, attention_mask)
        B, T, _ = x.shape
        gates = fork(self.gates, x)  # in a captured step, beside the GEMMs
        qkv = joined_columns((self.q_proj(x), self.k_proj(x), self.v_proj(x)))
        g, beta = gates.join()
        o = self.conv_and_attend(qkv, g, beta, layer_states(cache, cache_params))
        return self.norm_and_out(o, self.g_proj(x).unflatten(-1, (self.num_v_heads, self.head_v_dim)))


class KimiDeltaAttentionMixer(HybridMixer):
    """transformers' ``KimiLinearDeltaAttention`` (Kimi Delta Attention, KDA): separate ``q_proj``,
    ``k_proj``, ``v_proj`` (their concatenation is the short conv's input), the per-channel forget
    gate ``forget_gate`` (low rank ``f_a_proj`` -> ``f_b_proj``, then
    ``g = -exp(A_log) softplus(logits + dt_bias)`` per head and key channel), ``b_proj`` (beta
    logits), the low-rank output gate ``g_a_proj`` -> ``g_b_proj`` into the gated ``o_norm``, and
    ``o_proj``. The recurrence is the delta rule with a per-channel decay (:mod:`laquant.kernels.kda`).
    The gate role is ``forget_gate.f_b_proj``, whose outputs are the decay logits."""

    MODULES = ("q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "g_a_proj", "g_b_proj", "o_norm",
               "o_proj")
    ATTRS = ("num_heads", "head_dim", "qkv_dim", "activation")
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "forget_gate.f_a_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj")
    GATE = "forget_gate.f_b_proj"
    DECAY = ("forget_gate.A_log", "forget_gate.dt_bias")

    GATE_ATTRS = ("f_a_proj", "f_b_proj", "A_log", "dt_bias")  # what forget_gate must hold
    OUT_GATE = "g_b_proj"  # the output gate's last projection (qkv_dim outputs)

    @classmethod
    def layout_problem(cls, src: nn.Module) -> str | None:
        gate = src.forget_gate
        missing = [a for a in cls.GATE_ATTRS if not hasattr(gate, a)]
        if missing:
            return f"forget_gate ({type(gate).__name__}) lacks {', '.join(missing)}"
        want = {"q_proj": src.qkv_dim, "k_proj": src.qkv_dim, "v_proj": src.qkv_dim, cls.OUT_GATE: src.qkv_dim,
                "b_proj": src.num_heads, cls.GATE: src.qkv_dim}
        for name, n in want.items():
            if src.get_submodule(name).out_features != n:
                return f"{name} has {src.get_submodule(name).out_features} outputs, expected {n}"
        if gate.A_log.numel() != src.num_heads or gate.dt_bias.numel() != src.qkv_dim:
            return (f"forget_gate.A_log has {gate.A_log.numel()} values and dt_bias {gate.dt_bias.numel()}, expected "
                    f"{src.num_heads} (one per head) and {src.qkv_dim} (one per channel)")
        return None

    def state_shape(self) -> tuple[int, int, int]:
        return self.num_heads, self.head_dim, self.head_dim

    def log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The per-channel log-decay ``[..., H, K]`` of the decay logits ``[..., H * K]``."""
        x = (logits.float() + self.forget_gate.dt_bias.float()).unflatten(-1, (self.num_heads, self.head_dim))
        return -self.forget_gate.A_log.float().exp().reshape(self.num_heads, 1) * F.softplus(x)

    def gate_log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        """The log-decay of the gate projection's outputs, per channel as they are laid out."""
        return self.log_decay(logits).flatten(-2)

    def forget_log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """The forget gate's per-channel log-decay ``[..., H, K]`` of the layer's input; on the GPU the tail after
        ``f_b_proj`` (its logit treatment when calibrated, ``dt_bias``, softplus, the per-head rate) is one kernel."""
        gate = self.forget_gate
        hidden = gate.f_a_proj(x)
        fused = gate_logits(gate.f_b_proj, hidden)
        if fused is None:
            return self.log_decay(gate.f_b_proj(hidden))
        from laquant.kernels.delta.gating import gdn_gating_triton

        logits, treatment = fused
        heads = (self.num_heads, self.head_dim)
        g, _ = gdn_gating_triton(logits.unflatten(-1, heads), None, gate.A_log.view(-1), gate.dt_bias,
                                 a_treatment=treatment_view(treatment, lambda t: t.view(heads)))
        return g.unflatten(-1, heads)

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_b_proj(self.g_a_proj(x))

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, cache=None, **kwargs):
        x = mask_padding(hidden_states, attention_mask)
        B, T, _ = x.shape
        states = layer_states(cache, cache_params)
        decay = fork(self.forget_log_decay, x)  # in a captured step, beside the q/k/v GEMMs and the conv
        qkv = short_conv(joined_columns((self.q_proj(x), self.k_proj(x), self.v_proj(x))), states, self.layer_idx,
                         self.conv1d, self.activation)
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)) for t in qkv.split(self.qkv_dim, -1))
        o = self.attend_delta(q, k, v, decay.join(), self.b_proj(x).float().sigmoid(), states)
        return self.norm_and_out(o, self.output_gate(x).unflatten(-1, (self.num_heads, self.head_dim)))

    def norm_and_out(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``o_proj(o_norm(o, gate))`` over ``o`` and the output gate ``[B, T, H, D]``. On the GPU, where o_norm's
        class is in :data:`~laquant.models.quantizing_rowwise.GATED_NORMS` (KDA's sigmoid-gated norm, float32
        throughout), laquant's gated norm kernel computes it in one launch where transformers' takes about ten,
        writing o_proj's codes too where o_proj is W8A8."""
        B, T = o.shape[:2]
        norm = self.o_norm
        return gated_norm_and_out(self, "o_proj", norm, o, gate, lambda: self.o_proj(norm(o, gate).reshape(B, T, -1)))


class BailingKDAMixer(KimiDeltaAttentionMixer):
    """transformers' ``BailingHybridDeltaAttention`` (Ling / Ring hybrids): Kimi Delta Attention with
    a full-rank forget gate ``forget_gate.f_proj`` (the gate role), ``A_log`` per head, and with
    ``safe_gate`` (the default) the bounded decay ``lower_bound * sigmoid(exp(A_log) (logits +
    dt_bias))`` instead of ``-exp(A_log) softplus(logits + dt_bias)``; a full-rank output gate ``g_proj``."""

    MODULES = ("q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "g_proj", "o_norm", "o_proj")
    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj", "o_proj")
    GATE = "forget_gate.f_proj"

    GATE_ATTRS = ("f_proj", "A_log", "dt_bias", "safe_gate", "lower_bound")
    OUT_GATE = "g_proj"

    def log_decay(self, logits: torch.Tensor) -> torch.Tensor:
        gate = self.forget_gate
        x = (logits.float() + gate.dt_bias.float()).unflatten(-1, (self.num_heads, self.head_dim))
        rate = gate.A_log.float().exp().reshape(self.num_heads, 1)
        if gate.safe_gate:
            return gate.lower_bound * torch.sigmoid(rate * x)
        return -rate * F.softplus(x)

    def forget_log_decay(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_decay(self.forget_gate.f_proj(x))

    def output_gate(self, x: torch.Tensor) -> torch.Tensor:
        return self.g_proj(x)
