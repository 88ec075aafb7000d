"""`MultiHeadAttention`'s Keras surface: Keras' private names, checks, output specs, N-D inputs."""

import math

import keras

from keras_attn.layers.attention_axes import AxesFolding
from keras_attn.layers.attention_axes import normalize_attention_axes
from keras_attn.layers.multi_head_attention_scores import _FLASH_SCORES_ERROR
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_same_sizes


class KerasSurfaceMixin:
    """What `MultiHeadAttention` shares with `keras.layers.MultiHeadAttention` around the
    attention itself (a mixin of the layer): the sublayers and settings under Keras'
    names, the input checks in Keras' words, `compute_output_shape`/`_spec`/`_mask`, and
    inputs of several `attention_axes`.
    """

    # === Keras' names ===
    # Keras' layer keeps its sublayers and settings under private names, which Keras-style
    # subclasses, `quantize`, dtype-policy maps and Keras' tests use; ours are public. `.keras`
    # files keep the public paths (Keras' saving visits public attributes first).

    @property
    def query_dense(self):
        """The query projection `W^Q` (`EinsumDense`, kernel `(d_query, H, d_k)`)."""
        return self._query_dense

    @property
    def key_dense(self):
        """The key projection `W^K` (`EinsumDense`, kernel `(d_key, H, d_k)`)."""
        return self._key_dense

    @property
    def value_dense(self):
        """The value projection `W^V` (`EinsumDense`, kernel `(d_value, H, d_v)`)."""
        return self._value_dense

    @property
    def gate_dense(self):
        """The gate projection of `use_gate=True` (`EinsumDense`, sigmoid activation)."""
        return self._gate_dense

    @property
    def output_dense(self):
        """The output projection `W^O` (`EinsumDense`, kernel `(H, d_v, *output_shape)`)."""
        return self._output_dense

    @property
    def dropout_layer(self):
        """The attention-probability `Dropout`."""
        return self._dropout_layer

    _num_heads = property(lambda self: self.num_heads)
    _key_dim = property(lambda self: self.key_dim)
    _value_dim = property(lambda self: self.value_dim)
    _dropout = property(lambda self: self.dropout)
    _use_bias = property(lambda self: self.use_bias)
    _use_gate = property(lambda self: self.use_gate)
    _sliding_window = property(lambda self: self.sliding_window)
    _kernel_initializer = property(lambda self: self.kernel_initializer)
    _bias_initializer = property(lambda self: self.bias_initializer)
    _kernel_regularizer = property(lambda self: self.kernel_regularizer)
    _bias_regularizer = property(lambda self: self.bias_regularizer)
    _kernel_constraint = property(lambda self: self.kernel_constraint)
    _bias_constraint = property(lambda self: self.bias_constraint)
    _flash_attention = property(lambda self: self._use_flash_attention)
    _inverse_sqrt_key_dim = property(lambda self: 1.0 / math.sqrt(self.key_dim))
    # The attention axis of the `(B, T, H, d)` tensors `_compute_attention` receives.
    _attention_axes = property(lambda self: (1,))

    # === Checks and shapes ===

    def _check_input_shapes(self, query_shape, value_shape, key_shape, query_only=False):
        """Raises a ValueError for inputs that cannot go together; returns the attention axes.

        `query_only`: with a key/value cache, which replaces `value` and `key`.
        """
        query_shape = tuple(query_shape)
        value_shape = query_shape if query_only else tuple(value_shape)
        key_shape = query_shape if query_only else tuple(key_shape)
        rank = len(query_shape)
        if rank < 3 or len(value_shape) != rank or len(key_shape) != rank:
            raise ValueError(
                "`query`, `value` and `key` must have the same rank (the ranks must be equal), "
                "at least 3: (batch, <positions...>, features). Received: "
                f"query.shape={query_shape}, value.shape={value_shape}, key.shape={key_shape}"
            )
        check_same_sizes("key", key_shape, "value", value_shape, range(rank - 1),
                         "one key per value position: all dimensions of `value` and `key`, "
                         "except the last one, must be equal")
        axes = normalize_attention_axes(self.attention_axes, rank)
        others = [0] + [a for a in range(1, rank - 1) if a not in axes]
        check_same_sizes(
            "query", query_shape, "value", value_shape, others,
            f"the axes outside attention_axes={axes} pair each query with its keys",
        )
        if self.built:
            checked = zip(
                ("query", "value", "key"), (query_shape, value_shape, key_shape),
                self._built_feature_sizes(),
            )
            for name, shape, size in list(checked)[: 1 if query_only else 3]:
                if shape[-1] is not None and shape[-1] != size:
                    raise ValueError(
                        f"`{name}` has {shape[-1]} features but this layer was built for "
                        f"{size} (its `{name}` projection kernel has {size} rows). "
                        f"Received: {name}.shape={shape}"
                    )
        return axes

    def _built_feature_sizes(self):
        if self.fused_qkv:
            return (self.qkv_kernel.shape[0],) * 3
        return tuple(
            layer.kernel.shape[0] for layer in (self.query_dense, self.value_dense, self.key_dense)
        )

    def _check_call(
        self, query, value, key, attention_mask, attention_bias, cache, return_attention_scores
    ):
        """All call-time checks, before any computation; returns the attention axes."""
        axes = self._check_input_shapes(
            query.shape, value.shape, key.shape, query_only=cache is not None
        )
        if self._use_flash_attention and return_attention_scores:
            raise ValueError(_FLASH_SCORES_ERROR)
        if len(query.shape) != 3 or axes != (1,):
            for name, given in (("cache", cache), ("attention_bias", attention_bias),
                                ("rotary_max_wavelength", self.rotary_max_wavelength)):
                if given is not None:
                    raise ValueError(
                        f"`{name}` needs one sequence axis: rank-3 inputs with the default "
                        f"`attention_axes`. Received: query.shape={tuple(query.shape)}, "
                        f"attention_axes={self.attention_axes}"
                    )
            return axes
        if cache is not None:
            self._check_cache(cache)
        if attention_mask is not None and len(attention_mask.shape) in (3, 4):
            key_length = key.shape[1] if cache is None else cache.shape[2]
            expected = (query.shape[1], key_length)
            for size, want in zip(attention_mask.shape[-2:], expected):
                if None not in (size, want) and size not in (1, want):
                    raise ValueError(
                        "`attention_mask` must be (batch, query_length, key_length) = "
                        f"(batch, {expected[0]}, {expected[1]}) or per head (batch, "
                        f"num_heads, {expected[0]}, {expected[1]}). "
                        f"Received: attention_mask.shape={tuple(attention_mask.shape)}"
                    )
        return axes

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_input_shapes(query_shape, value_shape, key_shape)
        return tuple(query_shape[:-1]) + (self._output_shape or (query_shape[-1],))

    def compute_output_spec(
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
        value = query if value is None else value
        key = value if key is None else key
        axes = self._check_call(
            query, value, key, attention_mask, attention_bias, cache, return_attention_scores
        )
        output_shape = tuple(query.shape[:-1]) + (self._output_shape or (query.shape[-1],))
        result = (keras.KerasTensor(output_shape, dtype=self.compute_dtype),)
        if return_attention_scores:
            others = [query.shape[a] for a in range(len(query.shape) - 1) if a not in axes]
            key_sizes = [key.shape[a] for a in axes] if cache is None else [cache.shape[2]]
            scores_shape = (*others, self.num_heads, *[query.shape[a] for a in axes], *key_sizes)
            result += (keras.KerasTensor(scores_shape, dtype=self.compute_dtype),)
        if cache is not None:
            result += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return result[0] if len(result) == 1 else result

    def compute_mask(self, query, previous_mask=None):
        # Keras calls `compute_mask(first_input, its_mask)`: outputs are per query.
        return previous_mask

    # === Several attention axes ===

    def _attend_over_axes(
        self, axes, query, value, key, query_mask, key_padding, attention_mask,
        use_causal_mask, training, return_attention_scores,
    ):
        """Attention over `axes` of N-D inputs: fold to rank 3, attend, unfold."""
        folding = AxesFolding(len(query.shape), axes)
        query_lead, key_lead = folding.lead_shape(query), folding.lead_shape(key)
        folded_query = folding.fold(query)  # (B', T, d_query)
        folded_value = folded_query if value is query else folding.fold(value)  # (B', S, d)
        folded_key = folded_value if key is value else folding.fold(key)  # (B', S, d)
        if query_mask is not None:
            query_mask = folding.fold(query_mask, feature_axes=0)  # (B', T)
        key_padding = [None if m is None else folding.fold(m, feature_axes=0)
                       for m in key_padding]  # (B', S)
        if attention_mask is not None:
            attention_mask = folding.fold_attention_mask(
                attention_mask, query_lead, key_lead, self.num_heads
            )  # (B', T, S) or (B', H, T, S)
        output, scores, _ = self._attend(
            folded_query, folded_value, folded_key, query_mask, key_padding, attention_mask,
            None, use_causal_mask, None, None, training, return_attention_scores,
        )  # (B', T, *output_shape), (B', H, T, S)
        output = folding.unfold(output, query_lead)  # (B, *query dims, *output_shape)
        if scores is not None:
            scores = folding.unfold_scores(scores, query_lead, key_lead, self.num_heads)
        return output, scores


# === Constructor arguments, as Keras takes them ===


def _check_argument(name, size):
    """`check_positive_int` in Keras' words ("invalid value for argument `num_heads`")."""
    try:
        check_positive_int(name, size)
    except ValueError as error:
        raise ValueError(f"Received an invalid value for argument `{name}`: {error}") from None


def _output_shape(output_shape, output_dim):
    """`output_shape` (Keras: int, tuple or list) merged with its alias `output_dim`."""
    if isinstance(output_shape, int) and not isinstance(output_shape, bool):
        output_shape = (output_shape,)
    if output_shape is not None and not isinstance(output_shape, (list, tuple)):
        raise ValueError(
            "Invalid `output_shape`: it must be an int, a tuple or a list of ints. "
            f"Received: output_shape={output_shape!r}"
        )
    output_shape = tuple(output_shape) if output_shape else None  # () means the default
    for size in output_shape or ():
        check_positive_int("output_shape", size, "each output axis size")
    if output_dim is not None:
        check_positive_int("output_dim", output_dim)
        if output_shape not in (None, (output_dim,)):
            raise ValueError(
                "`output_dim` is another name for an int `output_shape`; give one of them. "
                f"Received: output_shape={output_shape}, output_dim={output_dim}"
            )
        output_shape = (output_dim,)
    return output_shape


def _attention_axes(attention_axes):
    """`attention_axes` as Keras takes it (None, an int, a tuple or list of ints) as a tuple."""
    if attention_axes is None:
        return None
    axes = (attention_axes,) if isinstance(attention_axes, int) else attention_axes
    if (
        not isinstance(axes, (list, tuple)) or not axes
        or any(isinstance(a, bool) or not isinstance(a, int) for a in axes)
    ):
        raise ValueError(
            "`attention_axes` must be None, an int or a non-empty tuple or list of ints. "
            f"Received: attention_axes={attention_axes!r}"
        )
    return tuple(axes)
