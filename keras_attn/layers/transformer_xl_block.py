import keras
from keras import ops

from keras_attn.layers.encoder_int8_layout import EncoderInt8Layout
from keras_attn.layers.int8_attention import relative_score_terms
from keras_attn.layers.int8_layout_settings import check_layout_settings
from keras_attn.layers.relative_multi_head_attention import RelativeMultiHeadAttention
from keras_attn.layers.relative_multi_head_attention import _key_padding_mask
from keras_attn.layers.transformer_block_base import TransformerBlockBase
from keras_attn.layers.transformer_block_base import resolve_key_dim
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import clone_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerXLBlock(EncoderInt8Layout, TransformerBlockBase):
    """One Transformer-XL layer: relative attention over [memory; segment] + FFN.

    Dai et al., 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
    Context", §3.2–3.3. For layer `n` and the current segment `h = h^{n-1}`:

        h~ = [SG(m^{n-1}) ∘ h]                              (memory: no gradient)
        a  = RelativeMultiHeadAttention(q from h, k and v from h~)
        o  = LayerNorm(h + Dropout(a))                      (post-LN, the default)
        h^n = LayerNorm(o + Dropout(W_2 act(W_1 o + b_1) + b_2))

    With `norm_first=True` (pre-LN, the official code's `pre_lnorm`) the norms move
    inside the residual branches, `o = h + Dropout(Attn(LN(h), LN(m)))` and
    `h^n = o + Dropout(FFN(LN(o)))`; the memory goes through the same norm as the
    segment, so it is exactly what the keys would have been in one long sequence.

    The memory for the next segment is this layer's *input* `h^{n-1}`, not its output:
    `new_memory = SG([m ∘ h][:, -memory_length:])`. Feeding it back at the next segment
    makes that segment's outputs equal to those of one causal pass over the
    concatenated sequence, which relative positions make possible. (With `quantization`
    and a float input the block rounds, it is that input as the int8 layout rounds it.)

    Args:
        num_heads: int, number of attention heads.
        intermediate_dim: int, hidden size of the feed-forward network.
        key_dim: int, size of each head. Defaults to `d_model // num_heads`.
        memory_length: int, number of past hidden states kept in `new_memory`. Defaults
            to `None`: the length of the current segment (the paper's training setup,
            memory length = segment length).
        dropout: float, dropout on the attention probabilities and on both residual
            branches. Defaults to `0.0`.
        activation: activation of the feed-forward network, any Keras activation or
            `"gelu_approximate"` (the tanh GELU, which exports through tf2onnx).
            Defaults to `"relu"`.
        layer_norm_epsilon: float. Defaults to `1e-5`.
        norm_first: bool, pre-LN instead of post-LN. Defaults to `False`.
        kernel_initializer: initializer for every kernel. Defaults to `"glorot_uniform"`.
        quantization: optional dict of int8 layout settings (`EncoderInt8Layout`, keys of
            `int8_layout_settings.LAYOUT_DEFAULTS`): the block fake-quantized as BERT's
            post-LN block (GPT's pre-LN one with `norm_first`): the int8 Q/K/V matmul
            on the segment's rows and on the memory's (its keys and values, read at
            their own int8 scale; pre-LN, `LN(memory)` at the segment's), the output and
            feed-forward matmuls in int8, and the relative terms added to the scores in
            float, `(q + u) k^T + shift((q + v) (W_{k,R} R)^T)` over the `M + T` keys
            (`relative_score_terms`; `W_{k,R} R` a constant of a fixed-length file),
            masked causally over memory and segment. `keras_attn.quantization.
            quantize_model` sets it. Defaults to `None`.

    Call arguments:
        inputs: `(B, T, d_model)`, the current segment's hidden states `h^{n-1}`.
        memory: optional `(B, M, d_model)`, the previous `new_memory` of this layer.
        padding_mask: optional `(B, T)` or `(B, M + T)` key padding mask (see
            `RelativeMultiHeadAttention`); a Keras mask on `inputs` works as `(B, T)`.
        use_causal_mask: bool, query `i` sees the memory and segment keys up to itself.
            Defaults to `True` (language modelling).
        training: bool, enables dropout.

    Returns:
        Tuple `(outputs, new_memory)`: `(B, T, d_model)` and
        `(B, memory_length, d_model)` (`(B, T, d_model)` by default).

    Example:
    >>> block = TransformerXLBlock(num_heads=2, intermediate_dim=16)
    >>> segment_1, segment_2 = keras.ops.ones((1, 4, 8)), keras.ops.zeros((1, 4, 8))
    >>> out_1, memory = block(segment_1)
    >>> out_2, memory = block(segment_2, memory=memory)
    >>> tuple(out_2.shape), tuple(memory.shape)
    ((1, 4, 8), (1, 4, 8))
    """

    config_keys = ("num_heads", "intermediate_dim", "key_dim", "memory_length", "dropout",
                   "activation", "layer_norm_epsilon", "norm_first", "kernel_initializer")

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        memory_length=None,
        dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        kernel_initializer="glorot_uniform",
        quantization=None,
        **kwargs,
    ):
        if memory_length is not None:
            check_positive_int("memory_length", memory_length)
        super().__init__(
            num_heads, intermediate_dim, key_dim=key_dim, dropout=dropout,
            activation=activation, layer_norm_epsilon=layer_norm_epsilon,
            norm_first=norm_first, kernel_initializer=kernel_initializer, **kwargs,
        )
        self.memory_length = memory_length
        self.quantization = check_layout_settings(quantization)
        if self.quantization is not None:
            self._init_int8_layout(intermediate_dim, **self.quantization)

    # === Build ===

    def build(self, inputs_shape):
        key_dim = resolve_key_dim(inputs_shape[-1], self.num_heads, self.key_dim)
        self.self_attention = RelativeMultiHeadAttention(
            num_heads=self.num_heads, key_dim=key_dim, dropout=self.dropout,
            name="self_attention", **self._sublayer_kwargs(),
        )
        self.self_attention.build(inputs_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.self_attention_layer_norm.build(inputs_shape)
        self.self_attention_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="self_attention_dropout"
        )
        self._build_feedforward(inputs_shape)
        if self.quantization is not None:
            self._check_int8_layout(inputs_shape[-1], key_dim)
            self._build_int8_layout()
        self.built = True

    def _sublayer_kwargs(self):
        # No `bias_initializer` argument: biases keep the Keras default, zeros.
        return dict(
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
        )

    # === Call ===

    def call(self, inputs, memory=None, padding_mask=None, use_causal_mask=True,
             training=None, inputs_mask=None, mask=None):
        # Keras fills `mask` (inputs alone) or `inputs_mask` (with memory) from the
        # implicit mask of the inputs.
        implicit_mask = mask if inputs_mask is None else inputs_mask
        if padding_mask is None:
            padding_mask = implicit_mask
        if implicit_mask is not None:
            inputs = ops.copy(inputs)  # consumed here: keep the sublayers from warning
        if memory is not None:
            memory = ops.cast(memory, inputs.dtype)  # (B, M, d)
        if self.quantization is None:
            x = self._float_call(inputs, memory, padding_mask, use_causal_mask, training)
            remembered = inputs  # (B, T, d)
        else:
            x, remembered = self._int8_block_call(inputs, memory, padding_mask,
                                                  use_causal_mask, training)

        # === Memory for the next segment: this layer's inputs, newest last ===
        if self.memory_length is None:
            new_memory = remembered  # (B, T, d)
        else:
            history = remembered if memory is None else ops.concatenate(
                [memory, remembered], axis=1)
            new_memory = history[:, -self.memory_length:]  # (B, <= memory_length, d)
        return x, ops.stop_gradient(new_memory)

    def _float_call(self, inputs, memory, padding_mask, use_causal_mask, training):
        # === Relative self-attention over [SG(memory); inputs] ===
        x = inputs  # (B, T, d)
        attention_input, attention_memory = x, memory
        if self.norm_first:
            attention_input = self.self_attention_layer_norm(x)  # (B, T, d)
            if memory is not None:
                attention_memory = self.self_attention_layer_norm(memory)  # (B, M, d)
        attention = self.self_attention(
            attention_input, memory=attention_memory, padding_mask=padding_mask,
            use_causal_mask=use_causal_mask, training=training,
        )  # (B, T, d)
        x = x + self.self_attention_dropout(attention, training=training)  # (B, T, d)
        if not self.norm_first:
            x = self.self_attention_layer_norm(x)

        # === Position-wise feed-forward ===
        return self._feedforward_sublayer(x, training)  # (B, T, d)

    # === Int8 layout (`quantization`) ===
    # `TransformerBlockBase` gives the layout its sublayers and weights (`self_attention`,
    # separate Q/K/V kernels).

    def _int8_block_call(self, inputs, memory, padding_mask, causal, training):
        """The layout's output `(B, T, d)`, and the inputs as its Q/K/V matmul reads them
        (rounded by `input_quantizer` when the block rounds a float input): what the next
        segment's memory holds, so that an int8 file stores it as QAT rounds it and rounds
        nothing else for it."""
        if memory is not None:
            memory = ops.stop_gradient(memory)  # (B, M, d)
        x = self._int8_call(inputs, _key_padding_mask(padding_mask, inputs, memory),
                            training, causal=causal, memory=memory,
                            score_terms=self._int8_score_terms(inputs, memory))  # (B, T, d)
        if self.input_quantizer is None:
            return x, inputs
        return x, self.input_quantizer(inputs, training=False)  # the call set its range

    def _int8_score_terms(self, inputs, memory):
        """The relative terms of the scores of the `T` queries over the `M + T` keys."""
        length = ops.shape(inputs)[1]  # T
        keys = length if memory is None else ops.shape(memory)[1] + length  # M + T
        return relative_score_terms(self.self_attention, length, keys)

    def compute_mask(self, inputs, mask=None, **kwargs):
        return (mask, None)
