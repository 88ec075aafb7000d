"""What the Transformer blocks share; not exported, read it next to the blocks.

- `FeedForwardMixin`: the position-wise feed-forward sublayer (with its residual
  connection, dropout and layer norm) and the layer-norm factory.
- `TransformerBlockBase`: the arguments, validation and config of every block
  (`TransformerEncoderBlock`, `TransformerDecoderBlock`, and the relative-attention
  `TransformerXLBlock` and `XLNetBlock`), which differ in their attention sublayers.
- `gelu_approximate` and `resolve_key_dim`, helpers of the blocks' arguments.

Users build models from the public blocks; subclass `TransformerBlockBase` only to write
a new block with the same arguments.
"""

import math

import keras
from keras import ops

from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.layers.validation import clone_initializer


class FeedForwardMixin:
    """The position-wise feed-forward sublayer of a Transformer block (Vaswani et al.,
    2017, §3.3), in its residual branch:

        post-LN: z = LN(y + Dropout(FFN(y)))      pre-LN: z = y + Dropout(FFN(LN(y)))
        FFN(y) = W_2 act(W_1 y + b_1) + b_2

    Mixed into a `keras.layers.Layer` that sets the attributes `intermediate_dim`,
    `dropout`, `activation` (a callable), `layer_norm_epsilon` and `norm_first`, and
    defines `_sublayer_kwargs()` (the initializers and dtype of its sublayers). Its
    `build` calls `_build_feedforward` and its `call` `_feedforward_sublayer`. Sublayer
    names (checkpoint importers look them up): `feedforward_intermediate_dense` (`W_1`,
    `b_1`), `feedforward_output_dense` (`W_2`, `b_2`), `feedforward_layer_norm`,
    `feedforward_dropout`.
    """

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

    def _channel_axes(self):
        """`(variable, axis)` of the weights whose feed-forward channels move together
        (what an int8 layout's `permute_feedforward_channels` permutes)."""
        intermediate, output = self.feedforward_intermediate_dense, self.feedforward_output_dense
        return [(intermediate.kernel, 1), (intermediate.bias, 0), (output.kernel, 0)]

    def _layer_norm(self, name):
        """A LayerNormalization with the block's epsilon (for every sublayer's norm)."""
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


