"""`QatEncoderBlock`: a post-LN BERT encoder block with fake int8 quantization of every
matmul input, the attention scores and probabilities and the residual sums."""

import math

import keras
from keras import ops

from keras_attn.layers.transformer_block_base import get_activation
from keras_attn.layers.transformer_block_base import serialize_activation
from keras_attn.layers.transformer_encoder_block import check_query_length
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.quantization.activation_quantizer import ActivationQuantizer
from keras_attn.quantization.qat_embeddings import layer_norm
from keras_attn.quantization.qat_embeddings import layer_norm_quantizers
from keras_attn.quantization.quantized_dense import check_weight_quantization
from keras_attn.quantization.quantized_dense import matmul_bound
from keras_attn.quantization.quantized_dense import quantized_matmul

# TFLite's int8 SOFTMAX has a fixed output scale of 1/256 (zero point -128).
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)

_QUANTIZER_NAMES = (
    "qkv_quantizer", "context_quantizer", "attention_output_quantizer",
    "attention_residual_quantizer", "attention_layer_norm_quantizer",
    "intermediate_quantizer", "activation_quantizer", "feedforward_output_quantizer",
    "feedforward_residual_quantizer", "feedforward_layer_norm_quantizer",
)
# The residual stream: float with `float_residual=True`.
_RESIDUAL_QUANTIZER_NAMES = ("attention_residual_quantizer", "feedforward_residual_quantizer")


