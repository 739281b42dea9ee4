"""Serving the quantized state: the prefix state cache (:mod:`.prefix_cache`; where each kind of
model keeps a snapshot's parts: :mod:`.model_state`; a hit's short prefill replayed as a CUDA graph:
:mod:`.graphed_prefill`), the replay of a
multi-turn chat workload that ``laquant eval serve`` times (:mod:`.replay`), the loss change of
resuming from a snapshot (:mod:`.accuracy`; its report is :mod:`laquant.eval.serve`), and greedy
speculative decoding with a draft model (:mod:`.speculative`)."""

from laquant.serving.prefix_cache import Hit, PrefixStateCache, Snapshot, check_model

__all__ = ["Hit", "PrefixStateCache", "Snapshot", "check_model"]
