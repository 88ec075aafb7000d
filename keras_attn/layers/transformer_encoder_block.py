import keras
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.multi_head_attention import _and_masks
from keras_attn.layers.multi_head_attention import _check_positive_int
from keras_attn.layers.multi_head_attention import _clone_initializer


class _TransformerBlock(keras.layers.Layer):
    """What the encoder and decoder blocks share: arguments, config and the FFN.

    See `TransformerEncoderBlock` (below) for the arguments.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        dropout=0.0,
        attention_dropout=None,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        fused_qkv=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        _validate_block_arguments(
            num_heads, intermediate_dim, key_dim, dropout, attention_dropout,
            layer_norm_epsilon,
        )
        activation_fn = _get_activation(activation)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation_fn
        self.layer_norm_epsilon = layer_norm_epsilon
        self.norm_first = norm_first
        self.fused_qkv = fused_qkv
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    # === Feed-forward sublayer ===

    def _build_feedforward(self, inputs_shape):
        d_model = inputs_shape[-1]
        self.feedforward_intermediate_dense = keras.layers.Dense(
            self.intermediate_dim, name="feedforward_intermediate_dense",
            **self._sublayer_kwargs(),
        )
        self.feedforward_intermediate_dense.build(inputs_shape)
        self.feedforward_output_dense = keras.layers.Dense(
            d_model, name="feedforward_output_dense", **self._sublayer_kwargs()
        )
        self.feedforward_output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.feedforward_layer_norm = self._layer_norm("feedforward_layer_norm")
        self.feedforward_layer_norm.build(inputs_shape)
        self.feedforward_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="feedforward_dropout"
        )

    def _sublayer_kwargs(self):
        return dict(
            kernel_initializer=_clone_initializer(self.kernel_initializer),
            bias_initializer=_clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
        )

    def _layer_norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _feedforward_sublayer(self, x, training):
        residual = x  # (B, T, d)
        if self.norm_first:
            x = self.feedforward_layer_norm(x)
        h = self.activation(self.feedforward_intermediate_dense(x))  # (B, T, d_ff)
        h = self.feedforward_output_dense(h)  # (B, T, d)
        x = ops.add(residual, self.feedforward_dropout(h, training=training))
        return x if self.norm_first else self.feedforward_layer_norm(x)

    def compute_mask(self, inputs, mask=None):
        return mask

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            key_dim=self.key_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=_serialize_activation(self.activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            norm_first=self.norm_first,
            fused_qkv=self.fused_qkv,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config



@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderBlock(_TransformerBlock):
    """Transformer encoder block (Vaswani et al., 2017, §3.1, "Attention Is All You Need").

    A self-attention sublayer and a position-wise feed-forward sublayer, each wrapped in a
    residual connection and a layer normalization. The default is the paper's post-LN
    block (also BERT's); `norm_first=True` gives the pre-LN block of GPT-2 (Radford et al.,
    2019) and Xiong et al. (2020), which trains without learning-rate warm-up:

        post-LN (default)                          pre-LN (`norm_first=True`)
        y = LN(x + Dropout(SelfAttn(x)))           y = x + Dropout(SelfAttn(LN(x)))
        z = LN(y + Dropout(FFN(y)))                z = y + Dropout(FFN(LN(y)))

        FFN(y) = W_2 act(W_1 y + b_1) + b_2

    A pre-LN stack needs one final LayerNorm after its last block (GPT-2's `ln_f`); that
    belongs to the model, not to the block.

    Sublayers (their names are what checkpoint importers look up): `self_attention`
    (a keras-attn `MultiHeadAttention`), `self_attention_layer_norm`,
    `self_attention_dropout`, `feedforward_intermediate_dense` (`W_1`, `b_1`),
    `feedforward_output_dense` (`W_2`, `b_2`), `feedforward_layer_norm`,
    `feedforward_dropout`.

    Args:
        num_heads: int, number of attention heads `H`.
        intermediate_dim: int, hidden size of the feed-forward network (`d_ff`).
        key_dim: int, size of each attention head. Defaults to `d_model // num_heads`,
            which requires `d_model` to be divisible by `num_heads`.
        dropout: float in [0, 1), residual dropout on each sublayer's output.
            Defaults to `0.0`.
        attention_dropout: float in [0, 1), dropout on the attention probabilities.
            Defaults to `dropout`.
        activation: the FFN activation: a Keras activation name or callable, or
            `"gelu_approximate"` for the tanh approximation of GELU used by BERT and GPT-2.
            Exact GELU (`"gelu"`, built on `erf`) does not convert with tf2onnx; the tanh
            approximation does. Defaults to `"relu"` (the paper).
        layer_norm_epsilon: float > 0, the epsilon of the layer normalizations.
            Defaults to `1e-5`.
        norm_first: bool, pre-LN instead of post-LN. Defaults to `False`.
        fused_qkv: bool, project Q, K and V with one fused kernel (see
            `MultiHeadAttention`). Defaults to `False`.
        kernel_initializer: initializer for every kernel. Defaults to `"glorot_uniform"`.
        bias_initializer: initializer for every bias. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, T, d_model)` tensor.
        padding_mask: optional `(B, T)` boolean/int, True/1 for real tokens.
        attention_mask: optional boolean `(B, T, T)`, True where query `t` may see key `s`.
        attention_bias: optional float broadcastable to `(B, H, T, T)`, added to the
            attention scores (relative position biases).
        use_causal_mask: bool, forbid attending to later positions. Defaults to `False`.
        return_attention_scores: bool, also return the attention probabilities.
        training: bool, enables dropout.
        inputs_mask, mask: the Keras implicit mask of `inputs` (from `Embedding(
            mask_zero=True)` or `Masking`); Keras fills `mask` when `inputs` is the only
            tensor argument and `inputs_mask` otherwise. Do not pass them: use
            `padding_mask`. All mask sources are AND-ed.

    Returns:
        `(B, T, d_model)` tensor, or `(outputs, scores)` with `return_attention_scores`,
        scores of shape `(B, H, T, T)`. The output keeps the Keras mask of `inputs`.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    >>> x = keras.ops.ones((2, 5, 8))
    >>> tuple(block(x, padding_mask=keras.ops.ones((2, 5))).shape)
    (2, 5, 8)
    """

    # === Build ===

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        key_dim = _resolve_key_dim(d_model, self.num_heads, self.key_dim)
        self.self_attention = MultiHeadAttention(
            num_heads=self.num_heads, key_dim=key_dim, dropout=self.attention_dropout,
            fused_qkv=self.fused_qkv, name="self_attention", **self._sublayer_kwargs(),
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.self_attention_layer_norm.build(inputs_shape)
        self.self_attention_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="self_attention_dropout"
        )
        self._build_feedforward(inputs_shape)
        self.built = True

    # === Call ===

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        inputs_mask=None,
        mask=None,
    ):
        padding_mask = _and_masks(padding_mask, inputs_mask, mask)  # (B, T)

        # === Self-attention sublayer ===
        residual = inputs  # (B, T, d)
        x = self.self_attention_layer_norm(inputs) if self.norm_first else inputs
        attended = self.self_attention(
            x, padding_mask=padding_mask, attention_mask=attention_mask,
            attention_bias=attention_bias, use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores, training=training,
        )
        scores = None
        if return_attention_scores:
            attended, scores = attended  # (B, T, d), (B, H, T, T)
        x = ops.add(residual, self.self_attention_dropout(attended, training=training))
        if not self.norm_first:
            x = self.self_attention_layer_norm(x)  # (B, T, d)

        # === Feed-forward sublayer ===
        x = self._feedforward_sublayer(x, training)  # (B, T, d)
        return (x, scores) if return_attention_scores else x


# === Helpers (also used by TransformerDecoderBlock) ===


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_approximate(x):
    """GELU with the tanh approximation (Hendrycks & Gimpel, 2016), as in BERT and GPT-2.

        gelu(x) ~= 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    """
    return keras.activations.gelu(x, approximate=True)


def _get_activation(identifier):
    """A Keras activation, plus the `"gelu_approximate"` name for `gelu_approximate`."""
    if identifier == "gelu_approximate":
        return gelu_approximate
    return keras.activations.get(identifier)


def _serialize_activation(activation):
    # A readable name in configs for our own activation; Keras' form for the rest.
    if activation is gelu_approximate:
        return "gelu_approximate"
    return keras.activations.serialize(activation)


def _resolve_key_dim(d_model, num_heads, key_dim):
    """`key_dim`, defaulting to `d_model // num_heads` when that division is exact."""
    if key_dim is not None:
        return key_dim
    if d_model is None or d_model % num_heads:
        raise ValueError(
            "Without an explicit `key_dim`, the model size (last dimension of the inputs) "
            "must be divisible by `num_heads`, since each head gets d_model // num_heads "
            f"features. Pass `key_dim` or change `num_heads`. Received: d_model={d_model}, "
            f"num_heads={num_heads}"
        )
    return d_model // num_heads


def _validate_block_arguments(
    num_heads, intermediate_dim, key_dim, dropout, attention_dropout, layer_norm_epsilon
):
    # Same checks (and messages) as MultiHeadAttention, done here so a bad block fails
    # at construction rather than at its first call.
    _check_positive_int("num_heads", num_heads)
    _check_positive_int("intermediate_dim", intermediate_dim)
    if key_dim is not None:
        _check_positive_int("key_dim", key_dim)
    for name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout)):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={rate}")
    if not layer_norm_epsilon > 0:
        raise ValueError(
            "`layer_norm_epsilon` must be positive. "
            f"Received: layer_norm_epsilon={layer_norm_epsilon}"
        )
