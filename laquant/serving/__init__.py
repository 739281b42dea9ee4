"""Serving the quantized state: the prefix state cache (:mod:`.prefix_cache`) and the replay of a
multi-turn chat workload that ``laquant eval serve`` times (:mod:`.replay`)."""

from laquant.serving.prefix_cache import Hit, PrefixStateCache, Snapshot, check_model

__all__ = ["Hit", "PrefixStateCache", "Snapshot", "check_model"]
