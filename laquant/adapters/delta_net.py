"""fla's DeltaNet (``model_type: delta_net``) on laquant's implementation: Gated DeltaNet's roles
without a gate projection or decay parameters (the delta rule without a decay)."""

from __future__ import annotations

import torch.nn as nn

from laquant.adapters.gated_deltanet import GatedDeltaNetAdapter


class DeltaNetAdapter(GatedDeltaNetAdapter):
    model_type = "delta_net"
    DECAY = ()

    @staticmethod
    def mixer_class() -> type[nn.Module]:
        from laquant.models.delta_net import DeltaNet

        return DeltaNet

    def gates(self) -> dict[str, nn.Module]:
        return {}


ADAPTER = DeltaNetAdapter  # read by laquant.families
