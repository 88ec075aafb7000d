"""`QuantizedReversibleEmbedding`: `keras.layers.ReversibleEmbedding` (a token table that is
also the output projection) with its table fake-quantized to int8 as the int8 TFLite file
stores it, for the lookup and for the logits."""

import keras
from keras import ops

from keras_attn.layers.quantized_dense import fake_quantize_weight
from keras_attn.layers.quantized_dense import frozen_bound


@keras.saving.register_keras_serializable(package="keras_attn")
class QuantizedReversibleEmbedding(keras.layers.ReversibleEmbedding):
    """Embedding lookup and tied output projection for quantization-aware training (Jacob
    et al., 2018; weight tying: Press & Wolf, 2017):

        lookup:  y = take(E_q, ids),      E_q = s round(E / s),  s = max|E| / 127
        reverse: logits = h R_q,          R = E^T (tied) or the reverse table (untied)

    Both directions read the table rounded per tensor and symmetrically (zero point 0): the
    one int8 scale of TFLite's GATHER, and the weights of the FULLY_CONNECTED that computes
    the logits. Gradients pass the rounding unchanged (straight-through estimator).
    `quantize_model` makes it of a `ReversibleEmbedding` and puts an `ActivationQuantizer`
    on each of its outputs (the gathered rows, the logits).

    Args:
        input_dim: int, the number of rows (vocabulary size).
        output_dim: int, the row size.
        **kwargs: the other `keras.layers.ReversibleEmbedding` arguments (`tie_weights`,
            `reverse_dtype`, `name`, ...). `logit_soft_cap`, LoRA and Keras' own
            `quantize()` modes are not supported.

    Call arguments:
        inputs: integer ids, or with `reverse=True` the hidden states `(..., output_dim)`.
        reverse: bool, compute the logits instead of the lookup.

    Returns:
        `inputs.shape + (output_dim,)` rows, or `(..., input_dim)` logits.

    Example:
    >>> layer = QuantizedReversibleEmbedding(10, 4)
    >>> rows = layer(np.array([[1, 2, 3]]))
    >>> tuple(layer(rows, reverse=True).shape)
    (1, 3, 10)
    >>> step = float(np.abs(layer.embeddings.numpy()).max()) / 127
    >>> bool(np.allclose(rows / step, np.round(rows / step), atol=1e-3))
    True
    """

    def __init__(self, input_dim, output_dim, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        if self.lora_rank or self.logit_soft_cap is not None:
            raise ValueError(
                "QuantizedReversibleEmbedding takes neither LoRA nor `logit_soft_cap` (the "
                "int8 file has no soft cap of the logits). Received: "
                f"lora_rank={self.lora_rank}, logit_soft_cap={self.logit_soft_cap}")
        self.frozen_bounds = None  # `max|E|`, `max|R|` as constants (export), or each call

    def call(self, inputs, reverse=False):
        if not reverse:
            if inputs.dtype not in ("int32", "int64"):
                inputs = ops.cast(inputs, "int32")
            bound = self.frozen_bounds[0] if self.frozen_bounds else None
            table = fake_quantize_weight(self.embeddings, bound=bound)  # (V, D)
            return ops.cast(ops.take(table, inputs, axis=0), self.compute_dtype)  # (..., D)
        bound = self.frozen_bounds[1] if self.frozen_bounds else None
        kernel = fake_quantize_weight(self._reverse_kernel(), bound=bound)  # (D, V)
        if self.reverse_dtype is not None:
            inputs = ops.cast(inputs, self.reverse_dtype)
            kernel = ops.cast(kernel, self.reverse_dtype)
        return ops.matmul(inputs, kernel)  # (..., V)

    def _reverse_kernel(self):
        return (ops.transpose(self.embeddings) if self.tie_weights
                else self.reverse_embeddings)  # (D, V)

    def freeze_weight_ranges(self, frozen=True):
        """The tables' bounds as constants of the traced graph (export) or computed again."""
        self.frozen_bounds = ((frozen_bound(self.embeddings),
                               frozen_bound(self._reverse_kernel())) if frozen else None)
