"""Logit processors (temperature, top-k, top-p) and the inverse-CDF sampling draw."""

import math

from keras import ops

from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int


def scale_by_temperature(logits, temperature):
    """Divides logits by a temperature: `softmax(z / T)`; `T < 1` sharpens, `T > 1`
    flattens the distribution.

    Args:
        logits: `(..., V)` float tensor.
        temperature: float > 0.

    Returns:
        `(..., V)` float tensor `logits / temperature`.

    Example:
    >>> z = keras.ops.array([[0.0, 1.0, 2.0]])
    >>> np.round(keras.ops.convert_to_numpy(scale_by_temperature(z, 0.5)), 3).tolist()
    [[0.0, 2.0, 4.0]]
    """
    _check_temperature(temperature)
    return ops.divide(logits, ops.cast(temperature, logits.dtype))


def top_k_filter(logits, k):
    """Keeps the `k` largest logits of each row and sets the others to `-inf`.

    Args:
        logits: `(B, V)` float tensor.
        k: int > 0; `k >= V` keeps everything.

    Returns:
        `(B, V)` tensor; sampling from its softmax draws only among the top `k` tokens
        with probabilities renormalized over them. Logits equal to the k-th largest are
        kept.

    Example:
    >>> z = keras.ops.array([[1.0, 3.0, 2.0, 0.0]])
    >>> keras.ops.convert_to_numpy(top_k_filter(z, 2)).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    check_positive_int("top_k", k)
    k = min(k, logits.shape[-1]) if logits.shape[-1] is not None else k
    kth_largest = ops.top_k(logits, k, sorted=True)[0][..., -1:]  # (B, 1)
    return ops.where(logits < kth_largest, _neg_inf(logits.dtype), logits)


def top_p_filter(logits, p):
    """Nucleus filter: keeps the smallest set of most likely tokens whose probability
    mass reaches `p`, sets the others to `-inf`.

    Sorted by decreasing probability, token `j` is kept when the mass of the tokens
    before it is `< p` (so the most likely token is always kept).

    Args:
        logits: `(B, V)` float tensor.
        p: float in (0, 1]; `1.0` keeps everything.

    Returns:
        `(B, V)` tensor, the filtered logits.

    Example:
    >>> z = keras.ops.log(keras.ops.array([[0.1, 0.5, 0.15, 0.25]]))
    >>> kept = keras.ops.isfinite(top_p_filter(z, 0.7))
    >>> keras.ops.convert_to_numpy(kept).tolist()
    [[False, True, False, True]]
    """
    _check_top_p(p)
    descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)  # (B, V)
    probs = ops.softmax(descending, axis=-1)  # (B, V)
    mass_before = ops.cumsum(probs, axis=-1) - probs  # (B, V)
    num_kept = ops.sum(ops.cast(mass_before < p, "int32"), axis=-1, keepdims=True)  # (B, 1)
    num_kept = ops.maximum(num_kept, 1)
    threshold = ops.take_along_axis(descending, num_kept - 1, axis=-1)  # (B, 1)
    return ops.where(logits < threshold, _neg_inf(logits.dtype), logits)


def process_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Temperature, then top-k, then top-p (the order of HF `generate`), in float32.

    Args:
        logits: `(B, V)` float tensor.
        temperature: float > 0. Defaults to `1.0` (unchanged).
        top_k: optional int > 0.
        top_p: optional float in (0, 1].

    Returns:
        `(B, V)` float32 logits whose softmax is the sampling distribution.

    Example:
    >>> z = keras.ops.array([[1.0, 3.0, 2.0, 0.0]])
    >>> keras.ops.convert_to_numpy(process_logits(z, 2.0, top_k=3)).tolist()
    [[0.5, 1.5, 1.0, -inf]]
    """
    logits = ops.cast(logits, "float32")
    if temperature != 1.0:
        logits = scale_by_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_from_logits(logits, uniform):
    """Draws one token per row from `softmax(logits)` by inverting its CDF at `uniform`.

    Token `j` is drawn when `cdf[j-1] <= u * cdf[V-1] < cdf[j]`, so tokens of probability
    0 (logit `-inf`) are never drawn. With `u` uniform on [0, 1) this is exact categorical
    sampling; drawing `u` up front lets the decode loop stay free of random state.

    Args:
        logits: `(B, V)` float tensor (already processed).
        uniform: `(B,)` float tensor of draws in [0, 1).

    Returns:
        `(B,)` int32 token ids.

    Example:
    >>> z = keras.ops.log(keras.ops.array([[0.5, 0.0, 0.5], [0.2, 0.8, 0.0]]))
    >>> ids = sample_from_logits(z, keras.ops.array([0.6, 0.1]))
    >>> keras.ops.convert_to_numpy(ids).tolist()
    [2, 0]
    """
    probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)  # (B, V)
    cdf = ops.cumsum(probs, axis=-1)  # (B, V)
    target = ops.cast(uniform, "float32")[:, None] * cdf[:, -1:]  # (B, 1)
    index = ops.sum(ops.cast(cdf <= target, "int32"), axis=-1)  # (B,)
    # Rounding can put `target` at the very top of the CDF; never step past the last
    # token that has any probability.
    vocab = ops.shape(probs)[-1]
    last_possible = vocab - 1 - ops.argmax(ops.flip(ops.cast(probs > 0, "int32"), axis=-1), axis=-1)
    return ops.cast(ops.minimum(index, ops.cast(last_possible, "int32")), "int32")


def _check_temperature(temperature):
    check_number_above("temperature", temperature, 0, "logits are divided by it")


def _check_top_p(p):
    check_number("top_p", p, 0, 1, include_low=False, meaning="a probability mass")


def _neg_inf(dtype):
    return ops.cast(-math.inf, dtype)
