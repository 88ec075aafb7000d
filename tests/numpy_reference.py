"""Numpy references of the Transformer formulas, written from a layer's weights alone.

Shared by the block tests; independent of the layer code except for reading weights.
"""

import math

import numpy as np
from keras import ops


def mha_weights(mha):
    """Per-head numpy weights of a keras-attn MultiHeadAttention, fused or not."""
    if mha.fused_qkv:
        kernel = ops.convert_to_numpy(mha.qkv_kernel)  # (d, 3, H, dk)
        bias = ops.convert_to_numpy(mha.qkv_bias)  # (3, H, dk)
        w = {n: (kernel[:, i], bias[i]) for i, n in enumerate("qkv")}
    else:
        w = {
            n: tuple(ops.convert_to_numpy(v) for v in (dense.kernel, dense.bias))
            for n, dense in zip("qkv", (mha.query_dense, mha.key_dense, mha.value_dense))
        }
    w["o"] = tuple(ops.convert_to_numpy(v) for v in (mha.output_dense.kernel,
                                                      mha.output_dense.bias))
    return w


def np_mha(xq, xkv, w, mask):
    """Multi-head attention for one example: xq (T, d), xkv (S, d), mask (T, S) bool."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = w["q"], w["k"], w["v"], w["o"]
    out = np.zeros((xq.shape[0], wo.shape[-1]))
    for h in range(wq.shape[1]):
        q = xq @ wq[:, h] + bq[h]  # (T, dk)
        k = xkv @ wk[:, h] + bk[h]  # (S, dk)
        v = xkv @ wv[:, h] + bv[h]  # (S, dv)
        z = np.zeros((xq.shape[0], v.shape[1]))
        for i in range(xq.shape[0]):
            if not mask[i].any():
                continue
            s = np.array([q[i] @ k[j] / math.sqrt(q.shape[1]) for j in range(len(k))])
            e = np.where(mask[i], np.exp(s - s[mask[i]].max()), 0.0)
            z[i] = (e / e.sum()) @ v
        out += z @ wo[h]  # concat(heads) W^O, one head's rows at a time
    return out + bo


def np_layer_norm(x, ln):
    gamma, beta = (ops.convert_to_numpy(v) for v in (ln.gamma, ln.beta))
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.epsilon) * gamma + beta


def np_ffn(x, block, activation):
    w1, b1 = (ops.convert_to_numpy(v) for v in block.feedforward_intermediate_dense.weights)
    w2, b2 = (ops.convert_to_numpy(v) for v in block.feedforward_output_dense.weights)
    return activation(x @ w1 + b1) @ w2 + b2


def np_relu(x):
    return np.maximum(x, 0.0)


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def randomize(layer, seed=0):
    """Non-trivial biases and LayerNorm gains, so the test sees every weight."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(scale=0.4, size=w.shape) for w in layer.get_weights()])


def fake_quant_reference(x, low, high, num_bits=8):
    """TF's FakeQuantWithMinMaxVars: nudge the range so 0 is a code, clamp, round."""
    quant_min, quant_max = 0.0, 2.0 ** num_bits - 1
    scale = (high - low) / (quant_max - quant_min)
    zero_point = np.clip(quant_min - low / scale, quant_min, quant_max)
    zero_point = np.floor(zero_point + 0.5)
    nudged_min = (quant_min - zero_point) * scale
    nudged_max = (quant_max - zero_point) * scale
    clamped = np.clip(x, nudged_min, nudged_max)
    return np.floor((clamped - nudged_min) / scale + 0.5) * scale + nudged_min


def numpy_rows(table, ids):
    """Symmetric per-tensor int8 (255 levels, zero point 0): s = max|E| / 127."""
    step = np.abs(table).max() / 127
    return np.clip(np.round(table / step), -127, 127)[ids] * step
