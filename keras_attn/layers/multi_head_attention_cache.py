"""`MultiHeadAttention`'s key/value cache: a decoding step's writes, the cross-attention cache."""

from keras import ops


class KeyValueCacheMixin:
    """`MultiHeadAttention`'s key/value cache (a mixin of the layer): one `(B, 2, S_max, H,
    d_k)` tensor, `[:, 0]` keys and `[:, 1]` values, in and out of `call`.
    """

    def _attend_cache(self, q, k, v, cache, cache_update_index, key_padding):
        """Keys and values to attend over with a cache: `(k, v, cache, key_padding)`.

        A cross-attention cache (`cache_update_index=None`) holds the encoder's keys and
        values; a self-attention cache gets this step's `k`, `v` written at
        `cache_update_index`, and `key_padding` masks its slots not written yet.
        """
        if cache_update_index is None:
            k, v = cache[:, 0], cache[:, 1]  # (B, S_enc, H, dk)
        else:
            kv = ops.stack([k, v], axis=1)  # (B, 2, T, H, dk)
            cache = ops.slice_update(cache, (0, 0, cache_update_index, 0, 0), kv)
            k, v = cache[:, 0], cache[:, 1]  # (B, S_max, H, dk)
            # Slots after the ones written so far hold nothing yet.
            written = ops.cast(cache_update_index, "int32") + ops.shape(q)[1]
            filled_mask = ops.arange(ops.shape(k)[1], dtype="int32")[None, :] < written
            key_padding = key_padding + [
                ops.broadcast_to(filled_mask, (ops.shape(k)[0], ops.shape(k)[1]))
            ]  # (B, S_max)
        return k, v, cache, key_padding

    def compute_cross_attention_cache(self, value, key=None):
        """Projects encoder outputs once into a `(B, 2, S, H, d_k)` cross-attention cache."""
        key = value if key is None else key
        if self.fused_qkv:
            _, k, v = self._project(value, key, value, self_attention=False)
        else:
            k, v = self.key_dense(key), self.value_dense(value)
        if self.rotary_embedding is not None:
            k = self.rotary_embedding(k, start_index=0)
        return ops.stack([k, v], axis=1)

    def _check_cache(self, cache):
        shape = tuple(cache.shape)
        expected = (2, None, self.num_heads, self.key_dim)
        if self.value_dim != self.key_dim:
            raise ValueError(
                "A key/value cache stores keys and values in one tensor, so it needs "
                f"`value_dim == key_dim`. Received: key_dim={self.key_dim}, "
                f"value_dim={self.value_dim}"
            )
        if len(shape) != 5 or shape[1] != 2 or shape[3:] != expected[2:]:
            raise ValueError(
                "`cache` must have shape (batch, 2, max_length, num_heads, key_dim) = "
                f"(batch, 2, max_length, {self.num_heads}, {self.key_dim}): a key_dim or "
                f"num_heads mismatch with the layer. Received: cache.shape={shape}"
            )
