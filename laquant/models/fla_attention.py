"""fla's softmax-attention layers in its linear-attention models (``config.attn``), on PyTorch.

fla's GLA config may name layers that run standard attention instead of GLA: ``attn`` is a dict
(or a list of dicts) with ``layers`` and ``num_heads``, and optionally ``num_kv_heads``,
``qkv_bias``, ``window_size`` (each query sees its last ``window_size`` keys, itself included) and
``rope_theta``. fla's ``Attention`` (fla/layers/attn.py) projects q, k, v (GQA), applies rotary
embeddings (GPT-NeoX halves, base ``rope_theta``) and runs causal flash attention with scale
``head_dim ** -0.5``; this runs the same on ``scaled_dot_product_attention``, the keys and values
of earlier calls kept in the model's :class:`~laquant.models.cache.GLAStateCache`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from laquant.quant.fused import project

INPUTS = ("q_proj", "k_proj", "v_proj")
_DEFAULTS = {"num_kv_heads": None, "qkv_bias": False, "window_size": None, "rope_theta": 10000.0}


def refuse_unsupported(model_type: str, config, bad: list[str]) -> None:
    """One ValueError naming every option in ``bad`` and a malformed ``config.attn`` (fla's native
    delta-rule models' config checks), or nothing."""
    try:
        attention_specs(config.attn, config.num_hidden_layers)
    except ValueError as exc:
        bad = [*bad, f"attn: {exc}"]
    if bad:
        raise ValueError(f"this {model_type} config uses options laquant does not implement: " + ", ".join(bad))


def attention_specs(attn, num_hidden_layers: int) -> list[dict]:
    """``config.attn`` as a list of specs with fla's defaults filled in (ValueError naming what is wrong)."""
    if attn is None:
        return []
    specs = [attn] if isinstance(attn, dict) else attn
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ValueError(f"attn must be None, a dict or a list of dicts; got {attn!r}")
    out, seen = [], set()
    for spec in specs:
        missing = [k for k in ("layers", "num_heads") if k not in spec]
        if missing:
            raise ValueError(f"attn specification {spec!r} lacks {', '.join(missing)}")
        spec = {**_DEFAULTS, **spec}
        spec["num_kv_heads"] = spec["num_kv_heads"] or spec["num_heads"]
        for layer in spec["layers"]:
            if not (isinstance(layer, int) and 0 <= layer < num_hidden_layers) or layer in seen:
                raise ValueError(f"attn layers must be distinct indices in [0, {num_hidden_layers}); got "
                                 f"{spec['layers']!r}")
            seen.add(layer)
        out.append(spec)
    return out


def attention_spec(config, layer_idx: int) -> dict | None:
    """The attention spec of layer ``layer_idx``, or None where the layer is the model's own mixer."""
    return next((s for s in attention_specs(config.attn, config.num_hidden_layers) if layer_idx in s["layers"]), None)


def rotate(x: torch.Tensor, start: int | torch.Tensor, base: float) -> torch.Tensor:
    """fla's rotary embedding over ``x [B, T, H, D]`` at positions ``start ..`` (an int, or a device tensor ``[1]``:
    a static cache's position): the two halves of each head rotated by ``pos * base ** (-2i / D)``, the angles in
    float32."""
    D = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    if isinstance(start, torch.Tensor):
        pos = (start + torch.arange(x.shape[1], device=x.device)).to(torch.float32)
    else:
        pos = torch.arange(start, start + x.shape[1], device=x.device, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)
    cos, sin = freqs.cos().to(x.dtype)[:, None], freqs.sin().to(x.dtype)[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    """fla's ``Attention`` with the parameter names of its checkpoints (q/k/v/o_proj)."""

    def __init__(self, hidden_size: int, spec: dict, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = spec["num_heads"], spec["num_kv_heads"]
        if hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"attn: num_heads {self.num_heads} must divide hidden_size {hidden_size} and be a "
                             f"multiple of num_kv_heads {self.num_kv_heads}")
        self.head_dim = hidden_size // self.num_heads
        self.window_size, self.rope_theta = spec["window_size"], float(spec["rope_theta"])
        self.inputs = INPUTS
        kv_dim = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=spec["qkv_bias"])
        self.k_proj = nn.Linear(hidden_size, kv_dim, bias=spec["qkv_bias"])
        self.v_proj = nn.Linear(hidden_size, kv_dim, bias=spec["qkv_bias"])
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cache=None, codes=None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in project(self, INPUTS, x, codes))
        if cache is not None and self.layer_idx in cache.static_kv:
            return self.o_proj(self._static_step(q, k, v, cache.kv_pos, cache.static_kv[self.layer_idx]))
        past = cache.kv.get(self.layer_idx) if cache is not None else None
        start = past[0].shape[1] if past is not None else 0
        q, k = rotate(q, start, self.rope_theta), rotate(k, start, self.rope_theta)
        if past is not None:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        if cache is not None:
            cache.update_kv(self.layer_idx, k, v, T)
        S = k.shape[1]
        # query i (absolute position start + i) sees keys j <= start + i, and within the window
        qpos = torch.arange(start, start + T, device=x.device)[:, None]
        kpos = torch.arange(S, device=x.device)[None]
        allowed = kpos <= qpos
        if self.window_size is not None:
            allowed &= kpos > qpos - self.window_size
        groups = self.num_heads // self.num_kv_heads
        k, v = (t.repeat_interleave(groups, dim=2) for t in (k, v))
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=allowed, scale=1.0 / math.sqrt(self.head_dim))
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))

    def _static_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     buffers) -> torch.Tensor:
        """One token on a static cache (a CUDA-graphed decode step): its key and value written at the device-side
        position ``pos`` of the buffers ``[B, H, capacity, D]``, the attention over the positions up to it (and
        within the window) with the query heads grouped by their key head
        (:func:`~laquant.models.static_hybrid.static_decode_attention`: laquant's decode attention kernel on the
        GPU); ``[B, 1, H * D]``."""
        from laquant.models.static_hybrid import static_decode_attention

        B, T = q.shape[:2]
        if T != 1:
            raise ValueError(f"a static cache's attn layers take one token a step; got {T}")
        q, k = rotate(q, pos, self.rope_theta), rotate(k, pos, self.rope_theta)
        keys, values = buffers
        keys.index_copy_(2, pos, k.transpose(1, 2))
        values.index_copy_(2, pos, v.transpose(1, 2))
        kpos = torch.arange(keys.shape[2], device=q.device)
        allowed = kpos <= pos
        if self.window_size is not None:
            allowed &= kpos > pos - self.window_size
        mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed,
                                                                                         torch.finfo(q.dtype).min)
        o, _ = static_decode_attention(self, q.transpose(1, 2), keys, values, mask.view(1, 1, 1, -1),
                                       scaling=1.0 / math.sqrt(self.head_dim))
        return o.reshape(B, T, -1)
