"""Attention over several axes of an N-D input (`MultiHeadAttention(attention_axes=...)`).

`keras.layers.MultiHeadAttention` attends over any set of axes `A` of an input
`(B, d_1, ..., d_n, features)`: the other axes act as batch axes and a query position is
a tuple of indices over `A`. keras-attn's attention core works on one sequence axis, so
the inputs are *folded*, the other axes moved into the batch and the axes of `A` (in the
order given) flattened row-major into one sequence axis:

    (B, d_1, ..., d_n, F) -> (B * prod(d_i, i not in A), prod(d_i, i in A), F)

and the outputs unfolded back. The projections act on each position alone, so folding
before them gives Keras' numbers and keeps Keras' kernel shapes. The attention scores
come back in Keras' layout `(B, <other axes>, H, <query axes of A>, <key axes of A>)`.
"""

import math

import numpy as np
from keras import ops

from keras_attn.layers.validation import check_rank


def normalize_attention_axes(attention_axes, rank):
    """The attention axes of a rank-`rank` input as non-negative ints.

    `None` means every axis but the batch (0) and features (-1) ones, as in Keras.
    Negative axes count from the end of the input, as in Keras.

    Example:
    >>> normalize_attention_axes(None, 4), normalize_attention_axes((-2,), 4)
    ((1, 2), (2,))
    """
    if attention_axes is None:
        return tuple(range(1, rank - 1))
    axes = tuple(axis % rank if -rank <= axis < rank else axis for axis in attention_axes)
    if any(not 0 < axis < rank - 1 for axis in axes) or len(set(axes)) != len(axes):
        raise ValueError(
            "`attention_axes` must be distinct axes of the inputs other than the batch "
            f"(0) and feature (-1) axes, i.e. in [1, {rank - 2}] for inputs of rank {rank}. "
            f"Received: attention_axes={attention_axes}"
        )
    return axes


class AxesFolding:
    """Folds inputs and masks of one rank to the single-sequence-axis layout and back.

    Args:
        rank: int, rank of the query/key/value inputs (batch and features included).
        attention_axes: tuple of non-negative ints from `normalize_attention_axes`.
    """

    def __init__(self, rank, attention_axes):
        self.axes = tuple(attention_axes)
        self.others = tuple(a for a in range(1, rank - 1) if a not in self.axes)
        self.perm = (0,) + self.others + self.axes  # the non-feature axes, folded order

    def lead_shape(self, x):
        """Run-time sizes of `x`'s non-feature axes in folded order (before flattening)."""
        shape = ops.shape(x)
        return [shape[axis] for axis in self.perm]

    def fold(self, x, feature_axes=1):
        """`(B, *dims, *features)` -> `(B', T, *features)`; `feature_axes=0` for masks."""
        n = len(self.perm)
        x = ops.transpose(x, self.perm + tuple(range(n, n + feature_axes)))
        shape = ops.shape(x)
        length = math.prod(shape[n - len(self.axes):n])
        return ops.reshape(x, (-1, length) + tuple(shape[n:]))

    def unfold(self, y, lead_shape):
        """`(B', T, *features)` -> `(B, *dims, *features)` in the inputs' axis order."""
        n = len(self.perm)
        y = ops.reshape(y, tuple(lead_shape) + tuple(ops.shape(y)[2:]))
        inverse = tuple(int(a) for a in np.argsort(self.perm))
        return ops.transpose(y, inverse + tuple(range(n, len(y.shape))))

    def unfold_scores(self, scores, query_lead, key_lead, num_heads):
        """`(B', H, Tq, Tk)` -> Keras' `(B, <other axes>, H, <query axes>, <key axes>)`."""
        k = len(self.axes)
        others = query_lead[: len(query_lead) - k]
        shape = (*others, num_heads, *query_lead[-k:], *key_lead[-k:])
        return ops.reshape(scores, shape)

    def fold_attention_mask(self, mask, query_lead, key_lead, num_heads):
        """A Keras N-D attention mask -> `(B', Tq, Tk)`, or `(B', H, Tq, Tk)` per head.

        The mask is broadcastable to `(B, <other axes>, <query axes>, <key axes>)`; with
        one more axis, `(B, <other axes>, H, <query axes>, <key axes>)`, it is per head.
        A mask of lower rank gains size-1 axes in front of the attention axes, as Keras
        does.
        """
        k = len(self.axes)
        others = list(query_lead[: len(query_lead) - k])
        full_rank = len(others) + 2 * k
        layout = "(batch, <other axes>, [num_heads,] <query attention axes>, <key attention axes>)"
        check_rank("attention_mask", mask.shape, tuple(range(1, full_rank + 2)), layout)
        mask = ops.cast(mask, "bool")
        per_head = len(mask.shape) == full_rank + 1
        while len(mask.shape) < full_rank:
            mask = ops.expand_dims(mask, -2 * k - 1)
        heads = [num_heads] if per_head else []
        mask = ops.broadcast_to(mask, others + heads + list(query_lead[-k:] + key_lead[-k:]))
        query_length, key_length = math.prod(query_lead[-k:]), math.prod(key_lead[-k:])
        return ops.reshape(mask, [-1] + heads + [query_length, key_length])
