"""The argument checks of `keras_attn.layers.validation`: what passes, and the exact
messages of what does not."""

import numpy as np
import pytest

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_int_sequence
from keras_attn.layers.validation import check_number


@pytest.mark.parametrize("value, low, high", [
    (0, 0, None), (4, None, 5), (-100, None, None), (np.int64(3), 0, 4), (2, 2, 3),
])
def test_check_int_accepts(value, low, high):
    check_int("n", value, low, high)


@pytest.mark.parametrize("value, low, high, message", [
    (True, None, None, "`n` must be an integer. Received: n=True"),
    (1.0, 0, None, "`n` must be an integer >= 0. Received: n=1.0"),
    (5, None, 5, "`n` must be an integer < 5. Received: n=5"),
    (-1, 0, 5, r"`n` must be an integer in \[0, 5\). Received: n=-1"),
    ("3", 0, 5, r"`n` must be an integer in \[0, 5\). Received: n='3'"),
])
def test_check_int_messages(value, low, high, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_int("n", value, low, high)


def test_check_int_optional_and_meaning():
    check_int("tag_column", None, optional=True)
    with pytest.raises(ValueError, match=r"^`n` must be an integer >= 3 \(room\) or None\. "
                                         r"Received: n=2$"):
        check_int("n", 2, low=3, meaning="room", optional=True)
    with pytest.raises(ValueError, match="Received: n=None"):
        check_int("n", None)


def test_check_int_sequence():
    check_int_sequence("ids", [0, 4], 0, 5)
    check_int_sequence("ids", (), low=0)
    for bad in ([0, 5], [0, True], 3, "01"):
        with pytest.raises(ValueError, match=r"^`ids` must be a list or tuple of integers in "
                                             r"\[0, 5\)\. Received: ids="):
            check_int_sequence("ids", bad, 0, 5)


@pytest.mark.parametrize("value, low, high, include_low, include_high", [
    (0.5, 0, 1, False, False), (1, 0, 1, False, True), (0, 0, 1, True, False),
    (-1e9, None, None, True, True), (np.float32(0.25), 0, None, True, True),
])
def test_check_number_accepts(value, low, high, include_low, include_high):
    check_number("x", value, low, high, include_low, include_high)


@pytest.mark.parametrize("value, low, high, include_low, include_high, message", [
    (0, 0, 1, False, True, r"`x` must be a number in \(0, 1\]\. Received: x=0"),
    (1.0, 0, 1, False, False, r"`x` must be a number in \(0, 1\)\. Received: x=1.0"),
    (-0.1, 0, None, True, True, r"`x` must be a number >= 0\. Received: x=-0.1"),
    (0, 0, None, False, True, r"`x` must be a number > 0\. Received: x=0"),
    (2, None, 1, True, False, r"`x` must be a number < 1\. Received: x=2"),
    (False, None, None, True, True, r"`x` must be a number\. Received: x=False"),
    ("1", None, None, True, True, r"`x` must be a number\. Received: x='1'"),
])
def test_check_number_messages(value, low, high, include_low, include_high, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_number("x", value, low, high, include_low, include_high)


def test_check_bool_optional():
    check_bool("strip_accents", None, optional=True)
    with pytest.raises(ValueError, match=r"^`strip_accents` must be a bool or None\. "
                                         r"Received: strip_accents=0$"):
        check_bool("strip_accents", 0, optional=True)
    with pytest.raises(ValueError, match=r"^`flag` must be a bool\. Received: flag=None$"):
        check_bool("flag", None)
