import keras
from keras import ops

from keras_attn.layers.validation import check_number_above


def sinusoidal_table(length, dim, max_wavelength=10000, start_index=0):
    """The sinusoid table of Vaswani et al. (2017, §3.5), sin and cos interleaved.

        PE(pos, 2i)   = sin(pos / max_wavelength^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / max_wavelength^(2i / d_model))

    Sines sit on the even feature indices and cosines on the odd ones (not one half of
    sines followed by one half of cosines). Columns `2i` and `2i+1` share the frequency
    of pair `i`; with an odd `dim` the last column is the sine of a pair without cosine.

    Args:
        length: int or scalar tensor, number of positions `T`.
        dim: int, the feature size `d_model`.
        max_wavelength: float, the 10000 above. Defaults to `10000`.
        start_index: int or scalar tensor, position of the first row. Defaults to `0`.

    Returns:
        float32 tensor of shape `(length, dim)`; row `t` encodes position
        `start_index + t`.

    Example:
    >>> table = sinusoidal_table(3, 4)
    >>> keras.ops.convert_to_numpy(table)[1].round(4)  # sin(1), cos(1), sin(.01), cos(.01)
    array([0.8415, 0.5403, 0.01  , 1.    ], dtype=float32)
    """
    columns = ops.arange(dim, dtype="int32")  # (d,)
    pair = ops.cast(columns // 2, "float32")  # (d,) the `i` of column 2i and 2i+1
    inv_freq = ops.power(float(max_wavelength), -2.0 * pair / float(dim))  # (d,)
    positions = ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")  # (T,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, d)
    is_even = ops.equal(columns % 2, 0)[None, :]  # (1, d)
    # Taking sin or cos of the same angle (rather than sin(angle + pi/2)) keeps odd columns
    # exact for large positions.
    return ops.where(is_even, ops.sin(angles), ops.cos(angles))  # (T, d)


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding (Vaswani et al., 2017, "Attention Is All You
    Need", §3.5).

        PE(pos, 2i)   = sin(pos / max_wavelength^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / max_wavelength^(2i / d_model))

    Sines on even features, cosines on odd features, interleaved. For `d_model = 4`
    the encoding of position `pos` is `[sin(pos), cos(pos), sin(pos/100), cos(pos/100)]`.
    The layer returns the encodings only; the caller adds them to the embeddings
    (`x + SinusoidalPositionEncoding()(x)`), so it can also scale the embeddings first.

    Args:
        max_wavelength: float > 1, the 10000 above. Defaults to `10000`.

    Call arguments:
        inputs: `(B, T, d_model)` tensor; only its shape is used.
        start_index: int or scalar tensor, position of the first token (incremental
            decoding: the number of tokens already decoded). Defaults to `0`.

    Returns:
        `(B, T, d_model)` tensor of encodings in the layer's compute dtype (the same row for
        every batch element), computed in float32.

    Example:
    >>> x = keras.ops.zeros((2, 5, 8))
    >>> tuple(SinusoidalPositionEncoding()(x).shape)
    (2, 5, 8)
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        check_number_above("max_wavelength", max_wavelength, 1, "the base of the wavelengths")
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        # Encodings are aligned with the input positions, so the input mask still applies.
        self.supports_masking = True
        self.built = True

    def call(self, inputs, start_index=0):
        dim = inputs.shape[-1]
        if dim is None:
            raise ValueError(
                "SinusoidalPositionEncoding needs a known feature size (the last axis of "
                f"`inputs`). Received: inputs.shape={tuple(inputs.shape)}"
            )
        shape = ops.shape(inputs)
        table = sinusoidal_table(
            shape[1], dim, self.max_wavelength, start_index
        )  # (T, d) float32
        table = ops.cast(table, self.compute_dtype)
        return ops.broadcast_to(table[None], (shape[0], shape[1], dim))  # (B, T, d)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength)
        return config
