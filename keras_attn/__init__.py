"""keras-attn: Keras 3 attention layers and Transformer models, from layers to a phone.

`keras_attn.layers` and `keras_attn.models` run on any Keras backend. `keras_attn.text`
(tensorflow-text, tf.data) and `keras_attn.checkpoints` are imported on demand.
"""

from keras_attn import console_startup

# Our command line only (`keras-attn`, `python -m keras_attn...`): TensorFlow's start-up
# log quieted before Keras imports it. A program that imports keras_attn is left alone.
if console_startup.started_as_our_command():
    console_startup.quiet_tensorflow_startup()

from keras_attn import generation  # noqa: E402
from keras_attn import layers  # noqa: E402
from keras_attn import models  # noqa: E402
from keras_attn.version import __version__  # noqa: E402

__all__ = ["generation", "layers", "models", "__version__"]
