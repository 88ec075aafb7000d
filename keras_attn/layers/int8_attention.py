"""`Int8Attention`: the attention of `EncoderInt8Layout` (self-attention with its cache or
a memory, cross-attention with its cache), fake-quantized where the int8 TFLite file rounds,
and `relative_score_terms`, Transformer-XL's relative terms beside its int8 matmuls."""

import math

from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.int8_layout_settings import CROSS_QUANTIZER_NAMES
from keras_attn.layers.int8_layout_settings import SOFTMAX_RANGE
from keras_attn.layers.quantized_layer_normalization import layer_norm_quantizers
from keras_attn.layers.relative_multi_head_attention import relative_shift
from keras_attn.layers.relative_multi_head_attention import relative_sinusoids


class Int8Attention:
    """The attention sublayers of `EncoderInt8Layout` (see its docstring): the int8 Q/K/V,
    query, key/value and output matmuls, heads by reshape and transpose, scores,
    probabilities and context rounded by the host's quantizers. The host defines
    `_matmul`, `quantizers`, `num_heads` and the dropout sublayers."""

    def _add_cross_quantizers(self):
        """The quantizers of the cross-attention sublayer (as `_init_int8_layout` makes the
        others), and every quantizer's rounding set again for the block's matmuls."""
        residual_quantize = self.quantize and not self.float_residual
        self.quantizers.update({name: ActivationQuantizer(decay=self.decay, name=name)
                                for name in CROSS_QUANTIZER_NAMES})
        self.cross_layer_norm_quantizers = layer_norm_quantizers(
            "cross_attention_layer_norm", self.decay, residual_quantize)
        self.cross_score_quantizer = ActivationQuantizer(
            decay=self.decay, mask_margin=self.attention_mask_margin,
            masked_value=self.masked_score, quantize=residual_quantize,
            name="cross_score_quantizer")
        self.cross_probability_quantizer = ActivationQuantizer(
            fixed_range=SOFTMAX_RANGE, quantize=residual_quantize,
            name="cross_probability_quantizer")
        self._set_quantize_flags()

    def _query_scale(self, hidden_dim):
        # 1/sqrt(d) scales the query columns of the fused kernel (folded into the int8
        # weights by the converter) instead of the scores.
        d = hidden_dim // self.num_heads
        return ops.concatenate([
            ops.full((hidden_dim,), 1.0 / math.sqrt(d), dtype="float32"),
            ops.ones((2 * hidden_dim,), "float32"),
        ])  # (3H,)

    def _int8_attention(self, x, w, batch, length, padding_mask, training, query_length=None,
                        causal=False, caches=None, score_terms=None, memory=None):
        """Self-attention of the int8 rows `x` `(B*T, H)` with the weights `w` (read once
        per call, `_int8_weights()`): the output projection's rounded output `(B*q, H)`,
        after its dropout. `padding_mask`: `(B, T)` real keys, or `(B, T, T)` the keys each
        query sees. With `caches` (see `_int8_call`) the keys and values are the cache's,
        this call's written at `caches["index"]`. `score_terms`: see `_attend`. `memory`
        (Transformer-XL): `(B, M, H)` rows before the segment, keys and values only (see
        `_memory_keys`); `padding_mask` is then `(B, M + T)`, and causal query `t` sees
        the whole memory and the segment up to itself."""
        q = self.quantizers
        H = x.shape[-1]
        rows = length if query_length is None else query_length  # q, the query rows
        scale = self._query_scale(H)  # (3H,)
        qkv = self._matmul(x, w["qkv_kernel"] * scale, w["qkv_bias"] * scale, "qkv")
        qkv = q["qkv_quantizer"](qkv, training=training)
        # One SPLIT, not three strided slices of a (B, T, 3, n, d) view: XNNPACK takes
        # SPLIT, and the slices cut its graph (fp32 TFLite L4/H256, T=128: 10 -> 6
        # partitions, 13.2 -> 10.5 ms).
        query, key, value = ops.split(qkv, 3, axis=-1)  # 3 x (B*T, H)
        if query_length is not None:
            # Only the first q rows are read later (the [CLS] row of a classifier's last
            # block): they alone are queries, and the rest of the block runs on q rows.
            query = ops.reshape(query, (batch, length, H))[:, :query_length]  # (B, q, H)
        memory_length = None
        keys = length  # T, M + T with a memory, or S_max with a cache
        if memory is not None:
            memory_length = ops.shape(memory)[1]  # M
            key, value = self._memory_keys(memory, key, value, w, scale, batch, length,
                                           training)  # 2 x (B*(M + T), H)
            keys = memory_length + length
        key_mask = _key_mask(padding_mask, keys, causal, memory_length)
        if caches is not None:
            key, value, key_mask, keys = self._cached_keys(key, value, batch, length,
                                                           padding_mask, causal, caches)
        context = self._attend(
            query, key, value, (batch, rows, keys), key_mask,
            (self.score_quantizer, self.probability_quantizer, q["context_quantizer"]),
            training, score_terms)  # (B*q, H)
        attended = self._matmul(context, w["output_kernel"], w["output_bias"],
                                "attention_output")  # (B*q, H)
        attended = q["attention_output_quantizer"](attended, training=training)
        return self.attention_output_dropout_layer(attended, training=training)

    def _memory_keys(self, memory, key, value, w, scale, batch, length, training):
        """The keys and values of `[memory; segment]` `(B*(M + T), H)`: the segment's
        `key`, `value` `(B*T, H)` after those of the memory rows `(B, M, H)`, which the same
        Q/K/V matmul and `qkv_quantizer` give (their query columns sliced off). One matmul per
        input, each reading its rows at their own int8 scale (pre-LN: `LN(memory)`, at the
        segment's; post-LN: the memory's producer's, whose step the block does not know, so
        that its bias is left off the file's int32 grid, a fraction of an output step),
        rather than one over their CONCATENATION, which would round both to one scale
        first."""
        H = key.shape[-1]
        memory_length = ops.shape(memory)[1]  # M
        memory_qkv = self._matmul(ops.reshape(memory, (-1, H)), w["qkv_kernel"] * scale,
                                  w["qkv_bias"] * scale, "qkv",
                                  own_input=getattr(self, "norm_first", False))
        memory_qkv = self.quantizers["qkv_quantizer"](memory_qkv, training=training)
        # A slice, then a SPLIT in two: a SPLIT in three would leave its query output
        # unread, which the converter then gives a scale of its own.
        memory_key, memory_value = ops.split(memory_qkv[:, H:], 2, axis=-1)  # 2 x (B*M, H)

        def keys(of_memory, of_segment):  # -> (B*(M + T), H)
            return ops.reshape(ops.concatenate(
                [ops.reshape(of_memory, (batch, memory_length, H)),
                 ops.reshape(of_segment, (batch, length, H))], axis=1), (-1, H))

        return keys(memory_key, key), keys(memory_value, value)

    def _cached_keys(self, key, value, batch, length, padding_mask, causal, caches):
        """This call's `key` and `value` rows `(B*T, H)` written into the cache at
        `caches["index"]` (the updated cache into `caches["self"]`): the cache's keys and
        values `(B*S_max, H)`, which of them each query sees `(B, 1, T, S_max)`, `S_max`."""
        H = key.shape[-1]
        n = self.num_heads
        cache, index = caches["self"], caches["index"]
        written = ops.stack([ops.reshape(key, (batch, length, n, H // n)),
                             ops.reshape(value, (batch, length, n, H // n))],
                            axis=1)  # (B, 2, T, n, d)
        cache = ops.slice_update(cache, (0, 0, index, 0, 0), written)  # (B, 2, S_max, n, d)
        caches["self"] = cache
        keys = cache.shape[2]
        key_mask = _cached_key_mask(padding_mask, index, length, keys, causal)
        return (ops.reshape(cache[:, 0], (-1, H)), ops.reshape(cache[:, 1], (-1, H)),
                key_mask, keys)

    def _int8_cross_attention(self, x, w, batch, rows, cross, training, caches=None):
        """Cross-attention of the int8 rows `x` `(B*q, H)` over `cross`, the encoder output
        `(B, S, E)` and its padding mask `(B, S)`: the output projection's rounded output
        `(B*q, H)`, after its dropout. The encoder output is rounded by the block
        (`encoder_quantizer`) for the key/value matmul `(E, 2H)`; with `caches` the keys
        and values are `caches["cross"]` or, without it, projected into it."""
        q = self.quantizers
        H = x.shape[-1]
        encoder, encoder_padding_mask = cross
        scale = 1.0 / math.sqrt(H // self.num_heads)
        query = self._matmul(x, w["cross_query_kernel"] * scale,
                             w["cross_query_bias"] * scale, "cross_query")  # (B*q, H)
        query = q["cross_query_quantizer"](query, training=training)
        cache = None if caches is None else caches["cross"]
        if cache is None:
            cache = self._int8_cross_cache(encoder, w, training)  # (B, 2, S, n, d)
        if caches is not None:
            caches["cross"] = cache
        length = ops.shape(cache)[2]  # S
        key, value = (ops.reshape(cache[:, i], (-1, H)) for i in (0, 1))  # 2 x (B*S, H)
        context = self._attend(
            query, key, value, (batch, rows, length),
            _key_mask(encoder_padding_mask, length, causal=False),
            (self.cross_score_quantizer, self.cross_probability_quantizer,
             q["cross_context_quantizer"]), training)  # (B*q, H)
        attended = self._matmul(context, w["cross_output_kernel"], w["cross_output_bias"],
                                "cross_attention_output")  # (B*q, H)
        attended = q["cross_attention_output_quantizer"](attended, training=training)
        return self.cross_attention_output_dropout_layer(attended, training=training)

    def _int8_cross_cache(self, encoder, w, training=None):
        """The encoder output `(B, S, E)` rounded (`encoder_quantizer`) and projected by the
        int8 key/value matmul: the `(B, 2, S, n, d)` cross cache (keys, then values)."""
        q = self.quantizers
        batch, length = ops.shape(encoder)[0], ops.shape(encoder)[1]
        n = self.num_heads
        encoder = q["encoder_quantizer"](
            ops.reshape(encoder, (-1, encoder.shape[-1])), training=training)  # (B*S, E)
        w = w or self._int8_weights()
        key_value = self._matmul(encoder, w["cross_key_value_kernel"],
                                 w["cross_key_value_bias"], "cross_key_value")  # (B*S, 2H)
        key_value = q["cross_key_value_quantizer"](key_value, training=training)
        H = key_value.shape[-1] // 2
        return ops.transpose(ops.reshape(key_value, (batch, length, 2, n, H // n)),
                             (0, 2, 1, 3, 4))  # (B, 2, S, n, d)

    def _attend(self, query, key, value, sizes, key_mask, quantizers, training,
                score_terms=None):
        """`softmax(Q K^T + M) V` by heads: `query` `(B*q, H)` or `(B, q, H)`, `key` and
        `value` `(B*T, H)`, `sizes` `(B, q, T)`, `quantizers` of the scores, the
        probabilities and the context; the rounded context rows `(B*q, H)`.
        `score_terms(query)`, given the (scaled) query heads `(B, n, q, d)`, returns the
        query the keys are scored with and a bias `(B, n, q, T)` added to the scores (or
        `None`): the relative terms of Transformer-XL's and XLNet's attention
        (`relative_score_terms`)."""
        score_quantizer, probability_quantizer, context_quantizer = quantizers
        batch, rows, length = sizes
        H = key.shape[-1]
        n = self.num_heads
        d = H // n

        def heads(x, rows, order):
            return ops.transpose(ops.reshape(x, (batch, rows, n, d)), order)

        query = heads(query, rows, (0, 2, 1, 3))  # (B, n, q, d)
        key_t = heads(key, length, (0, 2, 3, 1))  # (B, n, d, T)
        value = heads(value, length, (0, 2, 1, 3))  # (B, n, T, d)
        bias = None
        if score_terms is not None:
            query, bias = score_terms(query)  # (B, n, q, d), (B, n, q, T)
        scores = ops.matmul(query, key_t)  # (B, n, q, T)
        if bias is not None:
            scores = scores + bias
        scores = score_quantizer(scores, stats_mask=key_mask, training=training)
        probs = probability_quantizer(ops.softmax(scores, axis=-1))  # (B, n, q, T)
        probs = self.attention_dropout_layer(probs, training=training)
        context = ops.matmul(probs, value)  # (B, n, q, d)
        context = context_quantizer(context, training=training)
        return ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, H))  # (B*q, H)


def _key_mask(padding_mask, length, causal, memory_length=None):
    """Which keys each query sees, `(B, 1, 1, T)` or `(B or 1, 1, q, T)` bool (`None`: all):
    the real tokens of `padding_mask` `(B, T)` (or, `(B, q, T)`, the keys each query sees)
    and, `causal`, keys `s <= t`. With `memory_length` `M` the queries are the last
    `q = T - M` keys (query `t` is key `M + t`): causal, it sees keys `s <= M + t`."""
    mask = None
    if padding_mask is not None:
        mask = ops.cast(padding_mask, "bool")
        mask = mask[:, None] if len(mask.shape) == 3 else mask[:, None, None, :]
    if causal:
        keys = ops.arange(length)  # (T,)
        queries = keys if memory_length is None else (
            ops.arange(length - memory_length) + memory_length)  # (q,): their key positions
        allowed = (keys[None, :] <= queries[:, None])[None, None]  # (1, 1, q, T)
        mask = allowed if mask is None else ops.logical_and(mask, allowed)
    return mask


def relative_score_terms(attention, query_length, key_length):
    """Transformer-XL's relative terms (Dai et al., 2019, §3.3) as `Int8Attention._attend`'s
    `score_terms`, for `query_length` `T` queries, the last of `key_length` `S` keys
    (`[memory; segment]`), from a `RelativeMultiHeadAttention`'s weights:

        A_ij = (q_i + u)^T k_j + shift((q_i + v)^T W_{k,R} R)_ij

    Given the query heads `(B, n, T, d)` (scaled by `1/sqrt(d)`, as the layout's query
    columns are; the biases `u`, `v` are scaled alike), `terms` returns `q + u` (what the
    int8 keys are scored with) and the position scores `(B, n, T, S)`: `(q + v) P` with
    `P = (W_{k,R} R)^T` `(n, d, S + T - 1)` over the distances `S - 1 .. -(T - 1)` (the
    float layer's table, exact causal or not; a constant of a fixed-length file), moved
    onto the keys by `relative_shift`. Computed in float beside the int8 matmuls."""
    scale = 1.0 / math.sqrt(attention.key_dim)

    def bias(weight):  # (n, d) -> (1, n, 1, d), scaled
        return ops.convert_to_tensor(weight)[None, :, None, :] * scale

    table = relative_sinusoids(key_length - 1, key_length + query_length - 1,
                               attention.position_dense.kernel.shape[0])  # (R, D)
    positions = ops.einsum("rD,Dnd->ndr", table,
                           ops.convert_to_tensor(attention.position_dense.kernel))  # (n, d, R)

    def terms(query):
        scores = ops.matmul(query + bias(attention.position_bias), positions)  # (B, n, T, R)
        return (query + bias(attention.content_bias),
                relative_shift(scores, key_length))  # (B, n, T, d), (B, n, T, S)

    return terms


def _cached_key_mask(padding_mask, index, length, keys, causal):
    """Which of the `keys` cache slots each of the `length` queries at positions
    `index, index + 1, ...` sees, `(B or 1, 1, T or 1, S_max)` bool: the slots written so
    far (with `causal`, up to the query's position) that `padding_mask` `(B, S_max)` marks
    real."""
    index = ops.cast(index, "int32")
    slots = ops.arange(keys, dtype="int32")[None, :]  # (1, S_max)
    if causal:
        queries = ops.arange(length, dtype="int32") + index  # (T,)
        allowed = slots <= queries[:, None]  # (T, S_max)
    else:
        allowed = slots < index + length  # (1, S_max)
    mask = allowed[None, None]  # (1, 1, T or 1, S_max)
    if padding_mask is not None:
        mask = ops.logical_and(mask, ops.cast(padding_mask, "bool")[:, None, None, :])
    return mask
