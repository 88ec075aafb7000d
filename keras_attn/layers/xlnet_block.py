import keras

from keras_attn.layers.transformer_block_base import FeedForwardMixin
from keras_attn.layers.transformer_block_base import get_activation
from keras_attn.layers.transformer_block_base import resolve_key_dim
from keras_attn.layers.transformer_block_base import serialize_activation
from keras_attn.layers.two_stream_relative_attention import TwoStreamRelativeAttention
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.layers.validation import clone_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetBlock(FeedForwardMixin, keras.layers.Layer):
    """One XLNet layer: two-stream relative attention + FFN, post-LN (Yang et al., 2019).

    Both streams go through the same sublayers (one set of weights):

        a_h, a_g = TwoStreamRelativeAttention(h, g, memory)
        h' = LN(h + Dropout(a_h)),   g' = LN(g + Dropout(a_g))
        h'' = LN(h' + Dropout(W_2 Dropout(act(W_1 h' + b_1)) + b_2)),  same for g'

    The caller keeps the memory (this block's *input* `h` of the previous segment, as in
    Transformer-XL).

    Args:
        num_heads: int, attention heads.
        intermediate_dim: int, feed-forward width.
        key_dim: int, size of each head. Defaults to `d_model // num_heads`.
        dropout: float, on attention probabilities, both residual branches and the FFN
            hidden layer. Defaults to `0.0`.
        activation: feed-forward activation. Defaults to `"gelu"` (exact, as XLNet).
        layer_norm_epsilon: float. Defaults to `1e-12` (XLNet's).
        kernel_initializer: initializer of every kernel. Defaults to
            `RandomNormal(stddev=0.02)` (XLNet's).

    Call arguments:
        inputs: `(B, T, d)` content stream.
        query_stream: optional `(B, P, d)` query stream (`P = T` without target mapping).
        memory, attention_mask, segment_ids, target_mapping, training: as in
            `TwoStreamRelativeAttention`.

    Returns:
        `(B, T, d)`, or `(content, query)` with a query stream.

    Example:
    >>> block = XLNetBlock(num_heads=2, intermediate_dim=16)
    >>> h, g = keras.ops.ones((1, 3, 8)), keras.ops.zeros((1, 3, 8))
    >>> content, query = block(h, query_stream=g, memory=keras.ops.ones((1, 2, 8)))
    >>> tuple(content.shape), tuple(query.shape)
    ((1, 3, 8), (1, 3, 8))
    """

    def __init__(self, num_heads, intermediate_dim, key_dim=None, dropout=0.0,
                 activation="gelu", layer_norm_epsilon=1e-12,
                 kernel_initializer=None, **kwargs):
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.activation = get_activation(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.RandomNormal(stddev=0.02))

    # === Build ===

    def build(self, inputs_shape):
        key_dim = resolve_key_dim(inputs_shape[-1], self.num_heads, self.key_dim)
        self.attention = TwoStreamRelativeAttention(
            num_heads=self.num_heads, key_dim=key_dim, dropout=self.dropout,
            use_bias=False, name="attention", **self._sublayer_kwargs(),
        )
        self.attention.build(inputs_shape)
        self.attention_layer_norm = self._layer_norm("attention_layer_norm")
        self.attention_layer_norm.build(inputs_shape)
        self.attention_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="attention_dropout")
        self.feedforward_hidden_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="feedforward_hidden_dropout")
        self._build_feedforward(inputs_shape)
        self.built = True

    def _sublayer_kwargs(self):
        return dict(kernel_initializer=clone_initializer(self.kernel_initializer),
                    dtype=self.dtype_policy)

    # === Call ===

    def call(self, inputs, query_stream=None, memory=None, attention_mask=None,
             segment_ids=None, target_mapping=None, training=None):
        attended = self.attention(
            inputs, query_stream=query_stream, memory=memory, attention_mask=attention_mask,
            segment_ids=segment_ids, target_mapping=target_mapping, training=training,
        )  # (B, T, d) or ((B, T, d), (B, P, d))
        if query_stream is None:
            return self._finish(inputs, attended, training)
        content, query = attended
        return (self._finish(inputs, content, training),
                self._finish(query_stream, query, training))

    def _finish(self, x, attended, training):
        """Residual + LN after attention, then the feed-forward sublayer."""
        x = self.attention_layer_norm(
            x + self.attention_dropout(attended, training=training))  # (B, T, d)
        residual = x
        h = self.activation(self.feedforward_intermediate_dense(x))  # (B, T, d_ff)
        h = self.feedforward_hidden_dropout(h, training=training)
        h = self.feedforward_output_dense(h)  # (B, T, d)
        return self.feedforward_layer_norm(
            residual + self.feedforward_dropout(h, training=training))

    def compute_output_spec(self, inputs, query_stream=None, **kwargs):
        content = keras.KerasTensor(inputs.shape, self.compute_dtype)
        if query_stream is None:
            return content
        return content, keras.KerasTensor(query_stream.shape, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            key_dim=self.key_dim,
            dropout=self.dropout,
            activation=serialize_activation(self.activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
