"""Serving the quantized state: the prefix state cache (:mod:`.prefix_cache`), the replay of a
multi-turn chat workload that ``laquant eval serve`` times (:mod:`.replay`) and the loss change of
resuming from a snapshot (:mod:`.accuracy`). Its report is :mod:`laquant.eval.serve`."""

from laquant.serving.prefix_cache import Hit, PrefixStateCache, Snapshot, check_model

__all__ = ["Hit", "PrefixStateCache", "Snapshot", "check_model"]
