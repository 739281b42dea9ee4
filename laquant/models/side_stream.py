"""A decoder layer's gate, captured as a branch of the CUDA graph beside the layer's big projection.

GLA's low-rank ``gk_proj`` and a gated delta rule's ``in_proj_ba`` (with its gate tail) read the same
normed input as the layer's fused q/k/v projection, and nothing reads their output before the
recurrent step. At decode sizes neither launch fills the GPU (a 64-token step's q/k/v GEMM runs ~100
programs on 132 SMs), so in a captured graph the gate runs on a second stream, beside the GEMM
instead of after it. The same kernels run on the same inputs: the outputs are the in-order ones bit
for bit.

Only captures fork: an eager step is host-bound, and a fork costs the host two stream switches and
two event records. ``LAQUANT_SIDE_STREAM=0`` keeps captures in order too.
"""

from __future__ import annotations

import torch

from laquant.kernels.common.env import getenv

_SIDE_STREAMS: dict[tuple[int, int], torch.cuda.Stream] = {}


def forks(x: torch.Tensor) -> bool:
    """Whether work on ``x`` started now by :func:`fork` runs on the side stream: on CUDA, while the
    current stream captures a graph, unless ``LAQUANT_SIDE_STREAM=0``."""
    return (x.is_cuda and getenv("LAQUANT_SIDE_STREAM", "1") != "0"
            and torch.cuda.is_current_stream_capturing())


class Branch:
    """Work started by :func:`fork`; :meth:`join` hands its result to the current stream."""

    def __init__(self, value, main: torch.cuda.Stream | None = None, side: torch.cuda.Stream | None = None):
        self._value, self._main, self._side = value, main, side

    def join(self):
        if self._side is not None:
            self._main.wait_stream(self._side)
            for t in _tensors(self._value):
                # the side stream allocated it: its memory must not be handed out again before the
                # main stream's readers ran (under capture the allocator defers the free to the end)
                t.record_stream(self._main)
            self._side = None
        return self._value


def fork(fn, x: torch.Tensor, *args) -> Branch:
    """``fn(x, *args)`` on the device's side stream after everything queued so far (:func:`forks`),
    else right away. Join the branch before ``x`` can be freed: the side stream reads it."""
    if not forks(x):
        return Branch(fn(x, *args))
    main = torch.cuda.current_stream(x.device)
    # one side stream per capturing stream: the split-K GEMMs' tile counters are per stream, and graphs
    # captured on different streams may replay side by side (a CUDA tensor's device always has its index)
    key = (x.device.index, main.stream_id)
    side = _SIDE_STREAMS.get(key)
    if side is None:
        side = _SIDE_STREAMS[key] = torch.cuda.Stream(x.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        value = fn(x, *args)
    return Branch(value, main, side)


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
