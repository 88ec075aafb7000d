import keras
from keras import ops

from keras_attn.layers.attention_mask import and_masks
from keras_attn.layers.attention_mask import merge_attention_masks
from keras_attn.layers.multi_head_attention_cache import KeyValueCacheMixin
from keras_attn.layers.multi_head_attention_keras import KerasSurfaceMixin
from keras_attn.layers.multi_head_attention_keras import _attention_axes
from keras_attn.layers.multi_head_attention_keras import _check_argument
from keras_attn.layers.multi_head_attention_keras import _output_shape
from keras_attn.layers.multi_head_attention_projections import ProjectionsMixin
from keras_attn.layers.multi_head_attention_scores import AttentionScoresMixin
from keras_attn.layers.rotary_embedding import RotaryEmbedding
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate

# Beyond `__init__`, `build`, `call` and `get_config`, the layer is made of mixins, one module
# each: the projections (`multi_head_attention_projections`), the per-head attention with the
# `_compute_attention` hook and its masks (`_scores`), the key/value cache (`_cache`) and
# Keras' surface: its private names, checks, output specs, N-D inputs (`_keras`).


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHeadAttention(
    ProjectionsMixin, AttentionScoresMixin, KeyValueCacheMixin, KerasSurfaceMixin,
    keras.layers.Layer,
):
    """Multi-head attention (Vaswani et al., 2017, §3.2.2).

        head_h = Attention(Q W_h^Q, K W_h^K, V W_h^V)
        Z = concat(head_1, ..., head_H) W^O

    Self-attention when only `query` is given, encoder-decoder (cross) attention when
    `value` (and optionally `key`) come from the encoder. All mask sources (Keras masks,
    `padding_mask`, `attention_mask`, causal, sliding window) are merged by
    `merge_attention_masks`; additive biases (T5 buckets, ALiBi) go in `attention_bias`.

    The weights use the layout of `keras.layers.MultiHeadAttention` (`query`, `key`,
    `gate` with `use_gate`, `value`, `attention_output` sublayers, kernels
    `(d_model, H, d_k)` and `(H, d_v, *output_shape)`, whatever the inputs' rank), so
    `set_weights(keras_mha.get_weights())` copies one into the other. With
    `fused_qkv=True` a single `(d_model, 3, H, d_k)` kernel projects Q, K and V in one
    matmul for self-attention (faster on CPU); cross-attention slices it.

    Incremental decoding uses a key/value cache that is a plain tensor in and out of
    `call` (so it survives `tf.function`, SavedModel and TFLite export): shape
    `(B, 2, S_max, H, d_k)`, `[:, 0]` keys and `[:, 1]` values.

    A drop-in for `keras.layers.MultiHeadAttention` (Keras 3.15): every constructor and
    call argument of Keras' layer, in Keras' order, with Keras' numbers, and Keras' private
    surface that subclasses and Keras itself use (`_query_dense`, `_key_dense`,
    `_value_dense`, `_output_dense`, `_gate_dense` sublayers, `_sliding_window` and the
    other settings under Keras' private names, `_build_attention`, `_masked_softmax`,
    `_compute_attention`): Keras' own test file for the layer passes on this one
    (`tests/test_multi_head_attention_keras_suite.py`). Deliberate differences:

    - A query that may see no key gets a zero attention output (the layer then outputs
      the output bias) and zero probabilities; Keras averages all values. For Keras'
      numbers leave one key visible on such rows.
    - `_compute_attention` always receives `(B, T, H, d)` tensors: with several
      `attention_axes` the inputs are folded to one sequence axis first (the other axes
      join the batch; see `AxesFolding`), so causal and sliding-window masks and Keras
      masks count positions row-major over the attention axes.

    Override hook: subclasses change how per-head scores are formed by overriding
    `_compute_attention`, with Keras' signature (see `RelativeMultiHeadAttention`,
    `ShawRelativeAttention`); `call` passes our extras (`attention_bias`,
    `query_start_index`) only when they are set.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each query/key head `d_k`.
        value_dim: int, size of each value head `d_v`. Defaults to `key_dim`.
        dropout: float, attention-probability dropout rate. Defaults to `0.0`.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        output_shape: int or tuple of ints, the output's shape after the batch and
            query axes. Defaults to the query's last dim.
        attention_axes: int or tuple of ints, the axes attention runs over. Defaults to
            every axis but the batch and feature ones (the sequence axis of rank-3 inputs).
        sliding_window: optional int `w`; query `i` only sees keys with `|i - j| < w`
            (local attention). Combined with a causal mask: the `w` latest keys.
        flash_attention: optional bool; `True` runs the backend's fused attention kernel
            (`keras.ops.dot_product_attention(flash_attention=True)`), which then fails
            where the backend has none, as Keras does. `None` follows
            `keras.config.enable_flash_attention()`. Excludes `dropout` and attention
            scores.
        kernel_initializer: initializer for the projection kernels.
        bias_initializer: initializer for the projection biases.
        kernel_regularizer: optional regularizer for the projection kernels.
        bias_regularizer: optional regularizer for the projection biases.
        activity_regularizer: optional regularizer applied to each projection's output
            (query, key, value, gate and output), as Keras does.
        kernel_constraint: optional constraint for the projection kernels.
        bias_constraint: optional constraint for the projection biases.
        use_gate: bool, gated attention (Qiu et al., 2025, "Gated Attention for Large
            Language Models"): the heads are multiplied by `sigmoid(query W_g + b_g)`
            (the `gate` sublayer, `(d_query, H, d_v)`) before the output projection.
        seed: optional int seed for the dropout.
        output_dim: int, our earlier name for an int `output_shape`.
        fused_qkv: bool, one fused Q/K/V kernel instead of three. Requires
            `value_dim == key_dim` and equal query/value feature sizes.
        rotary_max_wavelength: optional float; when set, rotary position embeddings
            (RoPE, Su et al., 2021) rotate queries and keys with this base wavelength.

    Call arguments:
        query: `(B, T, d_query)`, or `(B, <axes...>, d_query)` with `attention_axes`.
        value: optional `(B, S, d_value)`; defaults to `query` (self-attention).
        key: optional `(B, S, d_key)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional `(B, T)` / `(B, S)` masks of padded
            positions. Keras fills them (and `mask`) from the implicit masks of the
            inputs (`Embedding(mask_zero=True)`, `Masking`).
        padding_mask: optional `(B, S)`, True/1 for real keys, False/0 for padding.
        attention_mask: optional boolean `(B, T, S)` (or `(T, S)`), or per head
            `(B, H, T, S)`; True where query `t` may see key `s`. With `attention_axes`,
            Keras' layout `(B, <other axes>, [H,] <query axes>, <key axes>)`.
        attention_bias: optional float broadcastable to `(B, H, T, S)`, added to scores.
        use_causal_mask: bool, forbid attending to later positions.
        cache: optional `(B, 2, S_max, H, d_k)` key/value cache.
        cache_update_index: int or scalar tensor. With a cache: the position the new
            keys/values are written at (self-attention decoding). `None` with a cache means
            "the cache holds precomputed encoder keys/values" (cross-attention decoding).
        return_attention_scores: bool, also return the probabilities `(B, H, T, S)`
            (Keras' `(B, <other axes>, H, <query axes>, <key axes>)` with
            `attention_axes`).
        training: bool, enables dropout.

    Returns:
        `(B, T, *output_shape)` tensor; with `return_attention_scores` a tuple
        `(output, scores)`; with a cache, the updated cache is appended to the tuple.

    Example:
    >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.ops.ones((1, 3, 8))
    >>> tuple(mha(x, use_causal_mask=True).shape)
    (1, 3, 8)
    """

    # Without a cache, query `i` sits at key position `i` (Keras); subclasses whose keys are
    # `[memory; segment]` set this to put the queries last (`S - T + i`).
    _queries_end_aligned = False

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        output_dim=None,
        fused_qkv=False,
        rotary_max_wavelength=None,
        **kwargs,
    ):
        for name, size in (("num_heads", num_heads), ("key_dim", key_dim),
                           ("value_dim", value_dim)):
            if size is not None or name != "value_dim":
                _check_argument(name, size)
        check_rate("dropout", dropout)
        output_shape = _output_shape(output_shape, output_dim)
        attention_axes = _attention_axes(attention_axes)
        if fused_qkv and value_dim is not None and value_dim != key_dim:
            raise ValueError(
                "`fused_qkv=True` projects Q, K and V with one kernel, so `value_dim` must "
                f"equal `key_dim`. Received: key_dim={key_dim}, value_dim={value_dim}"
            )
        if sliding_window is not None:
            check_positive_int("sliding_window", sliding_window)
        if rotary_max_wavelength is not None and key_dim % 2:
            raise ValueError(
                "Rotary embeddings rotate pairs of features, so `key_dim` must be even. "
                f"Received: key_dim={key_dim}"
            )
        # As Keras: `None` (or False) defers to `keras.config.enable_flash_attention()`.
        use_flash = bool(flash_attention or keras.config.is_flash_attention_enabled())
        if use_flash and dropout > 0.0:
            raise ValueError(
                "Dropout is not supported when flash attention is enabled: flash attention "
                "has no attention dropout, set `dropout=0.0` or `flash_attention=False`. "
                f"Received: dropout={dropout}, flash_attention=True"
            )
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        # Not `self.output_shape`: Keras models read that name on their layers.
        self._output_shape = output_shape
        self.attention_axes = attention_axes
        self.sliding_window = sliding_window
        self.flash_attention = flash_attention
        self._use_flash_attention = use_flash
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        # Applied to each projection's output, as Keras does; not `self.activity_regularizer`,
        # which Keras' `Layer.__call__` would apply to this layer's outputs as well.
        self._activity_regularizer = keras.regularizers.get(activity_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.use_gate = use_gate
        self.seed = seed
        self.fused_qkv = fused_qkv
        self.rotary_max_wavelength = rotary_max_wavelength
        self.supports_masking = True

    @property
    def output_dim(self):
        """The output size when `output_shape` is one int (our older name), else `None`."""
        shape = self._output_shape
        return shape[0] if shape is not None and len(shape) == 1 else None

    # === Build ===

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, value_shape, key_shape)
        query_dim, value_dim, key_dim = query_shape[-1], value_shape[-1], key_shape[-1]
        H, dk, dv = self.num_heads, self.key_dim, self.value_dim
        # Every input is folded to (batch, length, features) before the projections (see
        # `AxesFolding`), so they are built for rank 3 whatever the inputs' rank.
        if self.fused_qkv:
            self._build_fused(query_shape, value_shape, key_shape)
        else:
            self._query_dense = self._projection("query", (H, dk), query_dim)
            self._key_dense = self._projection("key", (H, dk), key_dim)
        if self.use_gate:
            # Gated attention (Qiu et al., 2025): output heads * sigmoid(query W_g + b_g).
            self._gate_dense = self._projection("gate", (H, dv), query_dim, "sigmoid")
        if not self.fused_qkv:
            self._value_dense = self._projection("value", (H, dv), value_dim)
        out_shape = self._output_shape or (query_dim,)
        out = "efgh"[: len(out_shape)]
        self._output_dense = keras.layers.EinsumDense(
            f"abcd,cd{out}->ab{out}", output_shape=(None, *out_shape),
            bias_axes=out if self.use_bias else None, name="attention_output",
            **self._dense_kwargs(),
        )
        self._output_dense.build((None, None, H, dv))
        self._build_attention(4)  # `_compute_attention` sees (B, T, H, d) tensors
        self.rotary_embedding = (
            RotaryEmbedding(
                max_wavelength=self.rotary_max_wavelength, dtype=self.dtype_policy,
                name="rotary_embedding",
            )
            if self.rotary_max_wavelength is not None else None
        )
        self.built = True

    # === Call ===

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        mask=None,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        # Keras fills `mask` (one tensor argument) or `<arg>_mask` (several) from the
        # implicit masks of the inputs; both mean "padded query positions".
        query_mask = mask if query_mask is None else query_mask
        self_attention = value is None or value is query
        if self_attention and value_mask is None and cache is None:
            value_mask = query_mask  # Keras only fills `query_mask` when `value` is omitted.
        if query_mask is not None or value_mask is not None or key_mask is not None:
            # The masks are consumed here; fresh tensors keep the projection sublayers from
            # warning that they would drop them.
            query = ops.copy(query)
            value = query if self_attention else ops.copy(value)
            key = None if key is None else ops.copy(key)
        value = query if value is None else value
        key = value if key is None else key
        axes = self._check_call(
            query, value, key, attention_mask, attention_bias, cache, return_attention_scores
        )
        cross_cache = cache is not None and cache_update_index is None
        key_padding = [padding_mask, key_mask, None if cross_cache else value_mask]  # (B, S)
        if len(query.shape) == 3 and axes == (1,):
            output, scores, cache = self._attend(
                query, value, key, query_mask, key_padding, attention_mask, attention_bias,
                use_causal_mask, cache, cache_update_index, training, return_attention_scores,
            )
        else:
            output, scores = self._attend_over_axes(
                axes, query, value, key, query_mask, key_padding, attention_mask,
                use_causal_mask, training, return_attention_scores,
            )
        result = (output,)
        if return_attention_scores:
            result += (scores,)
        if cache is not None:
            result += (cache,)
        return result[0] if len(result) == 1 else result

    def _attend(
        self, query, value, key, query_mask, key_padding, attention_mask, attention_bias,
        use_causal_mask, cache, cache_update_index, training, return_attention_scores,
    ):
        """Attention on rank-3 inputs; returns `(output, scores, cache)`."""
        self_attention = value is query
        cross_cache = cache is not None and cache_update_index is None
        start = cache_update_index if cache is not None else None

        # === Project (B, T, H, dk), (B, S, H, dk), (B, S, H, dv) ===
        q, k, v = self._project(query, key, value, self_attention, skip_kv=cross_cache)
        if self.rotary_embedding is not None:
            rope_start = 0 if start is None else start
            q = self.rotary_embedding(q, start_index=rope_start)
            if not cross_cache:
                k = self.rotary_embedding(k, start_index=rope_start)

        # === Cache: write this step's keys/values, then attend over the whole cache ===
        if cache is not None:
            k, v, cache, key_padding = self._attend_cache(
                q, k, v, cache, cache_update_index, key_padding
            )  # (B, S_enc or S_max, H, dk)

        # === Mask (B, T, S), or (B, H, T, S) for a per-head attention_mask ===
        mask = merge_attention_masks(
            ops.shape(q)[1], ops.shape(k)[1],
            query_mask=query_mask, key_mask=and_masks(*key_padding),
            attention_mask=attention_mask, use_causal_mask=use_causal_mask,
            sliding_window=self.sliding_window, query_start_index=self._mask_start(start),
        )

        # === Attend, gate and merge heads ===
        # Keras' positional call; our extras only when set, so Keras-style overrides (which
        # take neither) keep working.
        extras = {name: value for name, value in (
            ("attention_bias", attention_bias), ("query_start_index", start)
        ) if value is not None}
        output, scores = self._compute_attention(
            q, k, v, mask, training, return_attention_scores, **extras
        )  # (B, T, H, dv), (B, H, T, S)
        if self.use_gate:
            output = output * self.gate_dense(query)  # (B, T, H, dv)
        output = self.output_dense(output)  # (B, T, *output_shape)
        return output, scores, cache

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_shape=self._output_shape,
            attention_axes=self.attention_axes,
            sliding_window=self.sliding_window,
            flash_attention=self.flash_attention,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer),
            activity_regularizer=keras.regularizers.serialize(self._activity_regularizer),
            kernel_constraint=keras.constraints.serialize(self.kernel_constraint),
            bias_constraint=keras.constraints.serialize(self.bias_constraint),
            use_gate=self.use_gate,
            seed=self.seed,
            fused_qkv=self.fused_qkv,
            rotary_max_wavelength=self.rotary_max_wavelength,
        )
        return config
