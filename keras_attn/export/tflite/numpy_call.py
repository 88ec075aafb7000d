"""`numpy_call`: a NumPy function (a LiteRT or onnxruntime call) as a step of a decoding loop
that runs eagerly or as a `tf.function`."""

import numpy as np
import tensorflow as tf


def numpy_call(function, inputs, dtypes):
    """`function` of the NumPy values of `inputs`: called at once when eager (its errors
    raised as they are), through `tf.numpy_function` inside a `tf.function` (the search's
    loop then runs as a graph, with the runtime called at each step).

    Args:
        function: callable taking NumPy arrays, returning a list of arrays.
        inputs: list of tensors.
        dtypes: the `tf.DType` of each returned array (graph mode).

    Returns:
        A list of tensors.

    Example:
    >>> [total] = numpy_call(lambda a, b: [a + b], [tf.constant([1]), tf.constant([2])],
    ...                      [tf.int32])
    >>> total.numpy().tolist()
    [3]
    """
    if tf.executing_eagerly():
        return [tf.convert_to_tensor(value) for value in function(
            *[np.asarray(value) for value in inputs])]
    return tf.numpy_function(function, inputs, dtypes, stateful=False)
