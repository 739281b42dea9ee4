"""What every laquant linear-attention mixer shares: its recurrent state, stored in the recipe's format.

A mixer keeps its state between calls in a state store (:func:`state_store` of the cache it is
given) as a :class:`StoredState`, in the format of its ``state_quantizer`` (fp32 until a recipe sets
one). :meth:`RecurrentMixer.attend_gla` runs gated linear attention (GLA, Lightning, Mamba2's SSD
are all of this form) and :meth:`RecurrentMixer.attend_delta` the gated delta rule (Gated
DeltaNet), each on the Triton kernels on CUDA and the PyTorch references elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from laquant.kernels import chunk_gated_delta_rule, chunk_gla, recurrent_gated_delta_rule, recurrent_gla_step
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

    def attend_delta(self, q, k, v, g, beta, states, use_qk_l2norm: bool = True) -> torch.Tensor:
        """The gated delta rule over ``q, k [B, T, Hk, K]``, ``v [B, T, Hv, V]``, the log-decay ``g``
        and ``beta`` ``[B, T, Hv]``, continuing the state held in ``states`` (None: no cache) and
        storing the new one there; Triton kernels on CUDA, the references elsewhere."""
        stored = states.get(self.layer_idx) if states is not None else None
        T = q.shape[1]
        if use_triton(q, self.state_quantizer.format.name):
            from laquant.kernels.delta_chunk_triton import chunk_delta_triton
            from laquant.kernels.delta_decode_triton import delta_decode_step

            if T == 1 and stored is not None:
                data, row_scale, pool_idx, n_stores = self._decode_pool(stored, q.shape[0], q.device)
                o = delta_decode_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], data, row_scale, pool_idx,
                                      self.state_quantizer, n_stores, use_qk_l2norm=use_qk_l2norm)
                self._count_decode_step(states, stored)
                return o.unsqueeze(1)
            o, final = chunk_delta_triton(q, k, v, g, beta, initial_state=self._prefill_initial(stored),
                                          output_final_state=states is not None, roundtrip=self._prefill_roundtrip,
                                          use_qk_l2norm=use_qk_l2norm)
            state = final.data if final is not None else None
        else:
            state = self.load_state(stored)
            if T == 1 and state is not None:
                o, state = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                      use_qk_l2norm=use_qk_l2norm)
            else:
                o, state = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                                  output_final_state=states is not None, use_qk_l2norm=use_qk_l2norm,
                                                  state_roundtrip=self.state_roundtrip)
        if states is not None:
            self.store_state(states, stored, state, T)
        return o

    # The Triton path keeps the stored state as the kernels' state pool: a decode step updates it
    # in place, a prefill starts from it as stored.

    @staticmethod
    def _decode_pool(stored: StoredState, batch: int, device):
        """``(data, row scales, pool_idx, n_stores)``: the stored state as a decode kernel's pool."""
        row_scale = stored.scale.squeeze(-1) if stored.scale is not None else None
        n_stores = torch.full((batch,), stored.n_stores, dtype=torch.int32, device=device)
        return stored.data, row_scale, torch.arange(batch, dtype=torch.int32, device=device), n_stores

    def _count_decode_step(self, states, stored: StoredState) -> None:
        states.update(self.layer_idx, StoredState(stored.data, stored.scale, stored.n_stores + 1), 1)

    def _prefill_initial(self, stored: StoredState | None):
        from laquant.kernels.gla_chunk_triton import PrefillStates

        if stored is None:
            return None
        return PrefillStates(stored.data, stored.scale.squeeze(-1) if stored.scale is not None else None,
                             self.state_quantizer.format.name)

    @property
    def _prefill_roundtrip(self) -> StateQuantizer | None:
        return self.state_quantizer if self.state_quantizer.format.name != "fp32" else None

    def _attend_triton(self, q, k, v, g, states, stored, scale):
        from laquant.kernels.gla_chunk_triton import chunk_gla_triton
        from laquant.kernels.gla_decode_triton import gla_decode_step

        B, T, H, K = q.shape
        if T == 1 and stored is not None:
            g1 = g[:, 0] if g.dim() == 4 else g[:, 0].unsqueeze(-1).expand(B, H, K)
            data, row_scale, pool_idx, n_stores = self._decode_pool(stored, B, q.device)
            o = gla_decode_step(q[:, 0], k[:, 0], v[:, 0], g1, data, row_scale, pool_idx, self.state_quantizer,
                                n_stores, qk_scale=scale)
            self._count_decode_step(states, stored)
            return o.unsqueeze(1)
        o, final, _ = chunk_gla_triton(q, k, v, g, scale=scale, initial_state=self._prefill_initial(stored),
                                       output_final_state=states is not None, roundtrip=self._prefill_roundtrip)
        if states is not None:
            self.store_state(states, stored, final.data, T)
        return o
