import math

import keras
from keras import ops

from keras_attn.layers.attention_mask import query_key_positions
from keras_attn.layers.validation import check_positive_int


def alibi_slopes(num_heads):
    """The head slopes of ALiBi (Press et al., 2022, §3), as Python floats.

    For `H` a power of two the slopes form the geometric sequence

        m_h = 2^(-8h / H),   h = 1 .. H

    (`1/2, 1/4, ..., 1/256` for `H = 8`). For other `H`, with `P` the largest power of two
    below `H`: the `P` slopes of `P` heads, then the odd-numbered slopes
    `2^(-8h / 2P)`, `h = 1, 3, 5, ...`, of `2P` heads, as many as needed. These
    interleave between the first ones, as in the paper's released `get_slopes`.

    Example:
    >>> alibi_slopes(4)
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * h / closest) for h in range(1, closest + 1)]
    extra = [2.0 ** (-8.0 * h / (2 * closest)) for h in range(1, 2 * closest + 1, 2)]
    return slopes + extra[: num_heads - closest]


@keras.saving.register_keras_serializable(package="keras_attn")
class AlibiBias(keras.layers.Layer):
    """Attention with Linear Biases, ALiBi (Press et al., 2022, "Train Short, Test Long").

    No position is added to the embeddings; instead each head `h` penalises attention
    scores linearly with the query-key distance:

        softmax(q_i K^T / sqrt(d_k) + B_h)   with   B_h[i, j] = -m_h * |pos_i - j|

    where `m_h` are fixed head slopes (`alibi_slopes`: `2^(-8h/H)` for `H` a power of two)
    and `pos_i = query_start_index + i` is the absolute position of query `i` among the
    keys. Under a causal mask `|pos_i - j| = pos_i - j`, the paper's bias; the absolute
    value makes the bias also usable without a causal mask (bidirectional). The layer
    returns the bias; pass it as
    `MultiHeadAttention(...)(x, attention_bias=bias, use_causal_mask=True)`.

    Args:
        num_heads: int, number of attention heads `H`.

    Call arguments:
        query: `(B, T, ...)` tensor; only its length `T` is used.
        key: optional `(B, S, ...)` tensor; only its length `S` is used. Defaults to
            `query`. During cached decoding pass the cache keys `(B, S_max, ...)`.
        query_start_index: optional int or scalar tensor, absolute position of query 0
            among the keys. Defaults to `S - T` (queries aligned with the end of the
            keys, as in `causal_mask`); pass the cache index when decoding.

    Returns:
        `(1, H, T, S)` bias in the layer's compute dtype, computed in float32.

    Example:
    >>> x = keras.ops.zeros((2, 4, 8))
    >>> tuple(AlibiBias(num_heads=2)(x).shape)
    (1, 2, 4, 4)
    """

    def __init__(self, num_heads, **kwargs):
        check_positive_int("num_heads", num_heads)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.built = True

    def call(self, query, key=None, query_start_index=None):
        key = query if key is None else key
        row, col = query_key_positions(
            ops.shape(query)[1], ops.shape(key)[1], query_start_index
        )  # (T, 1), (1, S) int32
        # Negating the integer distance (not the float product) avoids -0.0 on the diagonal.
        neg_distance = ops.cast(-ops.abs(row - col), "float32")  # (T, S)
        slopes = ops.convert_to_tensor(alibi_slopes(self.num_heads), dtype="float32")  # (H,)
        bias = slopes[:, None, None] * neg_distance[None]  # (H, T, S)
        return ops.cast(bias[None], self.compute_dtype)  # (1, H, T, S)

    def compute_output_shape(self, query_shape, key_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        return (1, self.num_heads, query_shape[1], key_shape[1])

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads)
        return config
