"""`KerasAttnError`: the base of every error keras-attn raises for a user to act on (bad
configuration, data, run or export directory, artifact). Its message says what is wrong,
where (file:line or argument) and how to fix it; `keras-attn` prints it and exits with
status 2, without a traceback.

Each subclass also derives from the built-in exception that matches it (`ValueError` for bad
input, `RuntimeError` for a failed conversion or distributed setup), so code catching those
keeps working.

Example:
>>> from keras_attn.training.config import ConfigError
>>> issubclass(ConfigError, KerasAttnError) and issubclass(ConfigError, ValueError)
True
"""


class KerasAttnError(Exception):
    """An error a user can act on; see the module docstring."""
