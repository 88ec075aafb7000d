import keras
from keras import ops

from keras_attn.layers.validation import check_number_above


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding, RoPE (Su et al., 2021, "RoFormer", §3.4).

    Each pair of features is rotated by an angle proportional to the position:

        theta_i = scaling_factor^-1 * max_wavelength^(-2i/d),   i = 0 .. d/2 - 1
        [x'_i, x'_{i+d/2}] = [x_i cos(m theta_i) - x_{i+d/2} sin(m theta_i),
                              x_i sin(m theta_i) + x_{i+d/2} cos(m theta_i)]

    so that `<RoPE(q, m), RoPE(k, n)>` depends on `q`, `k` and `m - n` only: a relative
    position encoding applied to queries and keys. Feature `i` is paired with `i + d/2`
    (the GPT-NeoX / LLaMA layout); the paper pairs `2i` with `2i+1`. The two are the same
    model up to a fixed permutation of the W^Q and W^K output columns.

    Args:
        max_wavelength: float, the base (10000 in the paper). Defaults to `10000`.
        scaling_factor: float >= 1, linear position interpolation (positions are divided
            by it to stretch the trained context). Defaults to `1.0`.

    Call arguments:
        inputs: `(B, T, ..., d)` tensor, sequence on axis 1 and an even feature size `d`
            (typically per-head queries or keys `(B, T, H, d)`).
        start_index: int or scalar tensor, position of the first element (decoding).

    Returns:
        Tensor of the shape and dtype of `inputs`.

    Example:
    >>> q = keras.ops.ones((1, 4, 2, 8))
    >>> tuple(RotaryEmbedding()(q, start_index=3).shape)
    (1, 4, 2, 8)
    """

    def __init__(self, max_wavelength=10000, scaling_factor=1.0, **kwargs):
        check_number_above("max_wavelength", max_wavelength, 1, "the base of the wavelengths")
        if scaling_factor < 1.0:
            raise ValueError(
                f"`scaling_factor` must be >= 1. Received: scaling_factor={scaling_factor}"
            )
        super().__init__(**kwargs)
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.built = True

    def call(self, inputs, start_index=0):
        dim = inputs.shape[-1]
        if dim is None or dim % 2:
            raise ValueError(
                "RotaryEmbedding rotates pairs of features, so the last dimension must be "
                f"even. Received: inputs.shape={tuple(inputs.shape)}"
            )
        # Angles in float32 whatever the compute dtype: positions * frequencies loses
        # whole radians in bfloat16 after a few hundred positions.
        half = dim // 2
        inv_freq = 1.0 / ops.power(
            float(self.max_wavelength), ops.arange(half, dtype="float32") * 2.0 / dim
        )  # (d/2,)
        positions = ops.arange(ops.shape(inputs)[1], dtype="float32") + ops.cast(
            start_index, "float32"
        )  # (T,)
        angles = ops.einsum("t,f->tf", positions / self.scaling_factor, inv_freq)  # (T, d/2)
        shape = (1, -1) + (1,) * (len(inputs.shape) - 3) + (half,)
        cos = ops.reshape(ops.cos(angles), shape)  # (1, T, 1.., d/2)
        sin = ops.reshape(ops.sin(angles), shape)

        x = ops.cast(inputs, "float32")
        x1, x2 = x[..., :half], x[..., half:]
        rotated = ops.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
        return ops.cast(rotated, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_wavelength=self.max_wavelength, scaling_factor=self.scaling_factor)
        return config
