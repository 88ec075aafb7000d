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


def check_int(name, value, low=None, high=None, meaning=None, optional=False,
              high_name=None):
    """Raises unless `value` is an integer in `[low, high)` (`True`/`False` are rejected;
    NumPy integers are accepted).

    Args:
        name: str, the argument name used in the message.
        value: the argument.
        low: optional int, the smallest allowed value.
        high: optional int, the exclusive upper bound.
        meaning: optional str, what the number is, added to the message in parentheses.
        optional: bool, `None` is allowed too.
        high_name: optional str, the argument `high` comes from (`"vocabulary_size"`),
            named in the range and received with its value.

    Example:
    >>> check_int("max_new_tokens", -1, low=0)
    Traceback (most recent call last):
    ...
    ValueError: `max_new_tokens` must be an integer >= 0. Received: max_new_tokens=-1
    >>> check_int("pad_token_id", 7, 0, 5, "a token id")
    Traceback (most recent call last):
    ...
    ValueError: `pad_token_id` must be an integer in [0, 5) (a token id). Received: pad_token_id=7
    >>> check_int("eos_token_id", 5, 0, 5, high_name="vocabulary_size")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ... in [0, vocabulary_size). Received: eos_token_id=5, vocabulary_size=5
    """
    if optional and value is None:
        return
    if not _is_int(value) or not _in_range(value, low, high, True, False):
        raise ValueError(
            f"`{name}` must be an integer{_range_text(low, high_name or high, True, False)}"
            f"{_parenthesized(meaning)}{' or None' if optional else ''}. "
            f"Received: {name}={value!r}{_also_received(high_name, high)}"
        )


def check_int_sequence(name, values, low=None, high=None, meaning=None, high_name=None):
    """Raises unless `values` is a list or tuple of integers, each in `[low, high)`
    (arguments as in `check_int`).

    Example:
    >>> check_int_sequence("stop_ids", (2, -1), low=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `stop_ids` must be a list or tuple of integers >= 0. Received: stop_ids=(2, -1)
    """
    if not isinstance(values, (list, tuple)) or not all(
            _is_int(v) and _in_range(v, low, high, True, False) for v in values):
        raise ValueError(
            f"`{name}` must be a list or tuple of integers"
            f"{_range_text(low, high_name or high, True, False)}{_parenthesized(meaning)}. "
            f"Received: {name}={values!r}{_also_received(high_name, high)}"
        )


def check_number(name, value, low=None, high=None, include_low=True, include_high=True,
                 meaning=None):
    """Raises unless `value` is a real number (not a bool) between `low` and `high`.

    Args:
        name: str, the argument name used in the message.
        value: the argument.
        low, high: optional bounds. include_low, include_high: bool, whether each bound
            is allowed. Both default to `True`.
        meaning: optional str, what the number is, added to the message in parentheses.

    Example:
    >>> check_number("top_p", 0.0, 0, 1, include_low=False)
    Traceback (most recent call last):
    ...
    ValueError: `top_p` must be a number in (0, 1]. Received: top_p=0.0
    """
    if not _is_number(value) or not _in_range(value, low, high, include_low, include_high):
        raise ValueError(
            f"`{name}` must be a number{_range_text(low, high, include_low, include_high)}"
            f"{_parenthesized(meaning)}. Received: {name}={value!r}"
        )


def check_bool(name, value, optional=False):
    """Raises unless `value` is `True` or `False` (not 0/1), or `None` when `optional`.

    Example:
    >>> check_bool("quantize", 1)
    Traceback (most recent call last):
    ...
    ValueError: `quantize` must be a bool. Received: quantize=1
    """
    if not isinstance(value, bool) and not (optional and value is None):
        raise ValueError(
            f"`{name}` must be a bool{' or None' if optional else ''}. "
            f"Received: {name}={value!r}"
        )


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


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _in_range(value, low, high, include_low, include_high):
    above = low is None or (value >= low if include_low else value > low)
    below = high is None or (value <= high if include_high else value < high)
    return above and below


def _range_text(low, high, include_low, include_high):
    """" in [0, 1)", " >= 2", " < 5" or "" for the messages."""
    if low is not None and high is not None:
        return f" in {'[' if include_low else '('}{low}, {high}{']' if include_high else ')'}"
    if low is not None:
        return f" {'>=' if include_low else '>'} {low}"
    if high is not None:
        return f" {'<=' if include_high else '<'} {high}"
    return ""


def _also_received(name, value):
    return "" if name is None else f", {name}={value!r}"


def _parenthesized(meaning):
    return "" if meaning is None else f" ({meaning})"
