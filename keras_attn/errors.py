"""`KerasAttnError`: the base of every error keras-attn raises for a user to act on (bad
configuration, data, run or export directory, artifact). Its message says what is wrong,
where (file:line or argument) and how to fix it; `keras-attn` prints it and exits with
status 2, without a traceback.

Each subclass also derives from the built-in exception that matches it (`ValueError` for bad
input, `RuntimeError` for a failed conversion or distributed setup), so code catching those
keeps working.

Example:
>>> from keras_attn.runs.config_schema import ConfigError
>>> issubclass(ConfigError, KerasAttnError) and issubclass(ConfigError, ValueError)
True
"""


class KerasAttnError(Exception):
    """An error a user can act on; see the module docstring."""


def first_line(error):
    """`"ErrorType: first line of its message"` (at most 300 characters), for wrapping a
    runtime's long error (LiteRT, onnxruntime, TensorFlow) into a one-line user error.

    Example:
    >>> first_line(ValueError("\\n  bad file\\n  (details)"))
    'ValueError: bad file'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"
