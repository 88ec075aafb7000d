import keras
from keras import ops

from keras_attn.layers.attention_mask import and_masks
from keras_attn.layers.encoder_int8_layout import EncoderInt8Layout
from keras_attn.layers.int8_layout_settings import check_layout_settings
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_block_base import TransformerBlockBase
from keras_attn.layers.transformer_block_base import resolve_key_dim
from keras_attn.layers.validation import check_positive_int

QUERY_LENGTH_MEANING = "the leading positions computed as queries"


def check_query_length(query_length, inputs):
    """Validates the `query_length` call argument against `inputs` `(B, T, d)`: a positive
    int, and at most `T` when `T` is known while tracing (a dynamic `T` is not checked)."""
    check_positive_int("query_length", query_length, QUERY_LENGTH_MEANING)
    length = inputs.shape[1]
    if length is not None and query_length > length:
        raise ValueError(
            f"`query_length` ({QUERY_LENGTH_MEANING}) must be at most the sequence length "
            f"T={length} of `inputs`. Received: query_length={query_length}, inputs.shape="
            f"{tuple(inputs.shape)}"
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderBlock(EncoderInt8Layout, TransformerBlockBase):
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
        quantization: optional dict of int8 layout settings (`EncoderInt8Layout`, keys
            of `int8_layout_settings.LAYOUT_DEFAULTS`, e.g. `{"float_residual": True}`):
            the block runs fake-quantized for quantization-aware training, in the layout
            of its int8 TFLite file (fused 2-D Q/K/V matmul, per-head batched matmuls),
            on the same weights; `keras_attn.quantization.quantize_model` sets it.
            A padding mask and the causal mask only (no `attention_mask`,
            `attention_bias` or scores; `query_length` post-LN only). Defaults to
            `None` (float).
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
        query_length: optional int `q`; only the first `q` positions are computed as
            queries (all `T` positions stay keys and values), and the output is
            `(B, q, d_model)`: what the first `q` rows of the full output would be. A
            classifier that reads only `[CLS]` from the last block uses `query_length=1`
            and skips the scores, output projection and FFN of the other `T - 1` rows.
            Not combined with `use_causal_mask` or a Keras implicit mask.
        inputs_mask, mask: the Keras implicit mask of `inputs` (from `Embedding(
            mask_zero=True)` or `Masking`); Keras fills `mask` when `inputs` is the only
            tensor argument and `inputs_mask` otherwise. Do not pass them: use
            `padding_mask`. All mask sources are AND-ed.

    Returns:
        `(B, T, d_model)` tensor (`(B, q, d_model)` with `query_length`), or
        `(outputs, scores)` with `return_attention_scores`, scores of shape `(B, H, T, T)`
        (`(B, H, q, T)`). The output keeps the Keras mask of `inputs`.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    >>> x = keras.ops.ones((2, 5, 8))
    >>> tuple(block(x, padding_mask=keras.ops.ones((2, 5))).shape)
    (2, 5, 8)
    """

    def __init__(self, num_heads, intermediate_dim, *args, quantization=None, **kwargs):
        super().__init__(num_heads, intermediate_dim, *args, **kwargs)
        self.quantization = check_layout_settings(quantization)
        if self.quantization is not None:
            self._init_int8_layout(intermediate_dim, **self.quantization)

    # === Build ===

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        key_dim = resolve_key_dim(d_model, self.num_heads, self.key_dim)
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
        if self.quantization is not None:
            self._check_int8_layout(d_model, key_dim)
            self._build_int8_layout()
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
        query_length=None,
        inputs_mask=None,
        mask=None,
    ):
        if query_length is not None:
            self._check_query_length(query_length, inputs, use_causal_mask, inputs_mask, mask)
        padding_mask = and_masks(padding_mask, inputs_mask, mask)  # (B, T)
        if self.quantization is not None:
            self._check_int8_call(attention_mask, attention_bias, return_attention_scores,
                                  query_length)
            return self._int8_call(inputs, padding_mask, training, query_length,
                                   causal=use_causal_mask)

        # === Self-attention sublayer ===
        residual = inputs  # (B, T, d)
        x = self.self_attention_layer_norm(inputs) if self.norm_first else inputs
        attention_inputs = (x,)  # self-attention: one fused Q/K/V matmul
        if query_length is not None:
            # Keys and values still come from all T positions; only the rows that are
            # read later are queries, so everything after the scores shrinks to q rows.
            residual = residual[:, :query_length]  # (B, q, d)
            attention_inputs = (x[:, :query_length], x)  # queries (B, q, d), keys (B, T, d)
            if attention_mask is not None:
                attention_mask = attention_mask[:, :query_length]  # (B, q, T)
            if attention_bias is not None and len(attention_bias.shape) >= 2:
                attention_bias = attention_bias[..., :query_length, :]  # (..., q, T)
        attended = self.self_attention(
            *attention_inputs, padding_mask=padding_mask, attention_mask=attention_mask,
            attention_bias=attention_bias, use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores, training=training,
        )
        scores = None
        if return_attention_scores:
            attended, scores = attended  # (B, q, d), (B, H, q, T)
        x = ops.add(residual, self.self_attention_dropout(attended, training=training))
        if not self.norm_first:
            x = self.self_attention_layer_norm(x)  # (B, T, d)

        # === Feed-forward sublayer ===
        x = self._feedforward_sublayer(x, training)  # (B, T, d)
        return (x, scores) if return_attention_scores else x

    def _check_query_length(self, query_length, inputs, use_causal_mask, inputs_mask, mask):
        check_query_length(query_length, inputs)
        if use_causal_mask:
            raise ValueError(
                "`query_length` is for bidirectional encoders; with `use_causal_mask=True` "
                "compute all positions. Received: query_length="
                f"{query_length}, use_causal_mask=True"
            )
        if inputs_mask is not None or mask is not None:
            raise ValueError(
                "`query_length` cannot keep a Keras implicit mask (from "
                "`Embedding(mask_zero=True)` or `Masking`) aligned with its shorter output; "
                f"pass `padding_mask` instead. Received: query_length={query_length} with "
                "an implicit mask on `inputs`"
            )

