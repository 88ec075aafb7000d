"""`QuantizedEmbedding`: `keras.layers.Embedding` with its table fake-quantized to int8 the way
the int8 TFLite file stores it (one symmetric scale for the whole table)."""

import keras
from keras import ops

from keras_attn.layers.quantized_dense import fake_quantize_weight
from keras_attn.layers.quantized_dense import frozen_bound


@keras.saving.register_keras_serializable(package="keras_attn")
class QuantizedEmbedding(keras.layers.Embedding):
    """Embedding lookup for quantization-aware training (Jacob et al., 2018):

        y = take(E_q, ids),  E_q = s round(E / s),  s = max|E| / 127

    TFLite's int8 GATHER reads an int8 table with one scale and returns rows at that scale,
    so the table is quantized per tensor and symmetrically (zero point 0); the lookup then
    gives exactly the rows the file gathers. Gradients pass the rounding unchanged (the
    straight-through estimator of `fake_quantize_weight`). `quantize_model` puts an
    `ActivationQuantizer` on its output, as on every layer whose output it rounds.

    Args:
        input_dim: int, the number of rows (vocabulary size).
        output_dim: int, the row size.
        **kwargs: the other `keras.layers.Embedding` arguments (`mask_zero`, `name`, ...).
            LoRA and Keras' own `quantize()` modes are not supported.

    Call arguments:
        inputs: integer tensor of ids.

    Returns:
        `inputs.shape + (output_dim,)` float tensor.

    Example:
    >>> layer = QuantizedEmbedding(10, 4)
    >>> rows = layer(np.array([[1, 2, 3]]))
    >>> step = float(np.abs(layer.embeddings.numpy()).max()) / 127
    >>> bool(np.allclose(rows / step, np.round(rows / step), atol=1e-3))
    True
    """

    def __init__(self, input_dim, output_dim, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        if self.lora_rank:
            raise ValueError("QuantizedEmbedding does not take LoRA: merge the LoRA weights "
                             f"first. Received: lora_rank={self.lora_rank}")
        self.frozen_bound = None  # `max|E|` as a constant (export), or computed each call

    def call(self, inputs):
        if inputs.dtype not in ("int32", "int64"):
            inputs = ops.cast(inputs, "int32")
        table = fake_quantize_weight(self.embeddings, bound=self.frozen_bound)  # (V, D)
        return ops.cast(ops.take(table, inputs, axis=0), self.compute_dtype)  # (..., D)

    def freeze_weight_ranges(self, frozen=True):
        """The table's bound as a constant of the traced graph (export) or computed again."""
        self.frozen_bound = frozen_bound(self.embeddings) if frozen else None
