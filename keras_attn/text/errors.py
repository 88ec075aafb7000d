"""The error every reader raises for bad input: it names the file and the line."""

from keras_attn.errors import KerasAttnError


class DataError(KerasAttnError, ValueError):
    """Bad input data, located at `path:line`.

    The message reads `"<path>:<line>: <what is wrong>. <how to fix it>"`, the format compilers
    use, so editors and terminals link it to the offending line. `line` is 1-based.

    Args:
        path: str. The file the bad data came from.
        line: int. 1-based line number.
        message: str. What is wrong and how to fix it.

    Example:
    >>> error = DataError("train.tsv", 12, "unknown label 'maybe'")
    >>> str(error)
    "train.tsv:12: unknown label 'maybe'"
    >>> (error.path, error.line)
    ('train.tsv', 12)
    """

    def __init__(self, path, line, message):
        self.path = str(path)
        self.line = int(line)
        self.message = message
        super().__init__(f"{self.path}:{self.line}: {message}")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.message))
