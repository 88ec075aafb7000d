"""`MultiHeadAttention`'s per-head attention: the `_compute_attention` hook and its masks."""

import keras
from keras import ops

from keras_attn.layers.attention_mask import merge_attention_masks
from keras_attn.layers.scaled_dot_product_attention import masked_softmax
from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention

# Keras' words first, as its layer raises it.
_FLASH_SCORES_ERROR = (
    "Returning attention scores is not supported when flash attention is enabled. Please "
    "disable flash attention to access attention scores: call with "
    "`return_attention_scores=False` or build the layer with `flash_attention=False`. "
    "Received: return_attention_scores=True"
)


class AttentionScoresMixin:
    """`MultiHeadAttention`'s attention on projected heads (a mixin of the layer): Keras'
    hooks `_build_attention`, `_compute_attention` (the one subclasses override) and
    `_masked_softmax`, and the causal-mask helpers overrides share.
    """

    def _build_attention(self, rank):
        """Keras' hook: builds what `_compute_attention` and its overrides use.

        `_compute_attention` always receives `(B, T, H, d)` tensors (several attention axes
        are folded into one first, see `AxesFolding`), so `rank` is 4 and attention runs
        over axis 1, with Keras' equations for that case: `_dot_product_equation`
        `(B, S, H, dk), (B, T, H, dk) -> (B, H, T, S)` and `_combine_equation`
        `(B, H, T, S), (B, S, H, dv) -> (B, T, H, dv)`; `_dropout_layer` drops
        probabilities.
        """
        if rank != 4:
            raise ValueError(
                "`_compute_attention` of keras_attn's MultiHeadAttention receives "
                "(batch, length, num_heads, head_dim) tensors whatever the inputs' rank (the "
                "attention axes are folded into one), so `_build_attention` takes rank 4. "
                f"Received: rank={rank}"
            )
        self._dot_product_equation = "aecd,abcd->acbe"
        self._combine_equation = "acbe,aecd->abcd"
        self._dropout_layer = keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy
        )

    def _compute_attention(
        self, query, key, value, attention_mask=None, training=None,
        return_attention_scores=False, use_causal_mask=False, attention_bias=None,
        query_start_index=None,
    ):
        """The override hook: per-head attention on projected tensors (Keras' signature).

        `call` merges every mask source (the causal one included) into `attention_mask`
        before calling it, so an override only receives `use_causal_mask=True` when it is
        called directly. Our extras come after Keras' arguments and `call` passes them
        only when set, so an override with Keras' signature works.

        Args:
            query: `(B, T, H, d_k)`. key: `(B, S, H, d_k)`. value: `(B, S, H, d_v)`.
            attention_mask: boolean broadcastable to `(B, T, S)` or `(B, H, T, S)`, or
                `None`.
            training: bool, enables attention dropout.
            return_attention_scores: bool, whether the caller uses the probabilities.
                They are formed anyway, except by flash attention, which refuses it.
            use_causal_mask: bool, AND the causal mask (query `i` at key position
                `query_start_index + i`, `i` without an index) into `attention_mask`.
            attention_bias: float broadcastable to `(B, H, T, S)`, or `None`.
            query_start_index: with a cache, the absolute position of query 0 among the
                keys; `None` otherwise. Relative-position subclasses use it.

        Returns:
            `(output, probabilities)`: `(B, T, H, d_v)` and `(B, H, T, S)` (`None` with
            flash attention).
        """
        scale = self._inverse_sqrt_key_dim
        attention_mask = self._add_causal_mask(
            query, key, attention_mask, use_causal_mask, query_start_index
        )  # (B, T, S) or (B, H, T, S)
        if self._use_flash_attention:
            if return_attention_scores:
                raise ValueError(_FLASH_SCORES_ERROR)
            # The backend's fused kernel, as Keras: no probabilities, a fully masked query
            # row averages all values (see the class docstring).
            if attention_mask is not None and len(attention_mask.shape) == 3:
                attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
            if attention_bias is not None:
                attention_bias = ops.cast(attention_bias, query.dtype)
            output = ops.dot_product_attention(
                query, key, value, bias=attention_bias, mask=attention_mask, scale=scale,
                flash_attention=True,
            )  # (B, T, H, dv)
            return output, None
        return scaled_dot_product_attention(
            query, key, value, attention_mask=attention_mask,
            attention_bias=attention_bias, scale=scale,
            dropout=lambda p: self._dropout_layer(p, training=training),
        )

    def _mask_start(self, query_start_index):
        """The position of query 0 among the keys for masks: the cache index when given;
        else `0` as in Keras, or `None` (the queries are the last keys) for
        `_queries_end_aligned` subclasses."""
        if query_start_index is None and not self._queries_end_aligned:
            return 0
        return query_start_index

    def _add_causal_mask(self, query, key, attention_mask, use_causal_mask, query_start_index):
        """`attention_mask` AND the causal mask when `_compute_attention` is asked for it."""
        if not use_causal_mask:
            return attention_mask
        return merge_attention_masks(
            ops.shape(query)[1], ops.shape(key)[1], attention_mask=attention_mask,
            use_causal_mask=True, query_start_index=self._mask_start(query_start_index),
        )  # (B, T, S) or (B, H, T, S)

    def _masked_softmax(self, attention_scores, attention_mask=None):
        """Keras' hook: softmax over keys of `(B, H, T, S)` scores under a boolean mask.

        `attention_mask` `(B, T, S)` (or `(T, S)`) is broadcast over heads, as Keras does.
        A row whose keys are all masked gets zero probabilities (Keras: uniform ones).
        """
        if attention_mask is not None:
            while len(attention_mask.shape) < len(attention_scores.shape):
                attention_mask = ops.expand_dims(attention_mask, -3)  # (B, 1, T, S)
        return masked_softmax(attention_scores, attention_mask)