@keras.saving.register_keras_serializable(package="keras_attn")
class QatEncoderBlock(keras.layers.Layer):
    """Post-LN Transformer encoder block (Vaswani et al., 2017, §3.1; BERT's) laid out for
    int8 TFLite and fake-quantized for quantization-aware training.

        y = LN(x + Dropout(Attn(x))),  z = LN(y + Dropout(W_2 act(W_1 y + b_1) + b_2))
        Attn(x) = concat_h(softmax(Q_h K_h^T / sqrt(d) + M) V_h) W_O

    Computes the function of `TransformerEncoderBlock(fused_qkv=True)`: its fused
    Q/K/V kernel `(H, 3, n, d)` is stored flattened as `(H, 3H)` (`1/sqrt(d)` is folded
    into the query columns inside the graph, so the stored weights are the float
    model's). Layout: 2-D matmuls `(B*T, H) x (H, out)`, Q, K and V by one split of
    `(B*T, 3H)`, heads by reshape `(B, T, n, d)` + transpose, and two batched matmuls
    per head group. Every matmul output, residual sum, LayerNorm output, GELU output and
    the softmax output is quantized once, where it is produced.

    Padding mask in int8: padded keys are set to the bottom of the score range, which
    `ActivationQuantizer(mask_margin=...)` places `attention_mask_margin` below the EMA
    minimum of the real scores (see `ActivationQuantizer`). With `quantize=False` they get
    -1e9 (`masked_score`), as in the float model.

    `float_residual=True` leaves the residual sums and the LayerNorm internals in float
    (their quantizers only track ranges); the LayerNorm outputs, which feed the next
    matmuls, stay int8. BERT-like models carry a few outlier dimensions in the residual
    stream (Bondarenko et al., 2021) that a per-tensor int8 range cannot hold together
    with the others; the int8 TFLite model then runs ADD and LayerNorm in float between
    a DEQUANTIZE and a QUANTIZE, and every matmul in int8.

    Args:
        num_heads, intermediate_dim: ints. dropout: float rate (residual and attention).
        activation: `"gelu"`, `"gelu_approximate"`, `"relu"`, ... layer_norm_epsilon: float.
        weight_quantization: `"per_channel"` or `"per_tensor"`. quantize: bool.
        float_residual: bool, see above. Defaults to `False` (everything int8).
        decay: EMA factor. attention_mask_margin: float, see above. masked_score: float,
            the value of masked scores when `quantize=False`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, H)`. padding_mask: `(B, T)` int, 1 for real tokens. training: bool.
        query_length: optional int `q`: only the first `q` positions are queries (keys
            and values use all `T`), as in `TransformerEncoderBlock`.

    Returns:
        `(B, T, H)`, or `(B, q, H)` with `query_length`.

    Example:
    >>> block = QatEncoderBlock(num_heads=2, intermediate_dim=8)
    >>> x = np.random.default_rng(0).normal(size=(1, 3, 4)).astype("float32")
    >>> tuple(block(x, padding_mask=np.array([[1, 1, 0]]), training=True).shape)
    (1, 3, 4)
    """

    def __init__(self, num_heads, intermediate_dim, dropout=0.0, activation="gelu",
                 layer_norm_epsilon=1e-12, weight_quantization="per_channel", quantize=True,
                 decay=0.999, attention_mask_margin=12.0, masked_score=-1e9,
                 float_residual=False, **kwargs):
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        check_weight_quantization(weight_quantization)
        check_bool("float_residual", float_residual)
        activation_fn = get_activation(activation)
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.activation = activation_fn
        self.layer_norm_epsilon = layer_norm_epsilon
        self.weight_quantization = weight_quantization
        self.quantize = quantize
        self.decay = decay
        self.attention_mask_margin = attention_mask_margin
        self.masked_score = masked_score
        self.float_residual = float_residual
        residual_quantize = quantize and not float_residual
        self.quantizers = {
            name: ActivationQuantizer(decay=decay, name=name, quantize=(
                residual_quantize if name in _RESIDUAL_QUANTIZER_NAMES else quantize))
            for name in _QUANTIZER_NAMES
        }
        self.attention_layer_norm_quantizers = layer_norm_quantizers(
            "attention_layer_norm", decay, residual_quantize)
        self.feedforward_layer_norm_quantizers = layer_norm_quantizers(
            "feedforward_layer_norm", decay, residual_quantize)
        self.score_quantizer = ActivationQuantizer(
            decay=decay, mask_margin=attention_mask_margin, masked_value=masked_score,
            quantize=quantize, name="score_quantizer",
        )
        self.probability_quantizer = ActivationQuantizer(
            fixed_range=SOFTMAX_RANGE, quantize=quantize, name="probability_quantizer"
        )
        self.frozen_bounds = None
        self.attention_dropout = keras.layers.Dropout(dropout, name="attention_dropout")
        self.attention_output_dropout = keras.layers.Dropout(
            dropout, name="attention_output_dropout")
        self.feedforward_dropout = keras.layers.Dropout(dropout, name="feedforward_dropout")

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
        for quantizer in (list(self.quantizers.values())
                          + list(self.attention_layer_norm_quantizers.values())
                          + list(self.feedforward_layer_norm_quantizers.values())
                          + [self.score_quantizer, self.probability_quantizer]):
            quantizer.build(())
        self.built = True

    def _matmul(self, x, kernel, bias, name):
        bound = self.frozen_bounds[name] if self.frozen_bounds else None
        return quantized_matmul(x, kernel, bias, self.quantize, self.weight_quantization,
                                bound)

    def _query_scale(self):
        # 1/sqrt(d) scales the query columns of the fused kernel (folded into the int8
        # weights by the converter) instead of the scores.
        H = self.qkv_kernel.shape[0]
        d = H // self.num_heads
        return ops.concatenate([
            ops.full((H,), 1.0 / math.sqrt(d), dtype="float32"), ops.ones((2 * H,), "float32")
        ])  # (3H,)

    def freeze_weight_ranges(self, frozen=True):
        """Weight ranges as constants of the traced graph (export) or computed again."""
        if not frozen:
            self.frozen_bounds = None
            return
        wq = self.weight_quantization
        self.frozen_bounds = {
            "qkv": matmul_bound(self.qkv_kernel * self._query_scale(), wq),
            "output": matmul_bound(self.output_kernel, wq),
            "intermediate": matmul_bound(self.intermediate_kernel, wq),
            "feedforward_output": matmul_bound(self.feedforward_output_kernel, wq),
        }

    def call(self, inputs, padding_mask, training=None, query_length=None):
        q = self.quantizers
        H = inputs.shape[-1]
        n = self.num_heads
        d = H // n
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        x = ops.reshape(inputs, (-1, H))  # (B*T, H)
        if query_length is not None:
            check_query_length(query_length, inputs)
        rows = length if query_length is None else query_length  # q, the query rows

        # === Self-attention ===
        scale = self._query_scale()  # (3H,)
        qkv = self._matmul(x, self.qkv_kernel * scale, self.qkv_bias * scale, "qkv")
        qkv = q["qkv_quantizer"](qkv, training=training)
        # One SPLIT, not three strided slices of a (B, T, 3, n, d) view: XNNPACK takes
        # SPLIT, and the slices cut its graph (fp32 TFLite L4/H256, T=128: 10 -> 6
        # partitions, 13.2 -> 10.5 ms).
        query, key, value = ops.split(qkv, 3, axis=-1)  # 3 x (B*T, H)
        if query_length is not None:
            # Only the first q rows are read later (the [CLS] row of a classifier's last
            # block): they alone are queries, and the rest of the block runs on q rows.
            query = ops.reshape(query, (batch, length, H))[:, :query_length]  # (B, q, H)
            x = ops.reshape(inputs[:, :query_length], (-1, H))  # (B*q, H)

        def heads(x, rows, order):
            return ops.transpose(ops.reshape(x, (batch, rows, n, d)), order)

        query = heads(query, rows, (0, 2, 1, 3))  # (B, n, q, d)
        key_t = heads(key, length, (0, 2, 3, 1))  # (B, n, d, T)
        value = heads(value, length, (0, 2, 1, 3))  # (B, n, T, d)
        scores = ops.matmul(query, key_t)  # (B, n, q, T)
        key_mask = ops.cast(padding_mask, "bool")[:, None, None, :]  # (B, 1, 1, T)
        scores = self.score_quantizer(scores, stats_mask=key_mask, training=training)
        probs = self.probability_quantizer(ops.softmax(scores, axis=-1))  # (B, n, q, T)
        probs = self.attention_dropout(probs, training=training)
        context = ops.matmul(probs, value)  # (B, n, q, d)
        context = q["context_quantizer"](context, training=training)
        context = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, H))  # (B*q, H)
        attended = self._matmul(context, self.output_kernel, self.output_bias, "output")  # (B*q, H)
        attended = q["attention_output_quantizer"](attended, training=training)
        attended = self.attention_output_dropout(attended, training=training)
        x = q["attention_residual_quantizer"](x + attended, training=training)
        x = layer_norm(x, self.attention_gamma, self.attention_beta, self.layer_norm_epsilon,
                       self.attention_layer_norm_quantizers, training)
        x = q["attention_layer_norm_quantizer"](x, training=training)  # (B*q, H)

        # === Feed-forward ===
        h = self._matmul(x, self.intermediate_kernel, self.intermediate_bias,
                         "intermediate")  # (B*q, F)
        h = q["intermediate_quantizer"](h, training=training)
        h = q["activation_quantizer"](self.activation(h), training=training)
        h = self._matmul(h, self.feedforward_output_kernel, self.feedforward_output_bias,
                         "feedforward_output")  # (B*q, H)
        h = q["feedforward_output_quantizer"](h, training=training)
        h = self.feedforward_dropout(h, training=training)
        x = q["feedforward_residual_quantizer"](x + h, training=training)
        x = layer_norm(x, self.feedforward_gamma, self.feedforward_beta,
                       self.layer_norm_epsilon, self.feedforward_layer_norm_quantizers,
                       training)
        x = q["feedforward_layer_norm_quantizer"](x, training=training)
        return ops.reshape(x, (batch, rows, H))  # (B, q, H); q = T by default

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            activation=serialize_activation(self.activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            weight_quantization=self.weight_quantization,
            quantize=self.quantize,
            decay=self.decay,
            attention_mask_margin=self.attention_mask_margin,
            masked_score=self.masked_score,
            float_residual=self.float_residual,
        )
        return config
