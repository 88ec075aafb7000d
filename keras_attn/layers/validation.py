"""Argument checks shared by the layers, so every layer words its errors the same way.

Each check raises a `ValueError` that names the argument, says what it must be and ends
in "Received: name=value", and returns nothing. Layers call them at the top of
`__init__`, before `super().__init__`, so a bad argument fails at construction rather
than at the first call. Checks that only one layer needs (a relation between two
arguments, a choice among strings) stay in that layer.
"""

import numbers


def check_positive_int(name, value, meaning=None):
    """Raises unless `value` is an `int` > 0 (`True`/`False` are rejected).

    Args:
        name: str, the argument name used in the message.
        value: the argument.
        meaning: optional str, what the number counts, added to the message in
            parentheses.

    Example:
    >>> check_positive_int("num_heads", 0)
    Traceback (most recent call last):
    ...
    ValueError: `num_heads` must be a positive integer. Received: num_heads=0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer{_parenthesized(meaning)}. "
            f"Received: {name}={value}"
        )


def check_bool(name, value):
    """Raises unless `value` is `True` or `False` (not 0/1, not None).

    Example:
    >>> check_bool("quantize", 1)
    Traceback (most recent call last):
    ...
    ValueError: `quantize` must be a bool. Received: quantize=1
    """
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")


def check_rate(name, value):
    """Raises unless `value` is a number in `[0, 1)`, as dropout rates must be.

    Example:
    >>> check_rate("dropout", 1.0)
    Traceback (most recent call last):
    ...
    ValueError: `dropout` must be a float in [0, 1). Received: dropout=1.0
    """
    if not _is_number(value) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a float in [0, 1). Received: {name}={value}")


def check_number_above(name, value, bound, meaning=None):
    """Raises unless `value` is a number strictly greater than `bound`.

    Args:
        name: str, the argument name used in the message.
        value: the argument.
        bound: the exclusive lower bound (`0` for an epsilon, `1` for a wavelength base).
        meaning: optional str, what the number is, added to the message in parentheses.

    Example:
    >>> check_number_above("layer_norm_epsilon", 0.0, 0)
    Traceback (most recent call last):
    ...
    ValueError: `layer_norm_epsilon` must be a number > 0. Received: layer_norm_epsilon=0.0
    """
    if not _is_number(value) or not value > bound:
        raise ValueError(
            f"`{name}` must be a number > {bound}{_parenthesized(meaning)}. "
            f"Received: {name}={value}"
        )


def check_rank(name, shape, ranks, layout):
    """Raises unless a tensor of `shape` has one of the `ranks`.

    Args:
        name: str, the argument name used in the message.
        shape: the tensor's shape (a tuple; `None` for unknown sizes).
        ranks: tuple of accepted ranks.
        layout: str, the expected layout, e.g. `"(batch, query_length, key_length)"`.

    Example:
    >>> check_rank("mask", (2, 5), (3, 4), "(B, T, S)")
    Traceback (most recent call last):
    ...
    ValueError: `mask` must have rank 3 or 4, laid out as (B, T, S). Received: mask.shape=(2, 5)
    """
    if len(shape) not in ranks:
        raise ValueError(
            f"`{name}` must have rank {' or '.join(map(str, ranks))}, laid out as {layout}. "
            f"Received: {name}.shape={tuple(shape)}"
        )


def check_same_sizes(name, shape, other_name, other_shape, axes, meaning):
    """Raises unless two shapes have equal sizes on `axes` (an unknown size matches any).

    Args:
        name, other_name: str, the argument names used in the message.
        shape, other_shape: the two shapes (tuples; `None` for unknown sizes).
        axes: iterable of axis indices compared in both shapes.
        meaning: str, why they must agree, added to the message.

    Example:
    >>> try:
    ...     check_same_sizes("k", (4,), "v", (5,), [0], "pairs")
    ... except ValueError as error:
    ...     print(error)
    `k` and `v` must have the same sizes on axes [0] (pairs). Received: k.shape=(4,), v.shape=(5,)
    """
    for axis in axes:
        size, other = shape[axis], other_shape[axis]
        if size is not None and other is not None and size != other:
            raise ValueError(
                f"`{name}` and `{other_name}` must have the same sizes on axes "
                f"{list(axes)} ({meaning}). Received: {name}.shape={tuple(shape)}, "
                f"{other_name}.shape={tuple(other_shape)}"
            )


def clone_initializer(initializer):
    """A fresh copy of a Keras initializer, to give to one weight or sublayer."""
    # Keras 3 initializers fix their random seed when they are constructed (drawing one
    # when none is given), so one instance used for several weights fills them all with
    # the same values. A copy rebuilt from the config draws its own seed; an explicit
    # integer seed is copied too, which keeps seeded models reproducible.
    return initializer.__class__.from_config(initializer.get_config())


def _is_number(value):
    # numbers.Real admits numpy scalars; bool is an int subclass but never a size or rate.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _parenthesized(meaning):
    return "" if meaning is None else f" ({meaning})"
