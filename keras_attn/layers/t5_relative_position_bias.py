import math

import keras
from keras import ops

from keras_attn.layers.attention_mask import query_key_positions
from keras_attn.layers.validation import check_positive_int


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucketing of relative positions (Raffel et al., 2020, §2.1).

    `relative_position = key_position - query_position`. Half of the buckets hold the
    exact small distances `0 .. num_buckets/2 - 1`; the other half cover distances up to
    `max_distance` in logarithmically growing ranges, and every larger distance shares
    the last bucket:

        n < max_exact:  bucket = n
        otherwise:      bucket = min(max_exact + floor(log(n / max_exact)
                                     / log(max_distance / max_exact)
                                     * (num_buckets - max_exact)), num_buckets - 1)

    with `max_exact = num_buckets // 2`. When `bidirectional`, the buckets are first split
    in two halves, the upper half for keys after the query (`relative_position > 0`) and
    `n = |relative_position|`; otherwise (causal decoders) keys after the query all fall in
    bucket 0 and `n = max(-relative_position, 0)`. This is `_relative_position_bucket` of
    Mesh TensorFlow / T5, with the logarithm taken in float32 like the reference.

    Args:
        relative_position: int tensor of any shape.
        bidirectional: bool, whether keys after the query get their own buckets.
        num_buckets: int, number of buckets.
        max_distance: int, distances at or beyond it share the last bucket.

    Returns:
        int32 tensor of bucket indices in `[0, num_buckets)`, shaped like the input.

    Example:
    >>> rel = keras.ops.arange(-3, 4)
    >>> keras.ops.convert_to_numpy(relative_position_bucket(rel, True, 8, 16))
    array([2, 2, 1, 0, 5, 6, 6], dtype=int32)
    """
    n = -ops.cast(relative_position, "int32")  # query minus key: > 0 for past keys
    bucket = ops.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + ops.cast(ops.less(n, 0), "int32") * num_buckets
        n = ops.abs(n)
    else:
        n = ops.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = ops.less(n, max_exact)
    # Clamping below at max_exact keeps log() finite where the value is not used anyway.
    ratio = ops.cast(ops.maximum(n, max_exact), "float32") / max_exact
    large = max_exact + ops.cast(
        ops.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact),
        "int32",
    )
    large = ops.minimum(large, num_buckets - 1)
    return bucket + ops.where(is_small, n, large)


@keras.saving.register_keras_serializable(package="keras_attn")
class T5RelativePositionBias(keras.layers.Layer):
    """Learned, bucketed relative position bias of T5 (Raffel et al., 2020, §2.1).

    Each head `h` adds a learned scalar, indexed by the bucket of the query-key offset,
    to its attention scores:

        B[h, i, j] = w[bucket(j - pos_i), h]

    with `bucket` = `relative_position_bucket` (exact buckets for small offsets,
    logarithmic ones up to `max_distance`) and `pos_i = query_start_index + i`. T5 shares
    one such table across all layers of a stack and does not scale the scores by
    `1/sqrt(d_k)` (it folds that into the initialisation); here the bias is simply added
    to the scaled scores of `MultiHeadAttention(...)(x, attention_bias=bias)`.

    Args:
        num_heads: int, number of attention heads `H`.
        num_buckets: int, number of relative position buckets. Defaults to `32`.
        max_distance: int, offsets at least this large share the last bucket. Defaults to
            `128`.
        bidirectional: bool, separate buckets for keys after the query (encoders);
            `False` for causal decoders. Defaults to `True`.
        embeddings_initializer: initializer of the `(num_buckets, num_heads)` table.
            Defaults to `"glorot_uniform"`, which is T5X's
            `variance_scaling(1.0, "fan_avg", "uniform")` for this table.

    Call arguments:
        query: `(B, T, ...)` tensor; only its length `T` is used.
        key: optional `(B, S, ...)` tensor; only its length `S` is used. Defaults to
            `query`. During cached decoding pass the cache keys `(B, S_max, ...)`.
        query_start_index: optional int or scalar tensor, absolute position of query 0
            among the keys. Defaults to `S - T` (queries aligned with the end of the
            keys, as in `causal_mask`); pass the cache index when decoding.

    Returns:
        `(1, H, T, S)` bias in the layer's compute dtype.

    Example:
    >>> x = keras.ops.zeros((2, 4, 8))
    >>> tuple(T5RelativePositionBias(num_heads=2)(x).shape)
    (1, 2, 4, 4)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_buckets", num_buckets)
        check_positive_int("max_distance", max_distance)
        # Half of the (per direction) buckets are exact; the log buckets need at least one.
        min_buckets = 4 if bidirectional else 2
        if num_buckets < min_buckets:
            raise ValueError(
                f"`num_buckets` must be at least {min_buckets} with "
                f"bidirectional={bidirectional}, so that exact and logarithmic buckets both "
                f"exist. Received: num_buckets={num_buckets}"
            )
        max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if max_distance <= max_exact:
            raise ValueError(
                "`max_distance` must exceed the number of exact buckets "
                f"({max_exact} for num_buckets={num_buckets}, bidirectional={bidirectional}). "
                f"Received: max_distance={max_distance}"
            )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, query_shape, key_shape=None):
        self.relative_attention_bias = self.add_weight(
            name="relative_attention_bias", shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer, trainable=True,
        )
        self.built = True

    def call(self, query, key=None, query_start_index=None):
        key = query if key is None else key
        row, col = query_key_positions(
            ops.shape(query)[1], ops.shape(key)[1], query_start_index
        )  # (T, 1), (1, S) int32
        buckets = relative_position_bucket(
            col - row, self.bidirectional, self.num_buckets, self.max_distance
        )  # (T, S)
        table = ops.cast(self.relative_attention_bias, self.compute_dtype)  # (buckets, H)
        bias = ops.take(table, buckets, axis=0)  # (T, S, H)
        return ops.transpose(bias, (2, 0, 1))[None]  # (1, H, T, S)

    def compute_output_shape(self, query_shape, key_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        return (1, self.num_heads, query_shape[1], key_shape[1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
