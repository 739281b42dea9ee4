"""What every laquant linear-attention mixer shares: its recurrent state, stored in the recipe's format.

A mixer keeps its state between calls in a state store (:func:`state_store` of the cache it is
given) as a :class:`~laquant.kernels.common.state.State`, in the format of its ``state_quantizer``
(fp32 until a recipe sets one); the same container is the prefill kernels' initial and final
state and the decode kernels' state pool. :meth:`RecurrentMixer.attend_gla` runs gated linear
attention (GLA, Lightning, Mamba2's SSD are all of this form) and :meth:`RecurrentMixer.attend_delta`
the gated delta rule (Gated DeltaNet; Kimi Delta Attention with a per-channel decay), each on the
Triton kernels on CUDA and the PyTorch references elsewhere.
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from laquant.kernels import (chunk_gated_delta_rule, chunk_gla, chunk_kda, recurrent_gated_delta_rule,
                             recurrent_gla_step, recurrent_kda)
from laquant.kernels.common.dispatch import use_triton
from laquant.kernels.common.state import State, StateQuantizer
from laquant.kernels.common.store import store_state_triton
from laquant.quant.modules import Float32Buffers


# a decode step on the kernels applies a mixer's gated output norm in its own launch (OutputNorm);
# LAQUANT_FUSED_OUTPUT_NORM=0 (read at import) runs the norm's own kernel after it instead, for comparisons.
# With the next GEMM's codes, from this many sequences: the 1.37B GLA's graphed step (H200) took it +2.7% faster at
# B = 64 and 0.6% slower at B = 1, where the token's last head reads its row back for the codes after the others
# (eval/results/output_norm_h200/); without codes the norm is in the launch at every batch (bf16 +2.4-3.1%)
FUSED_OUTPUT_NORM = os.environ.get("LAQUANT_FUSED_OUTPUT_NORM", "1") != "0"
FUSED_CODES_MIN_BATCH = 16


# A dynamic cache's decode step hands every layer's kernel the same two read-only tensors (slot b is sequence b, each
# stored n times): made once a step, not twice a layer (2 launches a recurrent layer fewer in an eager step).
_EAGER_SLOTS: dict[tuple[int, int, torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
_EAGER_SLOTS_KEPT = 4  # steps of up to this many caches or devices interleaved


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def eager_pool_slots(batch: int, n_stores: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pool_idx, n_stores)`` int32 ``[batch]`` for a dynamic cache's decode step: ``arange(batch)`` and ``n_stores``
    everywhere. Kept for the next layers of the step. Inside a CUDA graph capture neither kept nor taken from what is
    kept: a tensor made there holds its values only in the graph's replays, and a kept one may be let go before them."""
    if _capturing(device):
        return _made_slots(batch, n_stores, device)
    # a tensor freed on one stream may be reused there while another stream still reads it: one entry per stream
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else 0
    key = (batch, n_stores, device, stream)
    slots = _EAGER_SLOTS.get(key)
    if slots is None:
        slots = _made_slots(batch, n_stores, device)
        while len(_EAGER_SLOTS) >= _EAGER_SLOTS_KEPT:
            _EAGER_SLOTS.pop(next(iter(_EAGER_SLOTS)), None)
        _EAGER_SLOTS[key] = slots
    return slots


def _made_slots(batch: int, n_stores: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.arange(batch, dtype=torch.int32, device=device),
            torch.full((batch,), n_stores, dtype=torch.int32, device=device))


class OutputNorm:
    """A mixer's gated output norm handed to :meth:`RecurrentMixer.attend_gla`, which a decode step on the kernels
    runs in its own launch: ``gated_rms_norm(o, z, weight, eps)`` per head (z ``[B, T, H, V]``), with the W8A8
    codes of the next GEMM where ``packed`` is given. ``applied`` says whether it ran (then ``codes`` holds them);
    where it did not, the caller applies the norm to the output as before."""

    __slots__ = ("z", "weight", "eps", "packed", "applied", "codes")

    def __init__(self, z: torch.Tensor, weight: torch.Tensor, eps: float, packed=None):
        self.z, self.weight, self.eps, self.packed = z, weight, eps, packed
        self.applied, self.codes = False, None


