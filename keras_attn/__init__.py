"""keras-attn: Keras 3 attention layers and Transformer models, from layers to a phone.

`keras_attn.layers` and `keras_attn.models` run on any Keras backend. `keras_attn.text`
(tensorflow-text, tf.data) and `keras_attn.checkpoints` are imported on demand.
"""

from keras_attn import generation
from keras_attn import layers
from keras_attn import models
from keras_attn.version import __version__

__all__ = ["generation", "layers", "models", "__version__"]
