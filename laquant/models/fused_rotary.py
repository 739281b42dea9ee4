"""transformers' rotary embedding modules with their cos and sin in one launch on the GPU.

A hybrid's text model computes its rotary embedding's cos and sin once a forward, so once a decode step, with ~8
PyTorch launches (:mod:`laquant.kernels.attention.rotary`). :func:`install` gives the text model's rotary embedding,
of a class in :data:`ROTARIES` with the default rope (``rope_type == "default"``: no frequency update between calls),
a forward that runs :func:`~laquant.kernels.attention.rotary.rotary_cos_sin_triton` on the GPU, with the output dtype
its table entry names. The class's first use in a process also runs transformers' forward and compares
(:func:`~laquant.models.first_use.checked_forward`); a class that differs keeps transformers' forward, warned.
Elsewhere (CPU, a rope that updates its frequencies, positions other than ``[B, T]`` integers,
``LAQUANT_FUSED_ROTARY=0``) the module runs transformers' forward. The class changes (its name kept), not its
buffers.
"""

from __future__ import annotations

import torch

from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.env import getenv
from laquant.models.first_use import checked_forward, outputs_agree
from laquant.models.quantizing_rowwise import mix_into

# rotary embedding class -> the dtype of its cos and sin: "input" (x's) or "float32" (OLMo hybrid's). Each computes
# transformers' default formula, rotary_cos_sin (checked on the CPU, tests/test_fused_rotary.py). Qwen3.5's
# interleaved multimodal rope is another formula, not here.
ROTARIES = {
    **{name: "input" for name in (
        "Qwen3NextRotaryEmbedding", "BailingHybridRotaryEmbedding", "MiniMaxRotaryEmbedding", "BambaRotaryEmbedding",
        "GraniteMoeHybridRotaryEmbedding", "FalconH1RotaryEmbedding", "Zamba2RotaryEmbedding")},
    "OlmoHybridRotaryEmbedding": "float32",
}
_CHECKED: dict[type, bool] = {}  # class -> whether the kernel reproduced its forward


def _on_kernel(module, x: torch.Tensor, position_ids) -> bool:
    inv_freq = getattr(module, "inv_freq", None)
    return (use_triton(x) and getenv("LAQUANT_FUSED_ROTARY", "1") != "0"
            and getattr(module, "rope_type", None) == "default" and isinstance(position_ids, torch.Tensor)
            and position_ids.dim() == 2 and not position_ids.is_floating_point() and position_ids.device == x.device
            and isinstance(inv_freq, torch.Tensor) and inv_freq.dim() == 1 and inv_freq.is_floating_point()
            and inv_freq.device == x.device)


def _agree(ours, theirs) -> str | None:
    return outputs_agree(ours[0], theirs[0]) or outputs_agree(ours[1], theirs[1])


class _FusedRotary:
    """Mixed into a rotary embedding's class by :func:`install` (the original class next in the MRO)."""

    def forward(self, x, position_ids):
        if not _on_kernel(self, x, position_ids):
            return super().forward(x, position_ids)
        from laquant.kernels.attention.rotary import rotary_cos_sin_triton

        dtype = x.dtype if ROTARIES[self._laquant_base.__name__] == "input" else torch.float32
        return checked_forward(
            self, x, lambda: rotary_cos_sin_triton(position_ids, self.inv_freq, self.attention_scaling, dtype),
            lambda: super(_FusedRotary, self).forward(x, position_ids), _agree, _CHECKED)


def install(text_model) -> int:
    """Give ``text_model``'s ``rotary_emb``, of a class in :data:`ROTARIES`, the one-launch forward; returns how many
    (0 or 1). Idempotent."""
    return mix_into([getattr(text_model, "rotary_emb", None)], _FusedRotary, ROTARIES)