class RecurrentMixer(Float32Buffers, nn.Module):
    FLOAT32_BUFFERS = ("state_static_scale",)  # a static-scale state format's calibrated scales (quantize.py)

    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.state_quantizer = StateQuantizer("fp32")  # how the state is stored between calls and steps
        self.prefill_roundtrip = False  # also round it to that format after every chunk of a prefill

    def state_roundtrip(self, states, stored: State | None, batch: int, device):
        """The storage round trip applied inside a chunked prefill (None: the state stays float32
        until the prefill stores its final state); stochastic rounding keys its bits as the
        kernels do (the cache's seed, the batch row, the prefill's store count, the chunk)."""
        if not self.prefill_roundtrip:
            return None
        return self.state_quantizer.chunk_roundtrip(_seed(states), torch.arange(batch, device=device),
                                                    (stored.n_stores if stored is not None else 0) + 1)

    def store_state(self, states, stored: State | None, state: torch.Tensor, new_tokens: int) -> None:
        slots = getattr(stored, "slots", None)
        if slots is not None and not state.is_cuda:
            # a static cache on the CPU reference path: stored in place, keyed by the device counter (a host
            # read, free on the CPU; on CUDA the decode kernels store in place, and a reference store there
            # replaces the state, which tells laquant.generate that no graph can replay the step)
            new = self.state_quantizer.store_state(state, State(stored.data, stored.scale, stored.format,
                                                                int(slots.n_stores[0])), _seed(states))
            stored.data.copy_(new.data)
            if stored.scale is not None:
                stored.scale.copy_(new.scale)
            states.count_static_step(self.layer_idx, new_tokens)
            return
        if use_triton(state, self.state_quantizer.format.name):  # one kernel, not ~165 PyTorch ops and 2 syncs
            new = store_state_triton(self.state_quantizer, state, stored, _seed(states))
        else:
            new = self.state_quantizer.store_state(state, stored, _seed(states))
        states.update(self.layer_idx, new, new_tokens)

    def attend_gla(self, q, k, v, g, states, scale: float | None = None, fp32_dots: str = "ieee",
                   out_norm: OutputNorm | None = None) -> torch.Tensor:
        """Gated linear attention over ``q, k [B, T, H, K]``, ``v [B, T, H, V]`` and the log-decay
        ``g`` (``[B, T, H, K]`` per channel or ``[B, T, H]`` per head), continuing the state held in
        ``states`` (None: no cache) and storing the new one there. ``fp32_dots``: how the prefill kernel
        multiplies float32 inputs (:func:`~laquant.kernels.gla.chunk.chunk_gla_triton`). ``out_norm``: the
        output norm a decode step on the kernels applies in its launch (see :class:`OutputNorm`)."""
        k, g = _mask_padding(k, g, states)
        stored = states.get(self.layer_idx) if states is not None else None
        if getattr(states, "pending", None) is not None:  # speculative decoding's verify step
            from laquant.models.verify import verify_mixer

            g = g if g.dim() == 4 else g.unsqueeze(-1).expand(*q.shape)
            return verify_mixer(self, states, stored, "gla", (q, k, v, g), qk_scale=scale)
        if use_triton(q, self.state_quantizer.format.name):
            return self._attend_triton(q, k, v, g, states, stored, scale, fp32_dots, out_norm)
        B, T, H, K = q.shape
        if g.dim() == 3:
            g = g.unsqueeze(-1).expand(B, T, H, K)
        every = _checkpoint_every(states, T)
        if every:  # the reference of the chunk kernel's checkpoints: the prefill in pieces of ``every`` tokens
            from laquant.kernels.gla.chunk import chunk_gla_reference

            o, final, ckpt = chunk_gla_reference(q, k, v, g, scale, stored, True, roundtrip=self._prefill_roundtrip,
                                                 checkpoint_every=every, seed=_seed(states))
            self._keep_checkpoints(states, stored, ckpt)
            self.store_state(states, stored, final.data, T)
            return o
        state = stored.load() if stored is not None else None
        if T == 1 and states is not None:
            if state is None:
                state = q.new_zeros(B, H, K, v.shape[-1], dtype=torch.float32)
            o, state = recurrent_gla_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], state, scale)
            o = o.unsqueeze(1)
        else:
            o, state = chunk_gla(q, k, v, g, scale=scale, initial_state=state, output_final_state=states is not None,
                                 state_roundtrip=self.state_roundtrip(states, stored, B, q.device))
        if states is not None:
            self.store_state(states, stored, state, T)
        return o

    def attend_delta(self, q, k, v, g, beta, states, use_qk_l2norm: bool = True) -> torch.Tensor:
        """The gated delta rule over ``q, k [B, T, Hk, K]``, ``v [B, T, Hv, V]``, the log-decay ``g``
        (``[B, T, Hv]`` per head, or ``[B, T, Hv, K]`` per key channel: Kimi Delta Attention) and
        ``beta`` ``[B, T, Hv]``, continuing the state held in ``states`` (None: no cache) and
        storing the new one there; Triton kernels on CUDA, the references elsewhere."""
        k, g = _mask_padding(k, g, states)
        stored = states.get(self.layer_idx) if states is not None else None
        if getattr(states, "pending", None) is not None:  # speculative decoding's verify step
            from laquant.models.verify import verify_mixer

            return verify_mixer(self, states, stored, "delta", (q, k, v, g, beta), use_qk_l2norm=use_qk_l2norm)
        T = q.shape[1]
        per_channel = g.dim() == 4
        every = _checkpoint_every(states, T)
        if every:
            return self._attend_delta_pieces(q, k, v, g, beta, states, stored, every, use_qk_l2norm)
        if use_triton(q, self.state_quantizer.format.name):
            from laquant.kernels.delta.chunk import chunk_delta_triton
            from laquant.kernels.delta.decode import delta_decode_step
            from laquant.kernels.kda.chunk import chunk_kda_triton
            from laquant.kernels.kda.decode import kda_decode_step

            if T == 1 and stored is not None:
                decode = kda_decode_step if per_channel else delta_decode_step
                o = decode(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], stored.data, stored.row_scale,
                           *self._pool_slots(stored, q.shape[0], q.device), use_qk_l2norm=use_qk_l2norm,
                           seed=_seed(states), early_state=True)  # the layer's projections or conv precede
                self._count_decode_step(states, stored)
                return o.unsqueeze(1)
            chunk = chunk_kda_triton if per_channel else chunk_delta_triton
            o, final = chunk(q, k, v, g, beta, initial_state=stored, output_final_state=states is not None,
                             roundtrip=self._prefill_roundtrip, use_qk_l2norm=use_qk_l2norm, seed=_seed(states))
            state = final.data if final is not None else None
        else:
            state = stored.load() if stored is not None else None
            if T == 1 and state is not None:
                recurrent = recurrent_kda if per_channel else recurrent_gated_delta_rule
                o, state = recurrent(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                     use_qk_l2norm=use_qk_l2norm)
            else:
                chunk = chunk_kda if per_channel else chunk_gated_delta_rule
                o, state = chunk(q, k, v, g, beta, initial_state=state, output_final_state=states is not None,
                                 use_qk_l2norm=use_qk_l2norm,
                                 state_roundtrip=self.state_roundtrip(states, stored, q.shape[0], q.device))
        if states is not None:
            self.store_state(states, stored, state, T)
        return o

    def _attend_delta_pieces(self, q, k, v, g, beta, states, stored, every: int, use_qk_l2norm: bool):
        """:meth:`attend_delta` with state checkpoints: the delta-rule chunk kernels write none, so the
        prefill runs in pieces of ``every`` tokens (a multiple of their 64-token chunks), the state carried
        between them in float32 as inside one call; the state after each full piece is a checkpoint."""
        if self._prefill_roundtrip is not None:
            raise ValueError("state checkpoints of a delta-rule prefill that rounds its state every 64 tokens "
                             "(prefill_roundtrip) are not implemented: the pieces would key their rounding apart")
        T, per_channel = q.shape[1], g.dim() == 4
        kernels = use_triton(q, self.state_quantizer.format.name)
        if kernels:
            from laquant.kernels.delta.chunk import chunk_delta_triton
            from laquant.kernels.kda.chunk import chunk_kda_triton

            chunk = chunk_kda_triton if per_channel else chunk_delta_triton
        else:
            chunk = chunk_kda if per_channel else chunk_gated_delta_rule
        state, outs, ckpts = stored, [], []
        for a in range(0, T, every):
            piece = [x[:, a:a + every] for x in (q, k, v, g, beta)]
            if kernels:
                start = state if state is None or isinstance(state, State) else State(state, None, "fp32")
                o, final = chunk(*piece, initial_state=start, output_final_state=True, use_qk_l2norm=use_qk_l2norm,
                                 seed=_seed(states))
                state = final.data
            else:
                start = state.load() if isinstance(state, State) else state
                o, state = chunk(*piece, initial_state=start, output_final_state=True, use_qk_l2norm=use_qk_l2norm)
            outs.append(o)
            if piece[0].shape[1] == every:
                ckpts.append(state)
        self._keep_checkpoints(states, stored, State(torch.stack(ckpts, 1), None, "fp32"))
        self.store_state(states, stored, state, T)
        return torch.cat(outs, 1)

    # The Triton path keeps the stored state as the kernels' state pool: a decode step updates it
    # in place, a prefill starts from it as stored.

    def _pool_slots(self, stored: State, batch: int, device):
        """``(pool_idx, quantizer, n_stores)``: the decode kernels' view of a stored batch as a
        pool whose slot ``b`` is sequence ``b``."""
        slots = getattr(stored, "slots", None)
        if slots is not None:  # a static cache's persistent tensors (models.cache.StaticState): graph-replayable
            return slots.pool_idx, self.state_quantizer, slots.n_stores
        pool_idx, n_stores = eager_pool_slots(batch, stored.n_stores, torch.device(device))
        return pool_idx, self.state_quantizer, n_stores

    def _count_decode_step(self, states, stored: State) -> None:
        if getattr(stored, "slots", None) is not None:  # counted on the device, synced after the loop
            states.count_static_step(self.layer_idx)
            return
        states.update(self.layer_idx, State(stored.data, stored.scale, stored.format, stored.n_stores + 1), 1)

    def _keep_checkpoints(self, states, stored: State | None, ckpt: State) -> None:
        from laquant.kernels.common.state_io import store_position

        states.checkpoints.keep_states(self.layer_idx, ckpt.data, self.state_quantizer, _seed(states),
                                       store_position(stored, None))

    @property
    def _prefill_roundtrip(self) -> StateQuantizer | None:
        return None if self.state_quantizer.is_plain_fp32 or not self.prefill_roundtrip else self.state_quantizer

    def _attend_triton(self, q, k, v, g, states, stored, scale, fp32_dots="ieee", out_norm=None):
        from laquant.kernels.gla.chunk import chunk_gla_triton
        from laquant.kernels.gla.decode import gla_decode_step

        B, T, H, K = q.shape
        if T == 1 and stored is not None:
            g1 = g[:, 0] if g.dim() == 4 else g[:, 0].unsqueeze(-1).expand(B, H, K)
            norm = {}
            if (out_norm is not None and FUSED_OUTPUT_NORM and out_norm.z.stride(-1) == 1
                    and (out_norm.packed is None or B >= FUSED_CODES_MIN_BATCH)):
                norm = dict(norm=(out_norm.z[:, 0], out_norm.weight, out_norm.eps), packed=out_norm.packed)
            o = gla_decode_step(q[:, 0], k[:, 0], v[:, 0], g1, stored.data, stored.row_scale,
                                *self._pool_slots(stored, B, q.device), qk_scale=scale, seed=_seed(states),
                                early_state=True, **norm)  # the layer's projections precede
            if norm:
                out_norm.applied = True
                if out_norm.packed is not None:
                    o, out_norm.codes = o
            self._count_decode_step(states, stored)
            return o.unsqueeze(1)
        every = _checkpoint_every(states, T)
        o, final, ckpt = chunk_gla_triton(q, k, v, g, scale=scale, initial_state=stored,
                                          output_final_state=states is not None, roundtrip=self._prefill_roundtrip,
                                          checkpoint_every=every, seed=_seed(states), fp32_dots=fp32_dots)
        if every:
            self._keep_checkpoints(states, stored, ckpt)
        if states is not None:
            self.store_state(states, stored, final.data, T)
        return o


def _mask_padding(k: torch.Tensor, g: torch.Tensor, states):
    """``k`` and the log-decay ``g`` with the positions past each sequence's real tokens zeroed, where
    the cache has a ``token_mask`` ``[B, T]`` (a padded prefill replayed as a CUDA graph,
    :mod:`laquant.serving.graphed_prefill`): no key and no decay, so the state (GLA's and the delta
    rule's alike) passes the padding unchanged."""
    mask = getattr(states, "token_mask", None)
    if mask is None:
        return k, g
    m = mask[:, :, None]
    return k * m[..., None].to(k.dtype), g * (m if g.dim() == 3 else m[..., None]).to(g.dtype)


def _checkpoint_every(states, T: int) -> int:
    """Tokens between the state snapshots a prefill of ``T`` tokens is asked for (0: none)."""
    request = getattr(states, "checkpoints", None)
    return request.every if request is not None and T >= request.every else 0


def _seed(states) -> int:
    """The stochastic rounding's seed: the state cache's (0 without a cache, or one that has none)."""
    return getattr(states, "seed", 0)
