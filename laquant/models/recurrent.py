"""What every laquant linear-attention mixer shares: its recurrent state, stored in the recipe's format.

A mixer keeps its state between calls in a state store (:func:`state_store` of the cache it is
given) as a :class:`StoredState`, in the format of its ``state_quantizer`` (fp32 until a recipe sets
one). :meth:`RecurrentMixer.attend_gla` runs gated linear attention (GLA, Lightning, Mamba2's SSD
are all of this form) on the Triton kernels on CUDA and the PyTorch references elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels import chunk_gla, recurrent_gla_step
from laquant.kernels.dispatch import use_triton
from laquant.models.cache import StoredState
from laquant.quant.state import StateQuantizer


class RecurrentMixer(nn.Module):
    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.state_quantizer = StateQuantizer("fp32")  # how the state is stored between steps/chunks

    @property
    def state_roundtrip(self):
        """The storage round trip applied inside a chunked prefill (None for fp32: nothing to model)."""
        sq = self.state_quantizer
        return sq.roundtrip if sq.format.name != "fp32" else None

    def load_state(self, stored: StoredState | None) -> torch.Tensor | None:
        return None if stored is None else self.state_quantizer.load(stored.data, stored.scale)

    def store_state(self, states, stored: StoredState | None, state: torch.Tensor, new_tokens: int) -> None:
        n_stores = stored.n_stores + 1 if stored is not None else 1
        data, scale = self.state_quantizer.store(state, stored.scale if stored is not None else None, n_stores)
        states.update(self.layer_idx, StoredState(data, scale, n_stores), new_tokens)

    def attend_gla(self, q, k, v, g, states, scale: float | None = None) -> torch.Tensor:
        """Gated linear attention over ``q, k [B, T, H, K]``, ``v [B, T, H, V]`` and the log-decay
        ``g`` (``[B, T, H, K]`` per channel or ``[B, T, H]`` per head), continuing the state held in
        ``states`` (None: no cache) and storing the new one there."""
        stored = states.get(self.layer_idx) if states is not None else None
        if use_triton(q, self.state_quantizer.format.name):
            return self._attend_triton(q, k, v, g, states, stored, scale)
        B, T, H, K = q.shape
        if g.dim() == 3:
            g = g.unsqueeze(-1).expand(B, T, H, K)
        state = self.load_state(stored)
        if T == 1 and states is not None:
            if state is None:
                state = q.new_zeros(B, H, K, v.shape[-1], dtype=torch.float32)
            o, state = recurrent_gla_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state, scale)
            o = o.unsqueeze(1)
        else:
            o, state = chunk_gla(q, k, v, g, scale=scale, initial_state=state, output_final_state=states is not None,
                                 state_roundtrip=self.state_roundtrip)
        if states is not None:
            self.store_state(states, stored, state, T)
        return o

    def _attend_triton(self, q, k, v, g, states, stored, scale):
        """The same on laquant's Triton kernels: decode updates the stored state in place (the
        store is the kernel's state pool), prefill runs chunked."""
        from laquant.kernels.gla_chunk_triton import PrefillStates, chunk_gla_triton
        from laquant.kernels.gla_decode_triton import gla_decode_step

        B, T, H, K = q.shape
        sq = self.state_quantizer
        if T == 1 and stored is not None:
            g1 = g[:, 0] if g.dim() == 4 else g[:, 0].unsqueeze(-1).expand(B, H, K)
            row_scale = stored.scale.squeeze(-1) if stored.scale is not None else None
            n_stores = torch.full((B,), stored.n_stores, dtype=torch.int32, device=q.device)
            pool_idx = torch.arange(B, dtype=torch.int32, device=q.device)
            o = gla_decode_step(q[:, 0], k[:, 0], v[:, 0], g1, stored.data, row_scale, pool_idx, sq, n_stores,
                                qk_scale=scale)
            states.update(self.layer_idx, StoredState(stored.data, stored.scale, stored.n_stores + 1), 1)
            return o.unsqueeze(1)
        initial = None
        if stored is not None:
            initial = PrefillStates(stored.data, stored.scale.squeeze(-1) if stored.scale is not None else None,
                                    sq.format.name)
        roundtrip = sq if sq.format.name != "fp32" else None
        o, final, _ = chunk_gla_triton(q, k, v, g, scale=scale, initial_state=initial,
                                       output_final_state=states is not None, roundtrip=roundtrip)
        if states is not None:
            self.store_state(states, stored, final.data, T)
        return o
