"""How far two float32 computations of one function may differ when they take other paths.

Eager Keras and a traced graph or SavedModel, LiteRT or ONNX Runtime and Keras, TensorFlow and
JAX: each path may run other kernels. oneDNN picks its kernels by CPU (AVX2, AVX-512, AMX) and
by shape, and a graph may fuse ops that eager code runs one by one; either way the same
products are summed in another order. Measured: the raw-text SavedModel of a 1-layer classifier
and its eager Keras model agree to 1.2e-7 with `TF_ENABLE_ONEDNN_OPTS=0` and differ by 2.6e-5
with oneDNN on, on an AVX2 and on an AVX-512 CPU alike. A tolerance that one CPU happens to
meet is therefore no tolerance: it must follow from float32 arithmetic and the values' size.

The bound used here (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002,
§3.1 and §3.5): a K-term dot product computed in two summation orders differs by at most
`gamma_K * sum|a_i b_i|` with `gamma_K ~ K u`, and, with rounding errors modelled as
independent, typically by `sqrt(K) u sum|a_i b_i|`; `u = 2**-24` is float32's unit roundoff.
A value that passes through `depth` such reductions (matmuls, softmax sums, layer-norm means)
collects one such error per reduction, and any later linear map multiplies it by its `gain`
(the largest absolute column sum of its kernel). `float32_path_atol` returns that typical
bound with a safety factor; tests that compare one path with itself keep tight tolerances.
"""

import math

import numpy as np

FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24  # float32's machine epsilon / 2
SAFETY = 8.0


def float32_path_atol(values, reduction, depth, gain=1.0):
    """Absolute tolerance between two float32 paths computing `values`.

    Args:
        values: array-like, the reference values (their largest magnitude, at least 1
            since hidden states are layer-normalized to order 1, sets the scale).
        reduction: int, the longest sum a value is built from (`K`: hidden or
            intermediate size, or the key length of attention).
        depth: int, how many reductions a value passes through one after another.
        gain: float, the largest absolute column sum of a linear map applied after the
            last value of order 1 (1.0 when there is none).

    Returns:
        float: `SAFETY * depth * sqrt(reduction) * u * scale * gain`.

    Example:
    >>> round(float32_path_atol([0.5, -2.0], reduction=64, depth=4), 9)
    3.0518e-05
    """
    scale = max(1.0, float(np.max(np.abs(np.asarray(values, dtype="float64")))))
    return SAFETY * depth * math.sqrt(reduction) * FLOAT32_UNIT_ROUNDOFF * scale * gain


def kernel_gain(kernel):
    """The largest absolute column sum of a `(in, out)` kernel: how much an error of size
    `e` in every input can grow in one output."""
    return float(np.max(np.abs(np.asarray(kernel, dtype="float64")).sum(axis=0)))
