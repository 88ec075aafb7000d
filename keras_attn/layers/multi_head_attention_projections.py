"""`MultiHeadAttention`'s projections: per-head or fused Q/K/V, gate and output kernels."""

import keras
from keras import ops

from keras_attn.layers.validation import clone_initializer


class ProjectionsMixin:
    """`MultiHeadAttention`'s projection building and projecting (a mixin of the layer).

    `build` makes the query, key, value and gate `EinsumDense`s with `_projection` (or one
    `(d, 3, H, d_k)` Q/K/V kernel with `_build_fused`) and the output one with the same
    `_dense_kwargs`; `_project` applies the Q/K/V projections.
    """

    def _build_fused(self, query_shape, value_shape, key_shape):
        query_dim = query_shape[-1]
        if not query_dim == key_shape[-1] == value_shape[-1]:
            raise ValueError(
                "`fused_qkv=True` needs query, key and value inputs of the same feature "
                f"size. Received: query_shape={query_shape}, key_shape={key_shape}, "
                f"value_shape={value_shape}"
            )
        H, dk = self.num_heads, self.key_dim
        self.qkv_kernel = self.add_weight(
            name="qkv_kernel", shape=(query_dim, 3, H, dk),
            initializer=self._fused_initializer(query_dim),
            regularizer=self.kernel_regularizer, constraint=self.kernel_constraint,
        )
        self.qkv_bias = (
            self.add_weight(name="qkv_bias", shape=(3, H, dk),
                            initializer=self.bias_initializer,
                            regularizer=self.bias_regularizer, constraint=self.bias_constraint)
            if self.use_bias else None
        )

    def _projection(self, name, heads_shape, input_dim, activation=None):
        layer = keras.layers.EinsumDense(
            "abc,cde->abde", output_shape=(None, *heads_shape), activation=activation,
            bias_axes="de" if self.use_bias else None, name=name, **self._dense_kwargs(),
        )
        layer.build((None, None, input_dim))
        return layer

    def _dense_kwargs(self):
        return dict(
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            activity_regularizer=self._activity_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
        )

    def _fused_initializer(self, query_dim):
        # Each of the three slices must be initialised like an unfused (d, H*dk) kernel,
        # not like one (d, 3*H*dk) matrix, so fused and unfused models train alike.
        base = clone_initializer(self.kernel_initializer)
        fan_out = self.num_heads * self.key_dim

        def init(shape, dtype=None):
            parts = [
                ops.reshape(base((query_dim, fan_out), dtype=dtype), (query_dim, 1) + shape[2:])
                for _ in range(3)
            ]
            return ops.concatenate(parts, axis=1)

        return init

    def _project(self, query, key, value, self_attention, skip_kv=False):
        """Per-head projections; `skip_kv` when keys/values come from a cross cache."""
        if not self.fused_qkv:
            q = self.query_dense(query)
            if skip_kv:
                return q, None, None
            return q, self.key_dense(key), self.value_dense(value)
        kernel = ops.cast(self.qkv_kernel, self.compute_dtype)  # (d, 3, H, dk)
        bias = None if self.qkv_bias is None else ops.cast(self.qkv_bias, self.compute_dtype)
        # Splits by unstack, never by `x[:, :, i]` or `kernel[:, 0:3]`: the gradient of each
        # strided slice writes a zero tensor the size of the whole fused tensor (measured:
        # the projection's forward + backward 87 -> 28 ms, a training step +11 %).
        if self_attention:
            qkv = _matmul_heads(query, kernel)  # (B, T, 3, H, dk)
            if bias is not None:
                qkv = qkv + bias
            q, k, v = ops.unstack(qkv, 3, axis=2)  # 3 x (B, T, H, dk)
            return self._regularize_activity(q, k, v)
        kernels = ops.unstack(kernel, 3, axis=1)  # 3 x (d, H, dk)
        biases = (None,) * 3 if bias is None else ops.unstack(bias, 3, axis=0)

        def project(x, index):
            y = _matmul_heads(x, kernels[index])  # (B, T, H, dk)
            y = y if biases[index] is None else y + biases[index]
            return self._regularize_activity(y)[0]

        q = project(query, 0)
        if skip_kv:
            return q, None, None
        return q, project(key, 1), project(value, 2)

    def _regularize_activity(self, *projections):
        """The fused kernel's share of `activity_regularizer`, as `EinsumDense` adds it."""
        if self._activity_regularizer is not None:
            for x in projections:
                loss = self._activity_regularizer(x)
                self.add_loss(ops.divide_no_nan(loss, ops.cast(ops.shape(x)[0], loss.dtype)))
        return projections


def _matmul_heads(x, kernel):
    """`x (..., d) @ kernel (d, *heads) -> (..., *heads)` as one 2-D matmul.

    Not `ops.einsum`: TensorFlow's CPU Einsum kernel has no fast bfloat16 path. For the
    fused projection at B=32, T=128, d=256 (forward + backward) it took 864 ms in bfloat16
    against 57 ms for this reshape-matmul-reshape (35 vs 33 ms in float32), which made
    `mixed_bfloat16` training 3x slower than float32.
    """
    leading = ops.shape(x)[:-1]
    heads = tuple(kernel.shape[1:])
    y = ops.matmul(ops.reshape(x, (-1, kernel.shape[0])),
                   ops.reshape(kernel, (kernel.shape[0], -1)))
    return ops.reshape(y, (*leading, *heads))
