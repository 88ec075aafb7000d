"""`QatEncoderBlock`: a post-LN BERT encoder block with its own weights in the int8 layout
(`EncoderInt8Layout`), the block of `QatBert`."""

import keras

from keras_attn.layers.encoder_int8_layout import EncoderInt8Layout
from keras_attn.layers.transformer_block_base import get_activation
from keras_attn.layers.transformer_block_base import serialize_activation
from keras_attn.layers.transformer_encoder_block import check_query_length
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate


@keras.saving.register_keras_serializable(package="keras_attn")
class QatEncoderBlock(EncoderInt8Layout, keras.layers.Layer):
    """Post-LN Transformer encoder block (Vaswani et al., 2017, §3.1; BERT's) laid out for
    int8 TFLite and fake-quantized for quantization-aware training.

        y = LN(x + Dropout(Attn(x))),  z = LN(y + Dropout(W_2 act(W_1 y + b_1) + b_2))
        Attn(x) = concat_h(softmax(Q_h K_h^T / sqrt(d) + M) V_h) W_O

    Computes the function of `TransformerEncoderBlock(fused_qkv=True)`: its fused
    Q/K/V kernel `(H, 3, n, d)` is stored flattened as `(H, 3H)`. The layout, the
    quantizers and `float_residual`, `feedforward_float_channels`, `float_matmuls` are
    `EncoderInt8Layout`'s.

    Args:
        num_heads, intermediate_dim: ints. dropout: float rate (residual and attention).
        activation: `"gelu"`, `"gelu_approximate"`, `"relu"`, ... layer_norm_epsilon: float.
        weight_quantization: `"per_channel"` or `"per_tensor"`. quantize: bool.
        float_residual: bool, see above. Defaults to `False` (everything int8).
        feedforward_float_channels: int in `[0, intermediate_dim)`, see above; more than
            0 needs `float_residual=True`. Defaults to `0`.
        float_matmuls: names of `MATMULS` (`"qkv"`, `"attention_output"`,
            `"intermediate"`, `"feedforward_output"`) run in float, with the rounding of
            their input (where the block makes it) and output.
            What an int8 budget moves to float (`quantization_budget`). Defaults to `()`.
        quantize_output: bool, round the output to int8 (the next layer's first matmul
            reads it). Defaults to `quantize`.
        decay: EMA factor. attention_mask_margin: float, see above. masked_score: float,
            the value of masked scores when `quantize=False`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, H)`. padding_mask: `(B, T)` int, 1 for real tokens. training: bool.
        query_length: optional int `q`: only the first `q` positions are queries (keys
            and values use all `T`), as in `TransformerEncoderBlock`.
        residual: optional `(B, T, H)`: the value the first residual sum reads, the float
            output of the block before (`return_residual`); default `inputs`, the int8
            value the weight matmuls read.
        return_residual: bool: also return the output the next block's residual reads
            (the float LayerNorm output with `float_residual`, else the output itself).

    Returns:
        `(B, T, H)`, or `(B, q, H)` with `query_length`; with `return_residual`, a pair
        `(output, residual output)`.

    Example:
    >>> block = QatEncoderBlock(num_heads=2, intermediate_dim=8)
    >>> x = np.random.default_rng(0).normal(size=(1, 3, 4)).astype("float32")
    >>> tuple(block(x, padding_mask=np.array([[1, 1, 0]]), training=True).shape)
    (1, 3, 4)
    """

    def __init__(self, num_heads, intermediate_dim, dropout=0.0, activation="gelu",
                 layer_norm_epsilon=1e-12, weight_quantization="per_channel", quantize=True,
                 decay=0.999, attention_mask_margin=12.0, masked_score=-1e9,
                 float_residual=False, feedforward_float_channels=0, float_matmuls=(),
                 quantize_output=None, **kwargs):
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        activation_fn = get_activation(activation)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.activation = activation_fn
        self.layer_norm_epsilon = layer_norm_epsilon
        self._init_int8_layout(
            intermediate_dim, weight_quantization=weight_quantization, quantize=quantize,
            decay=decay, attention_mask_margin=attention_mask_margin,
            masked_score=masked_score, float_residual=float_residual,
            feedforward_float_channels=feedforward_float_channels,
            float_matmuls=float_matmuls, quantize_output=quantize_output)
        self.attention_dropout = keras.layers.Dropout(dropout, name="attention_dropout")
        self.attention_output_dropout = keras.layers.Dropout(
            dropout, name="attention_output_dropout")
        self.feedforward_dropout = keras.layers.Dropout(dropout, name="feedforward_dropout")

    # The dropouts the layout (`EncoderInt8Layout`) applies.
    attention_dropout_layer = property(lambda self: self.attention_dropout)
    attention_output_dropout_layer = property(lambda self: self.attention_output_dropout)
    feedforward_dropout_layer = property(lambda self: self.feedforward_dropout)

    def build(self, inputs_shape, padding_mask_shape=None):
        H, F = inputs_shape[-1], self.intermediate_dim
        if H % self.num_heads:
            raise ValueError(
                "The hidden size must be divisible by `num_heads`. "
                f"Received: hidden_dim={H}, num_heads={self.num_heads}"
            )

        def weight(name, shape, initializer="glorot_uniform"):
            return self.add_weight(name=name, shape=shape, initializer=initializer)

        self.qkv_kernel = weight("qkv_kernel", (H, 3 * H))
        self.qkv_bias = weight("qkv_bias", (3 * H,), "zeros")
        self.output_kernel = weight("output_kernel", (H, H))
        self.output_bias = weight("output_bias", (H,), "zeros")
        self.attention_gamma = weight("attention_layer_norm_gamma", (H,), "ones")
        self.attention_beta = weight("attention_layer_norm_beta", (H,), "zeros")
        self.intermediate_kernel = weight("intermediate_kernel", (H, F))
        self.intermediate_bias = weight("intermediate_bias", (F,), "zeros")
        self.feedforward_output_kernel = weight("feedforward_output_kernel", (F, H))
        self.feedforward_output_bias = weight("feedforward_output_bias", (H,), "zeros")
        self.feedforward_gamma = weight("feedforward_layer_norm_gamma", (H,), "ones")
        self.feedforward_beta = weight("feedforward_layer_norm_beta", (H,), "zeros")
        self._build_int8_layout()
        self.built = True

    def _int8_weights(self):
        names = ("qkv_kernel", "qkv_bias", "output_kernel", "output_bias", "attention_gamma",
                 "attention_beta", "intermediate_kernel", "intermediate_bias",
                 "feedforward_output_kernel", "feedforward_output_bias", "feedforward_gamma",
                 "feedforward_beta")
        return {name: getattr(self, name) for name in names}

    def _channel_axes(self):
        """`(variable, axis)` of the weights whose feed-forward channels move together."""
        return [(self.intermediate_kernel, 1), (self.intermediate_bias, 0),
                (self.feedforward_output_kernel, 0)]

    def call(self, inputs, padding_mask, training=None, query_length=None, residual=None,
             return_residual=False):
        if query_length is not None:
            check_query_length(query_length, inputs)
        return self._int8_call(inputs, padding_mask, training, query_length, residual,
                               return_residual)

    def get_config(self):
        config = super().get_config()
        layout = self.int8_layout_config()
        del layout["quantize_input"], layout["input_producer"]
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            activation=serialize_activation(self.activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            **layout,
        )
        return config
