import math

import keras
from keras import ops

from keras_attn.layers.encoder_int8_layout import EncoderInt8Layout
from keras_attn.layers.int8_attention import relative_score_terms
from keras_attn.layers.int8_layout_settings import check_layout_settings
from keras_attn.layers.transformer_block_base import TransformerBlockBase
from keras_attn.layers.transformer_block_base import int8_block_weights
from keras_attn.layers.transformer_block_base import resolve_key_dim
from keras_attn.layers.two_stream_relative_attention import TwoStreamRelativeAttention
from keras_attn.layers.two_stream_relative_attention import different_segments
from keras_attn.layers.two_stream_relative_attention import stream_masks
from keras_attn.layers.validation import clone_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetBlock(EncoderInt8Layout, TransformerBlockBase):
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
        quantization: optional dict of int8 layout settings (`EncoderInt8Layout`, keys of
            `int8_layout_settings.LAYOUT_DEFAULTS`): the content stream runs fake-quantized
            as BERT's post-LN block, the relative position and segment terms added to the
            scores in float, `(q + u) k^T + shift((q + v) (W_{k,R} R)^T) + (q + b) s^T`
            (`W_{k,R} R` a constant of the file); no query stream, no memory.
            `keras_attn.quantization.quantize_model` sets it. Defaults to `None`.

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

    config_keys = ("num_heads", "intermediate_dim", "key_dim", "dropout", "activation",
                   "layer_norm_epsilon", "kernel_initializer")

    def __init__(self, num_heads, intermediate_dim, key_dim=None, dropout=0.0,
                 activation="gelu", layer_norm_epsilon=1e-12,
                 kernel_initializer=None, quantization=None, **kwargs):
        # Post-LN (`norm_first=False`), as BERT's block (what the int8 layout asks).
        super().__init__(
            num_heads, intermediate_dim, key_dim=key_dim, dropout=dropout,
            activation=activation, layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer or keras.initializers.RandomNormal(
                stddev=0.02),
            **kwargs,
        )
        # Both streams come with their masks in `attention_mask`: no Keras mask to carry.
        self.supports_masking = False
        self.quantization = check_layout_settings(quantization)
        if self.quantization is not None:
            self._init_int8_layout(intermediate_dim, **self.quantization)

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
        if self.quantization is not None:
            self._check_int8_layout(inputs_shape[-1], key_dim)
            self._build_int8_layout()
        self.built = True

    def _sublayer_kwargs(self):
        return dict(kernel_initializer=clone_initializer(self.kernel_initializer),
                    dtype=self.dtype_policy)

    # === Call ===

    def call(self, inputs, query_stream=None, memory=None, attention_mask=None,
             segment_ids=None, target_mapping=None, training=None):
        if self.quantization is not None:
            self._check_int8_call(query_stream=query_stream is not None,
                                  memory=memory is not None,
                                  target_mapping=target_mapping is not None)
            _, content_mask = stream_masks(attention_mask, inputs, inputs)  # (B, T, T)
            return self._int8_call(inputs, content_mask, training,
                                   score_terms=self._int8_score_terms(segment_ids, inputs))
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

    # === Int8 layout (`quantization`) ===

    attention_dropout_layer = property(lambda self: self.attention.dropout_layer)
    attention_output_dropout_layer = property(lambda self: self.attention_dropout)
    feedforward_dropout_layer = property(lambda self: self.feedforward_dropout)

    def _int8_weights(self):
        return int8_block_weights(self, self.attention, self.attention_layer_norm)

    def _feedforward_hidden_dropout(self, h, training):
        return self.feedforward_hidden_dropout(h, training=training)

    def _int8_score_terms(self, segment_ids, inputs):
        """The relative terms of the content stream's scores for `Int8Attention._attend`:
        `query` `(B, n, T, d)` (scaled by `1/sqrt(d)`, as the layout's query columns are)
        -> `(query + u, shift((query + v) P) + select(s_ij, (query + b) s))`, with the
        biases scaled alike, `P = (W_{k,R} R)^T` `(n, d, 2T - 1)` over the distances
        `T-1 .. -(T-1)` and `s_ij` whether tokens `i` and `j` are in different segments
        (`TwoStreamRelativeAttention` without memory)."""
        attention = self.attention
        length = ops.shape(inputs)[1]
        relative = relative_score_terms(attention, length, length)  # Transformer-XL's terms
        segment_bias = ops.convert_to_tensor(attention.segment_bias)[None, :, None, :] / \
            math.sqrt(attention.key_dim)  # (1, n, 1, d), scaled as the query
        segments = ops.transpose(attention.segment_embedding, (1, 2, 0))  # (n, d, 2)
        different = different_segments(segment_ids, inputs, inputs)  # (B, T, T) or None

        def terms(query):
            content, scores = relative(query)  # (B, n, T, d), (B, n, T, T)
            if different is not None:
                segment_scores = ops.matmul(query + segment_bias, segments)  # (B, n, T, 2)
                scores = scores + ops.where(different[:, None], segment_scores[..., 1:],
                                            segment_scores[..., :1])  # (B, n, T, T)
            return content, scores

        return terms

    def compute_output_spec(self, inputs, query_stream=None, **kwargs):
        content = keras.KerasTensor(inputs.shape, self.compute_dtype)
        if query_stream is None:
            return content
        return content, keras.KerasTensor(query_stream.shape, self.compute_dtype)
