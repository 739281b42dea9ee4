"""Model implementations laquant runs itself (CPU path, quantized path)."""

from transformers import AutoConfig, AutoModelForCausalLM

from laquant.models.cache import GLAStateCache
from laquant.models.delta_net import DeltaNetConfig, DeltaNetForCausalLM
from laquant.models.gated_deltanet import GatedDeltaNetConfig, GatedDeltaNetForCausalLM
from laquant.models.gla import GLAConfig, GLAForCausalLM, GLAModel

# Register fla's model types unless another implementation (fla's) is already registered: with fla
# imported, transformers' Auto classes give fla's GPU model, and laquant.load still gives ours.
for _type, _config, _model in (("gla", GLAConfig, GLAForCausalLM),
                               ("gated_deltanet", GatedDeltaNetConfig, GatedDeltaNetForCausalLM),
                               ("delta_net", DeltaNetConfig, DeltaNetForCausalLM)):
    try:
        AutoConfig.register(_type, _config)
        AutoModelForCausalLM.register(_config, _model)
    except ValueError:
        pass

__all__ = ["DeltaNetConfig", "DeltaNetForCausalLM", "GLAConfig", "GLAForCausalLM", "GLAModel", "GLAStateCache",
           "GatedDeltaNetConfig", "GatedDeltaNetForCausalLM"]
