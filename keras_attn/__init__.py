"""keras-attn: Keras 3 attention layers and Transformer models, from layers to a phone."""

from keras_attn import layers
from keras_attn.version import __version__

__all__ = ["layers", "__version__"]
