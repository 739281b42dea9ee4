"""Model implementations laquant runs itself (CPU path, quantized path)."""

from transformers import AutoConfig, AutoModelForCausalLM

from laquant.models.cache import GLAStateCache
from laquant.models.gla import GLAConfig, GLAForCausalLM, GLAModel

# Register model_type "gla" unless another implementation (fla's) is already registered: with fla
# imported, transformers' Auto classes give fla's GPU model, and laquant.load still gives ours.
try:
    AutoConfig.register("gla", GLAConfig)
    AutoModelForCausalLM.register(GLAConfig, GLAForCausalLM)
except ValueError:
    pass

__all__ = ["GLAConfig", "GLAForCausalLM", "GLAModel", "GLAStateCache"]
