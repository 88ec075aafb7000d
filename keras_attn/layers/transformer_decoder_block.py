import keras
from keras import ops

from keras_attn.layers.attention_mask import and_masks
from keras_attn.layers.encoder_int8_layout import EncoderInt8Layout
from keras_attn.layers.int8_layout_settings import check_layout_settings
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.transformer_block_base import TransformerBlockBase
from keras_attn.layers.transformer_block_base import flat_bias
from keras_attn.layers.transformer_block_base import resolve_key_dim


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(EncoderInt8Layout, TransformerBlockBase):
    """Transformer decoder block (Vaswani et al., 2017, §3.1, "Attention Is All You Need").

    Three sublayers, each with a residual connection and a layer normalization: masked
    (causal) self-attention, encoder-decoder (cross) attention whose queries come from the
    decoder and keys/values from the encoder output (Q = X_dec W^Q, K = X_enc W^K,
    V = X_enc W^V), and the position-wise feed-forward network:

        post-LN (default)                          pre-LN (`norm_first=True`)
        y = LN(x + Dropout(SelfAttn(x)))           y = x + Dropout(SelfAttn(LN(x)))
        u = LN(y + Dropout(CrossAttn(y, enc)))     u = y + Dropout(CrossAttn(LN(y), enc))
        z = LN(u + Dropout(FFN(u)))                z = u + Dropout(FFN(LN(u)))

        FFN(u) = W_2 act(W_1 u + b_1) + b_2

    The cross-attention sublayers exist only when the block is built with an encoder
    sequence (its first call passes `encoder_sequence`, or `build(decoder_shape,
    encoder_shape)`). Built from the decoder sequence alone it is a GPT-style decoder-only
    block (Radford et al., 2018/2019) with two sublayers.

    Sublayers (names used by checkpoint importers): `self_attention`,
    `self_attention_layer_norm`, `self_attention_dropout`, `cross_attention`,
    `cross_attention_layer_norm`, `cross_attention_dropout` (encoder-decoder blocks only),
    `feedforward_intermediate_dense`, `feedforward_output_dense`, `feedforward_layer_norm`,
    `feedforward_dropout`.

    Incremental decoding: pass `self_attention_cache`, a `(B, 2, S_max, H, d_k)` tensor
    (zeros at the start) and `self_attention_cache_update_index` (the position of the
    first token of this call). The block writes this step's keys/values into the cache,
    attends causally over the positions written so far and returns the updated cache. For
    encoder-decoder blocks the encoder keys/values are projected once into a
    `(B, 2, S_enc, H, d_k)` `cross_attention_cache` (`compute_cross_attention_cache`, or
    automatically on a cached call that gives `encoder_sequence` but no cross cache) and
    reused at every step; the encoder sequence is then no longer needed. Caches are plain
    tensors in and out of `call`, so a decoding step can be exported.

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
            `"gelu_approximate"` (tanh approximation of GELU, GPT-2). Exact GELU
            (`"gelu"`, built on `erf`) does not convert with tf2onnx; the tanh
            approximation does. Defaults to `"relu"` (the paper).
        layer_norm_epsilon: float > 0, the epsilon of the layer normalizations.
            Defaults to `1e-5`.
        norm_first: bool, pre-LN instead of post-LN. Defaults to `False`.
        fused_qkv: bool, one fused Q/K/V kernel in each attention (see
            `MultiHeadAttention`; cross-attention then needs the encoder and decoder
            widths to be equal). Defaults to `False`.
        kernel_initializer: initializer for every kernel. Defaults to `"glorot_uniform"`.
        bias_initializer: initializer for every bias. Defaults to `"zeros"`.
        quantization: optional dict of int8 layout settings (`EncoderInt8Layout`), for
            quantization-aware training of the block in the layout of its int8 TFLite
            file, on the same weights, as `TransformerEncoderBlock`'s: decoder-only (GPT's)
            or with cross-attention (its query, key/value and output matmuls int8, the
            encoder output rounded for the key/value matmul), over a whole sequence or a
            step with the caches (their keys and values are the int8 ones). No
            `self_attention_mask` or scores. Defaults to `None` (float).
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        decoder_sequence: `(B, T, d_model)` decoder input.
        encoder_sequence: optional `(B, S_enc, d_enc)` encoder output (encoder-decoder
            blocks; may be omitted when `cross_attention_cache` is given).
        decoder_padding_mask: optional `(B, T)`, True/1 for real decoder tokens. With a
            self-attention cache it masks the cache's keys, so give it as `(B, S_max)`.
        encoder_padding_mask: optional `(B, S_enc)`, True/1 for real encoder tokens.
        self_attention_mask: optional boolean `(B, T, T)` (or `(B, T, S_max)` with a
            cache) for the self-attention, AND-ed with the other masks.
        use_causal_mask: bool, causal self-attention. Defaults to `True`.
        self_attention_cache: optional `(B, 2, S_max, H, d_k)` key/value cache.
        self_attention_cache_update_index: int or scalar tensor, required with
            `self_attention_cache`: where this call's keys/values are written.
        cross_attention_cache: optional `(B, 2, S_enc, H, d_k)` precomputed encoder
            keys/values (from `compute_cross_attention_cache`).
        return_attention_scores: bool, also return the attention probabilities.
        training: bool, enables dropout.
        decoder_sequence_mask, encoder_sequence_mask, mask: Keras implicit masks of the
            inputs (Keras fills `mask` when `decoder_sequence` is the only tensor
            argument). Do not pass them; they are AND-ed with the explicit padding masks.
            With a self-attention cache the keys are the cache slots, so give their
            padding as `decoder_padding_mask` `(B, S_max)` rather than relying on a Keras
            mask of this step's tokens.

    Returns:
        `(B, T, d_model)` outputs; then, in this order and only when asked:
        - with `return_attention_scores`, a dict of probabilities
          `{"self_attention": (B, H, T, S), "cross_attention": (B, H, T, S_enc)}` (the
          second key only for encoder-decoder blocks);
        - with `self_attention_cache`, the updated `self_attention_cache` and, for
          encoder-decoder blocks only, the `cross_attention_cache`. A decoder-only block
          returns `(outputs, self_attention_cache)`: the cross cache is omitted, not
          `None`, so every returned item is a tensor (exportable signatures).
        A single output is returned bare, several as a tuple.

    Example:
    >>> block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    >>> decoder_in, encoder_out = keras.ops.ones((2, 4, 8)), keras.ops.ones((2, 6, 8))
    >>> tuple(block(decoder_in, encoder_out).shape)
    (2, 4, 8)
    >>> cache = keras.ops.zeros((2, 2, 4, 2, 4))  # (B, 2, S_max, H, d_k)
    >>> cross_cache = block.compute_cross_attention_cache(encoder_out)
    >>> out, cache, cross_cache = block(
    ...     decoder_in[:, :1], self_attention_cache=cache,
    ...     self_attention_cache_update_index=0, cross_attention_cache=cross_cache)
    >>> tuple(out.shape), tuple(cache.shape)
    ((2, 1, 8), (2, 2, 4, 2, 4))
    """

    def __init__(self, num_heads, intermediate_dim, *args, quantization=None, **kwargs):
        super().__init__(num_heads, intermediate_dim, *args, **kwargs)
        self.quantization = check_layout_settings(quantization)
        if self.quantization is not None:
            self._init_int8_layout(intermediate_dim, **self.quantization)

    # === Build ===

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None,
              cross_attention_cache_shape=None):
        d_model = decoder_sequence_shape[-1]
        if encoder_sequence_shape is None and cross_attention_cache_shape is not None:
            # A first call with the projected encoder keys/values `(B, 2, S, H, dk)` alone
            # (a decoding step's graph): an encoder-decoder block, whose encoder width is
            # taken to be `d_model` (the encoder-decoder Transformer's).
            encoder_sequence_shape = (cross_attention_cache_shape[0],
                                      cross_attention_cache_shape[2], d_model)
        key_dim = resolve_key_dim(d_model, self.num_heads, self.key_dim)
        self.self_attention = self._attention("self_attention", key_dim)
        self.self_attention.build(decoder_sequence_shape)
        self.self_attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.self_attention_layer_norm.build(decoder_sequence_shape)
        self.self_attention_dropout = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name="self_attention_dropout"
        )
        self.cross_attention = None
        self.cross_attention_layer_norm = None
        self.cross_attention_dropout = None
        if encoder_sequence_shape is not None:
            self.cross_attention = self._attention("cross_attention", key_dim)
            self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
            self.cross_attention_layer_norm = self._layer_norm("cross_attention_layer_norm")
            self.cross_attention_layer_norm.build(decoder_sequence_shape)
            self.cross_attention_dropout = keras.layers.Dropout(
                self.dropout, dtype=self.dtype_policy, name="cross_attention_dropout"
            )
        self._build_feedforward(decoder_sequence_shape)
        if self.quantization is not None:
            self._check_int8_layout(d_model, key_dim)
            self._build_int8_layout()
        self.built = True

    # The cross-attention sublayers the int8 layout reads.
    cross_attention_output_dropout_layer = property(lambda self: self.cross_attention_dropout)

    def _int8_weights(self):
        """The layout's weights (`EncoderInt8Layout`) and, with cross-attention, its query
        kernel `(H, H)`, key/value kernel `(E, 2H)` (the K columns, then the V columns),
        output kernel `(H, H)`, their biases and its LayerNorm's."""
        weights = super()._int8_weights()
        attention = self.cross_attention
        if attention is None:
            return weights
        d_model = attention.output_dense.kernel.shape[-1]

        def columns(kernel):  # (rows, H, dk) -> (rows, H * dk)
            return ops.reshape(kernel, (kernel.shape[0], -1))

        if self.fused_qkv:  # (d, 3, H, dk): unstacked, not sliced (see MultiHeadAttention)
            # (The variables as tensors first: JAX does not unstack a Keras variable.)
            query, key, value = ops.unstack(ops.convert_to_tensor(attention.qkv_kernel), axis=1)
            biases = ([None] * 3 if attention.qkv_bias is None
                      else ops.unstack(ops.convert_to_tensor(attention.qkv_bias), axis=0))
        else:
            projections = (attention.query_dense, attention.key_dense, attention.value_dense)
            query, key, value = (p.kernel for p in projections)
            biases = [p.bias for p in projections]
        query_bias, key_bias, value_bias = (flat_bias(b, d_model) for b in biases)
        return dict(
            weights,
            cross_query_kernel=columns(query), cross_query_bias=query_bias,
            cross_key_value_kernel=ops.concatenate([columns(key), columns(value)], axis=1),
            cross_key_value_bias=ops.concatenate([key_bias, value_bias]),
            cross_output_kernel=ops.reshape(attention.output_dense.kernel, (d_model, d_model)),
            cross_output_bias=flat_bias(attention.output_dense.bias, d_model),
            cross_gamma=self.cross_attention_layer_norm.gamma,
            cross_beta=self.cross_attention_layer_norm.beta,
        )

    def _attention(self, name, key_dim):
        return MultiHeadAttention(
            num_heads=self.num_heads, key_dim=key_dim, dropout=self.attention_dropout,
            fused_qkv=self.fused_qkv, name=name, **self._sublayer_kwargs(),
        )

    # === Call ===

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_mask=None,
        use_causal_mask=True,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
        decoder_sequence_mask=None,
        encoder_sequence_mask=None,
        mask=None,
    ):
        has_cross = self.cross_attention is not None
        self._check_call_arguments(
            encoder_sequence, self_attention_cache, self_attention_cache_update_index,
            cross_attention_cache,
        )
        # A Keras mask covers this call's T tokens; with a cache the keys are the S_max
        # cache slots, whose padding only `decoder_padding_mask` can describe.
        if self_attention_cache is None:
            decoder_padding_mask = and_masks(
                decoder_padding_mask, decoder_sequence_mask, mask
            )  # (B, T)
        encoder_padding_mask = and_masks(encoder_padding_mask, encoder_sequence_mask)
        if self.quantization is not None:
            self._check_int8_call(attention_mask=self_attention_mask,
                                  return_attention_scores=return_attention_scores)
            return self._int8_decoder_call(
                decoder_sequence, encoder_sequence, decoder_padding_mask,
                encoder_padding_mask, use_causal_mask, self_attention_cache,
                self_attention_cache_update_index, cross_attention_cache, training)
        scores = {}

        # === Masked self-attention sublayer ===
        residual = decoder_sequence  # (B, T, d)
        x = self.self_attention_layer_norm(residual) if self.norm_first else residual
        result = self.self_attention(
            x, padding_mask=decoder_padding_mask, attention_mask=self_attention_mask,
            use_causal_mask=use_causal_mask, cache=self_attention_cache,
            cache_update_index=self_attention_cache_update_index,
            return_attention_scores=return_attention_scores, training=training,
        )
        attended, scores["self_attention"], self_attention_cache = _unpack(
            result, return_attention_scores, self_attention_cache is not None
        )  # (B, T, d), (B, H, T, S), (B, 2, S_max, H, dk)
        x = ops.add(residual, self.self_attention_dropout(attended, training=training))
        if not self.norm_first:
            x = self.self_attention_layer_norm(x)  # (B, T, d)

        # === Encoder-decoder (cross) attention sublayer ===
        if has_cross:
            x, scores["cross_attention"], cross_attention_cache = self._cross_attention_sublayer(
                x, encoder_sequence, encoder_padding_mask, cross_attention_cache,
                self_attention_cache is not None, return_attention_scores, training,
            )  # (B, T, d), (B, H, T, S_enc), (B, 2, S_enc, H, dk)

        # === Feed-forward sublayer ===
        x = self._feedforward_sublayer(x, training)  # (B, T, d)

        outputs = (x,)
        if return_attention_scores:
            outputs += (scores,)
        if self_attention_cache is not None:
            outputs += (self_attention_cache,)
            if has_cross:
                outputs += (cross_attention_cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _int8_decoder_call(self, decoder_sequence, encoder_sequence, decoder_padding_mask,
                           encoder_padding_mask, use_causal_mask, self_attention_cache,
                           cache_update_index, cross_attention_cache, training):
        """`call` in the int8 layout: the output, and with a self-attention cache the
        updated caches, as the float block returns them."""
        has_cross = self.cross_attention is not None
        cross = (encoder_sequence, encoder_padding_mask) if has_cross else None
        if self_attention_cache is None:
            return self._int8_call(decoder_sequence, decoder_padding_mask, training,
                                   causal=use_causal_mask, cross=cross)
        caches = {"self": self_attention_cache, "index": cache_update_index,
                  "cross": cross_attention_cache}
        x = self._int8_call(decoder_sequence, decoder_padding_mask, training,
                            causal=use_causal_mask, cross=cross, caches=caches)
        return (x, caches["self"]) + ((caches["cross"],) if has_cross else ())

    def _cross_attention_sublayer(self, x, encoder_sequence, encoder_padding_mask,
                                  cross_attention_cache, decoding, return_attention_scores,
                                  training):
        """`(x, scores, cross cache)` after the residual cross-attention sublayer; while
        decoding with a cache, the encoder output is projected once into the cross cache."""
        if decoding and cross_attention_cache is None:
            cross_attention_cache = self.compute_cross_attention_cache(
                encoder_sequence
            )  # (B, 2, S_enc, H, dk)
        residual = x  # (B, T, d)
        if self.norm_first:
            x = self.cross_attention_layer_norm(x)
        result = self.cross_attention(
            x, value=encoder_sequence, padding_mask=encoder_padding_mask,
            cache=cross_attention_cache,
            return_attention_scores=return_attention_scores, training=training,
        )
        attended, scores, cross_attention_cache = _unpack(
            result, return_attention_scores, cross_attention_cache is not None
        )  # (B, T, d), (B, H, T, S_enc), (B, 2, S_enc, H, dk)
        x = ops.add(residual, self.cross_attention_dropout(attended, training=training))
        if not self.norm_first:
            x = self.cross_attention_layer_norm(x)  # (B, T, d)
        return x, scores, cross_attention_cache

    def _check_call_arguments(
        self, encoder_sequence, self_attention_cache, cache_update_index, cross_cache
    ):
        uses_encoder = encoder_sequence is not None or cross_cache is not None
        if uses_encoder and self.cross_attention is None:
            raise ValueError(
                "This TransformerDecoderBlock was built without an encoder sequence, so it "
                "is decoder-only and has no cross-attention. Pass `encoder_sequence` on the "
                "first call (or to `build`) to make an encoder-decoder block. Received: "
                f"encoder_sequence={_describe(encoder_sequence)}, "
                f"cross_attention_cache={_describe(cross_cache)}"
            )
        if self.cross_attention is not None and not uses_encoder:
            raise ValueError(
                "This TransformerDecoderBlock has cross-attention, so it needs "
                "`encoder_sequence` or `cross_attention_cache`. Received: "
                "encoder_sequence=None, cross_attention_cache=None"
            )
        if self_attention_cache is not None and cache_update_index is None:
            raise ValueError(
                "`self_attention_cache_update_index` (where this call's keys/values are "
                "written in the cache) is required with `self_attention_cache`. "
                "Received: self_attention_cache_update_index=None"
            )

    def compute_cross_attention_cache(self, encoder_sequence):
        """Projects the encoder output once into a `(B, 2, S_enc, H, d_k)` cache.

        Keys are `[:, 0]` and values `[:, 1]`; pass the result as `cross_attention_cache`
        at every decoding step instead of re-projecting `encoder_sequence`.
        """
        if self.cross_attention is None:
            raise ValueError(
                "This TransformerDecoderBlock is decoder-only (built without an encoder "
                "sequence), so it has no cross-attention cache. Received: "
                f"encoder_sequence={_describe(encoder_sequence)}"
            )
        if self.quantization is not None:
            return self._int8_cross_cache(encoder_sequence, None)  # (B, 2, S_enc, H, dk)
        return self.cross_attention.compute_cross_attention_cache(encoder_sequence)


def _unpack(result, has_scores, has_cache):
    """`(output, scores or None, cache or None)` from a `MultiHeadAttention` result."""
    if not has_scores and not has_cache:
        return result, None, None
    result = list(result)
    output = result.pop(0)
    scores = result.pop(0) if has_scores else None
    cache = result.pop(0) if has_cache else None
    return output, scores, cache


def _describe(tensor):
    return None if tensor is None else f"<tensor of shape {tuple(tensor.shape)}>"