class TransformerBlockBase(FeedForwardMixin, keras.layers.Layer):
    """Arguments, validation, config and feed-forward sublayer of the Transformer blocks.

    Subclasses build and call their attention sublayers and end with
    `_build_feedforward` / `_feedforward_sublayer`. See `TransformerEncoderBlock` for
    the arguments. A block whose constructor takes other arguments (the relative-attention
    blocks: a `memory_length`, no `fused_qkv`) passes the shared ones to this `__init__`
    and names its own config in `config_keys`.
    """

    # The attributes `get_config` records, in order: each is the constructor argument of
    # the same name (`activation` and `*_initializer` serialized).
    config_keys = ("num_heads", "intermediate_dim", "key_dim", "dropout", "attention_dropout",
                   "activation", "layer_norm_epsilon", "norm_first", "fused_qkv",
                   "kernel_initializer", "bias_initializer")

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
        # Same checks (and messages) as MultiHeadAttention, done here so a bad block fails
        # at construction rather than at its first call.
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        check_rate("dropout", dropout)
        check_rate("attention_dropout", attention_dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        activation_fn = get_activation(activation)
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

    def _sublayer_kwargs(self):
        return dict(
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
        )

    def compute_mask(self, inputs, mask=None):
        return mask

    # The sublayers of the float blocks (`TransformerEncoderBlock`,
    # `TransformerDecoderBlock`) the layout reads.
    attention_dropout_layer = property(lambda self: self.self_attention.dropout_layer)
    attention_output_dropout_layer = property(lambda self: self.self_attention_dropout)
    feedforward_dropout_layer = property(lambda self: self.feedforward_dropout)

    def _int8_weights(self):
        """The weights of the float block's sublayers (fused or separate Q/K/V kernels)
        as the layout reads them (see the `EncoderInt8Layout` docstring)."""
        return int8_block_weights(self, self.self_attention, self.self_attention_layer_norm,
                                  self.fused_qkv)

    def get_config(self):
        config = super().get_config()
        for key in self.config_keys:
            value = getattr(self, key)
            if key == "activation":
                value = serialize_activation(value)
            elif key.endswith("_initializer"):
                value = keras.initializers.serialize(value)
            config[key] = value
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_approximate(x):
    """GELU with the tanh approximation (Hendrycks & Gimpel, 2016), as in BERT and GPT-2.

        gelu(x) ~= 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    """
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_erf(x):
    """The exact GELU (Hendrycks & Gimpel, 2016) written with `erf`, as BERT's and XLNet's
    checkpoints compute it:

        gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))

    `keras.activations.gelu` computes the same function as `0.5 x erfc(-x / sqrt(2))` on
    TensorFlow, and `Erfc` has no ONNX operator, so `model.export(format="onnx")` would
    leave it unconverted; `Erf` converts (ONNX opset 9) and runs on LiteRT.
    """
    x = ops.convert_to_tensor(x)
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def get_activation(identifier):
    """A Keras activation, plus the `"gelu_approximate"` name for `gelu_approximate`;
    the exact `"gelu"` is `gelu_erf` (it exports to ONNX)."""
    if identifier == "gelu_approximate":
        return gelu_approximate
    activation = keras.activations.get(identifier)
    return gelu_erf if activation is keras.activations.gelu else activation


def serialize_activation(activation):
    """The config form of an activation from `get_activation`."""
    # Readable names in configs for our own activations; Keras' form for the rest.
    if activation is gelu_approximate:
        return "gelu_approximate"
    if activation is gelu_erf:
        return "gelu"
    return keras.activations.serialize(activation)


def resolve_key_dim(d_model, num_heads, key_dim):
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


def flat_bias(bias, size):
    """A projection's bias `(..., H, dk)` as `(size,)`, zeros without a bias."""
    return ops.zeros((size,)) if bias is None else ops.reshape(bias, (-1,))


def int8_block_weights(block, attention, attention_layer_norm, fused_qkv=False):
    """The weights of a post- or pre-LN block's self-attention (`attention`, a
    `MultiHeadAttention`), its LayerNorms and its feed-forward sublayer, as an int8 layout
    reads them (`EncoderInt8Layout._int8_weights`): `(d, 3d)` Q/K/V columns and their
    `(3d,)` bias (zeros without biases), the `(d, d)` output projection, the FFN's kernels.
    """
    d_model = attention.output_dense.kernel.shape[-1]

    def columns(kernel):  # (d, ..., H, dk) -> (d, H * dk)
        return ops.reshape(kernel, (d_model, -1))

    if fused_qkv:
        qkv_kernel = columns(attention.qkv_kernel)  # (d, 3d)
        qkv_bias = flat_bias(attention.qkv_bias, 3 * d_model)  # (3d,)
    else:
        projections = (attention.query_dense, attention.key_dense, attention.value_dense)
        qkv_kernel = ops.concatenate([columns(p.kernel) for p in projections], axis=1)
        qkv_bias = ops.concatenate([flat_bias(p.bias, d_model) for p in projections])
    intermediate, output = block.feedforward_intermediate_dense, block.feedforward_output_dense
    return dict(
        qkv_kernel=qkv_kernel, qkv_bias=qkv_bias,
        output_kernel=ops.reshape(attention.output_dense.kernel, (d_model, d_model)),
        output_bias=flat_bias(attention.output_dense.bias, d_model),
        attention_gamma=attention_layer_norm.gamma, attention_beta=attention_layer_norm.beta,
        intermediate_kernel=intermediate.kernel, intermediate_bias=intermediate.bias,
        feedforward_output_kernel=output.kernel, feedforward_output_bias=output.bias,
        feedforward_gamma=block.feedforward_layer_norm.gamma,
        feedforward_beta=block.feedforward_layer_norm.beta,
    )
